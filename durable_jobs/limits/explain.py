""" "Why isn't this job running?": every reason, as data, read with the claim's predicates.

``explain(job)`` is the one explainer: the admin panel, ``durable_jobs explain`` and
``durable_jobs.explain`` all answer with it. What keeps a pending job from the claim
(not due, backing off, held, cancel asked, queue paused, its flow key full or rate
limited) comes from ``store.explain_job``, which composes the very SQL fragments DEQUEUE
is built from (invariant 28); the rest (no live worker serves the queue or runs the
kind, parked, a lease expired) is read beside it. A held job's details come from the
wait feature's own reading (``waits.explain.explain_hold``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from durable_jobs import conf, store, workflows
from durable_jobs.limits import reasons as r
from durable_jobs.limits.claims import claim_settings
from durable_jobs.limits.reasons import Reason
from durable_jobs.models import Job, WorkerProcess
from durable_jobs.states import Scope, Status
from durable_jobs.waits.explain import explain_hold

_AT = "%Y-%m-%d %H:%M:%S %Z"


def explain(job: Job, *, using: str = DEFAULT_DB_ALIAS) -> tuple[Reason, ...]:
    """Every reason ``job`` is not running now, most decisive first (``claimable`` if none)."""
    scope = Scope(tenant=job.tenant_id, organization=job.organization_id)
    verdict = store.explain_job(job.id, scope, flow=claim_settings(), using=using)
    if verdict is None:
        return ()
    job = Job.objects.using(using).get(id=job.id)  # the row as the verdicts read it
    now: datetime = verdict["now"]
    settled = _settled(job, now)
    if settled is not None:
        return settled
    found = [*_schedule(job, verdict, now), *_flow(job, verdict), *_workers(job, now, using)]
    if verdict["paused"]:
        pause = store.get_paused_queue(job.queue_name, using=using)
        said = (
            f" since {pause.paused_at:{_AT}} by {pause.paused_by or 'an unnamed operator'}: "
            f"{pause.reason or 'no reason given'}"
            if pause
            else ""
        )
        found.append(
            Reason(
                code=r.QUEUE_PAUSED,
                sentence=f"Queue {job.queue_name!r} is paused{said}. No worker claims from it "
                f"until `durable_jobs resume {job.queue_name}`.",
                fields={
                    "queue": job.queue_name,
                    "since": pause.paused_at if pause else None,
                    "by": pause.paused_by if pause else None,
                    "reason": pause.reason if pause else None,
                },
            )
        )
    if verdict["lock_holder"] is not None:
        found.append(
            Reason(
                code=r.LOCK_KEY_HELD,
                sentence=f"Lock key {job.lock_key!r} is held by job {verdict['lock_holder']}.",
                fields={"lock_key": job.lock_key, "holder": str(verdict["lock_holder"])},
            )
        )
    if not any(reason.blocks_claim for reason in found):
        # The claim would take it: say so even when no worker is asking (the reason
        # beside it says that), so "claimable" always means what the claim means.
        found.append(_claimable(job, verdict))
    return tuple(found)


def _settled(job: Job, now: datetime) -> tuple[Reason, ...] | None:
    """The answer for a job that is running or finished: no claim is involved."""
    if job.status in (Status.RUNNING.value, Status.PENDING.value) and job.lease_owner is not None:
        if job.lease_expires_at is not None and job.lease_expires_at < now:
            return (
                Reason(
                    code=r.LEASE_EXPIRED,
                    sentence=f"Its lease, held by {job.lease_owner}, expired at {job.lease_expires_at:{_AT}}: "
                    "the worker stopped or stalled; the reconciler re-drives it after the orphan grace.",
                    fields={"owner": job.lease_owner, "expired_at": job.lease_expires_at},
                ),
            )
        return (
            Reason(
                code=r.RUNNING,
                sentence=f"It is running: its lease is held by {job.lease_owner} until "
                f"{job.lease_expires_at:{_AT}}.",
                fields={"owner": job.lease_owner, "until": job.lease_expires_at},
            ),
        )
    if job.status in (Status.COMPLETED.value, Status.CANCELLED.value):
        return (
            Reason(
                code=r.FINISHED,
                sentence=f"It is {job.status}: finished jobs never run again (start a new job instead).",
                fields={"status": job.status},
            ),
        )
    if job.status == Status.FAILED.value:
        if job.parked_at is not None:
            return (
                Reason(
                    code=r.PARKED,
                    sentence=f"It is parked ({job.error_code or 'no reason recorded'}) since "
                    f"{job.parked_at:{_AT}}: only an operator's re-drive runs it again.",
                    fields={"why": job.error_code, "since": job.parked_at},
                ),
            )
        return (
            Reason(
                code=r.FAILED,
                sentence=f"It failed ({job.error_code or job.error_class or 'no code'}): only an "
                "operator's re-drive runs it again.",
                fields={"error_class": job.error_class, "error_code": job.error_code},
            ),
        )
    return None


def _schedule(job: Job, verdict: dict[str, Any], now: datetime) -> list[Reason]:
    """Not due, backing off, held, cancel asked: the claim's `_claimable` said no."""
    found: list[Reason] = []
    if job.cancel_requested_at is not None:
        found.append(
            Reason(
                code=r.CANCEL_REQUESTED,
                sentence=f"Cancellation was requested{' by ' + job.cancelled_by if job.cancelled_by else ''} "
                f"at {job.cancel_requested_at:{_AT}}: the reconciler ends it as cancelled instead of running it.",
                fields={"since": job.cancel_requested_at, "by": job.cancelled_by},
            )
        )
    if verdict["due"]:  # its run time has come (the claim's own `_due`)
        return found
    hold = explain_hold(job, now=now)
    if (
        hold is None
        and workflows.current_wait(job.flow_wait, job.continuation_seq)
        and job.status == Status.PENDING.value
        and job.lease_owner is None
    ):
        # A workflow wait (invariant 30): children, dependencies, an event or a sleep.
        found.append(
            Reason(
                code=r.WORKFLOW_WAIT,
                sentence=workflows.describe_wait(job),
                fields={"wait": dict(job.flow_wait) if isinstance(job.flow_wait, dict) else None},
            )
        )
    elif hold is not None:
        found.append(
            Reason(
                code=r.HELD,
                sentence=hold.summary,
                fields={
                    "condition": hold.label,
                    "since": hold.held_since,
                    "checks": hold.checks,
                    "faults": hold.faults,
                    "next_check": hold.next_check,
                },
            )
        )
    elif job.next_run_at is None:
        found.append(
            Reason(
                code=r.NOT_DUE,
                sentence="It has no run time, so no worker will claim it.",
                fields={"until": None},
            )
        )
    elif job.status == Status.RUNNING.value:
        found.append(
            Reason(
                code=r.BACKING_OFF,
                sentence=f"It is backing off after failure {job.consecutive_failures}"
                f" ({job.error_code or job.error_class or 'no code'}) until {job.next_run_at:{_AT}}.",
                fields={
                    "failures": job.consecutive_failures,
                    "until": job.next_run_at,
                    "error_code": job.error_code,
                },
            )
        )
    else:
        found.append(
            Reason(
                code=r.NOT_DUE,
                sentence=f"It is not due until {job.next_run_at:{_AT}}.",
                fields={"until": job.next_run_at},
            )
        )
    return found


