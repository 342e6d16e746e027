""" "Why isn't it running?": the plain-language answer the admin shows for a job.

Read-only: every reason comes from the row and the database's clock (invariant 2), plus
what this process knows of the handlers and queues. The answer lists every reason that
holds, most decisive first, so an operator does not fix one and meet the next.
"""

from __future__ import annotations

from datetime import datetime

from durable_jobs import conf, db, registry, store, workflows
from durable_jobs.console import workers
from durable_jobs.models import Job
from durable_jobs.states import Status
from durable_jobs.waits.explain import explain_hold


def _ago(now: datetime, then: datetime) -> str:
    return _duration((now - then).total_seconds())


def _duration(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _held_reasons(job: Job, now: datetime) -> list[str]:
    """Why a job held by a wait condition has not run yet: the wait feature's own answer."""
    explanation = explain_hold(job, now=now)
    return [] if explanation is None else [explanation.summary]


def explain(job: Job, *, now: datetime | None = None) -> list[str]:
    """Return the reasons ``job`` is not running now, in plain language (empty when it is)."""
    now = now or db.database_now()
    settings = conf.get()
    if job.status == Status.RUNNING.value and job.lease_owner is not None:
        if job.lease_expires_at is not None and job.lease_expires_at < now:
            return [
                (
                    f"Its lease, held by {job.lease_owner}, expired {_ago(now, job.lease_expires_at)} ago: "
                    "the worker stopped or stalled; the reconciler re-drives it after the orphan grace."
                )
            ]
        return []
    if job.status in (Status.COMPLETED.value, Status.CANCELLED.value):
        return [f"It is {job.status}: finished jobs never run again (start a new job instead)."]
    if job.status == Status.FAILED.value:
        if job.parked_at is not None:
            return [
                (
                    f"It is parked ({job.error_code or 'no reason recorded'}) since "
                    f"{job.parked_at:%Y-%m-%d %H:%M:%S %Z}: only an operator's re-drive runs it again."
                )
            ]
        return [
            (
                f"It failed ({job.error_code or job.error_class or 'no code'}): only an operator's re-drive "
                "runs it again."
            )
        ]

    reasons: list[str] = []
    if job.cancel_requested_at is not None:
        who = f" by {job.cancelled_by}" if job.cancelled_by else ""
        reasons.append(
            f"Cancellation was requested{who} {_ago(now, job.cancel_requested_at)} ago: "
            "the reconciler ends it as cancelled instead of running it."
        )
    if job.parked_at is not None:
        reasons.append(f"It is parked ({job.error_code}).")
    if (
        job.lease_owner is not None
        and job.lease_expires_at is not None
        and job.lease_expires_at > now
    ):
        reasons.append(
            f"Its lease is held by {job.lease_owner} until "
            f"{job.lease_expires_at:%H:%M:%S %Z} (in {_duration((job.lease_expires_at - now).total_seconds())})."
        )
    if (
        job.status == Status.PENDING.value
        and job.held_since is not None
        and job.wait_satisfied_at is None
    ):
        reasons.extend(_held_reasons(job, now))
    elif (
        job.flow_wait
        and job.status == Status.PENDING.value
        and job.lease_owner is None
        and (job.next_run_at is None or job.next_run_at > now)
    ):
        reasons.append(workflows.describe_wait(job))  # a workflow wait (invariant 30)
    elif job.next_run_at is None:
        reasons.append("It has no run time, so no worker will claim it.")
    elif job.next_run_at > now:
        waiting = (
            "a retry after a failed slice"
            if job.status == Status.RUNNING.value
            else "its scheduled time"
        )
        reasons.append(
            f"It is not due until {job.next_run_at:%Y-%m-%d %H:%M:%S %Z} "
            f"(in {_duration((job.next_run_at - now).total_seconds())}), {waiting}."
        )
    # Invariant 28: read with the dequeue statement's own "paused" predicate.
    pause = store.get_paused_queue(job.queue_name)
    if pause is not None:
        reasons.append(
            f"Queue {job.queue_name!r} is paused since {pause.paused_at:%Y-%m-%d %H:%M:%S %Z} "
            f"by {pause.paused_by or 'an unnamed operator'}: {pause.reason or 'no reason given'}. "
            f"No worker claims from it until `durable_jobs resume {job.queue_name}`."
        )
    unserved = workers.who_serves(job, workers.live_workers())
    if unserved is not None:
        reasons.append(unserved)
    elif registry.get(job.kind) is None:
        reasons.append(
            f"No handler for kind {job.kind!r} is registered in this process; a live worker "
            "that knows it claims it."
        )
    if unserved is None and job.queue_name != settings.DEFAULT_QUEUE:
        reasons.append(
            f"It is on queue {job.queue_name!r}, not the default queue ({settings.DEFAULT_QUEUE!r}): "
            f"only workers started with --queues including {job.queue_name!r} claim it."
        )
    if not reasons:
        since = job.next_run_at or job.pending_since or job.created_at
        reasons.append(
            f"It is due since {since:%Y-%m-%d %H:%M:%S %Z} ({_ago(now, since)} ago): the next free "
            f"worker slot serving queue {job.queue_name!r} claims it. If this lasts, check that "
            "workers are running (`durable_jobs stats` shows the oldest pending job)."
        )
    return reasons