def _flow(job: Job, verdict: dict[str, Any]) -> list[Reason]:
    """Its flow key's room, read with the claim's `_flow_room` (invariant 28)."""
    if job.flow_key is None or verdict["room"] is None or verdict["room"] > 0:
        return []
    holders = [str(h) for h in verdict["holders"]]
    concurrency = verdict["concurrency"]
    if concurrency is not None and len(holders) >= concurrency:
        return [
            Reason(
                code=r.CONCURRENCY_FULL,
                sentence=f"Flow key {job.flow_key!r} is full: {len(holders)} of {concurrency} permits "
                f"held by {', '.join(holders)}.",
                fields={"key": job.flow_key, "limit": concurrency, "holders": holders},
            )
        ]
    return [
        Reason(
            code=r.RATE_LIMITED,
            sentence=f"Flow key {job.flow_key!r} is rate limited ({verdict['rate']} starts per "
            f"{verdict['window_s']:g} s) until {verdict['rate_frees_at']:{_AT}}.",
            fields={
                "key": job.flow_key,
                "limit": verdict["rate"],
                "window_s": float(verdict["window_s"]),
                "until": verdict["rate_frees_at"],
            },
        )
    ]


def _claimable(job: Job, verdict: dict[str, Any]) -> Reason:
    behind = verdict["behind"]
    if job.flow_key is not None and behind:
        return Reason(
            code=r.FAIR_TURN,
            sentence=f"It is claimable; its flow key {job.flow_key!r} has had {behind:g} more turns "
            "than the least-served key, so keys behind it go first.",
            fields={"key": job.flow_key, "behind": float(behind)},
        )
    since = job.next_run_at or job.pending_since or job.created_at
    return Reason(
        code=r.CLAIMABLE,
        sentence=f"It is due since {since:{_AT}}: the next free worker slot serving queue "
        f"{job.queue_name!r} claims it. If this lasts, check that workers are running "
        "(`durable_jobs stats` shows the oldest pending job).",
        fields={"queue": job.queue_name, "due_since": since},
    )


def _workers(job: Job, now: datetime, using: str) -> list[Reason]:
    """No live worker serves its queue (and when one last did), or none runs its kind (invariant 14b)."""
    ttl = timedelta(seconds=conf.get().LEASE_TTL)
    rows = list(WorkerProcess.objects.using(using).values("queues", "kinds", "beat_at"))
    live = [w for w in rows if w["beat_at"] >= now - ttl]
    serving = [w for w in live if job.queue_name in (w["queues"] or [])]
    if not serving:
        served = [w["beat_at"] for w in rows if job.queue_name in (w["queues"] or [])]
        last = max(served, default=None)
        if not live:
            sentence = "No live worker is running (none has beaten within LEASE_TTL): start durable_worker."
        else:
            queues = sorted({q for w in live for q in w["queues"] or []})
            sentence = f"No live worker serves queue {job.queue_name!r}; workers serve " + (
                ", ".join(repr(q) for q in queues) + "."
            )
        if last is not None:
            sentence += f" One last served it at {last:{_AT}}."
        return [
            Reason(
                code=r.NO_WORKER,
                sentence=sentence,
                fields={"queue": job.queue_name, "last_seen": last},
            )
        ]
    if not any(job.kind in (w["kinds"] or []) for w in serving):
        return [
            Reason(
                code=r.NO_KIND,
                sentence=f"No live worker serving {job.queue_name!r} can run kind {job.kind!r} (it is "
                "not registered in any of them: an older deploy?); it waits, uncharged, for one that can.",
                fields={"queue": job.queue_name, "kind": job.kind},
            )
        ]
    return []


__all__ = ["explain"]
