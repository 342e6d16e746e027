"""Helpers for an application's own tests: run handlers against the real store, in-process.

    from durable_jobs import testing

    def test_rebuild(db):
        job = durable.start("reports.rebuild", input={"report": 1})
        testing.run_jobs()                      # every due slice, until idle
        testing.assert_started("reports.rebuild", input={"report": 1})

Slices run on the calling thread and connection, so they work inside Django's
``TestCase`` transaction; no worker process, no background heartbeat (a slice run here
is expected to be short).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.models.functions import Now

from durable_jobs import conf, reads, registry, service, store
from durable_jobs.limits import claims
from durable_jobs.models import HELD, Job
from durable_jobs.runtime import scheduler
from durable_jobs.runtime.executor import SliceReport, run_slice
from durable_jobs.states import LIVE_STATUSES

_OWNER = "durable_jobs.testing"


def run_jobs(
    *,
    queues: Sequence[str] | None = None,
    max_slices: int | None = None,
    fast_forward: bool = False,
    using: str = DEFAULT_DB_ALIAS,
) -> list[SliceReport]:
    """Run due slices one after another until none is due (or ``max_slices`` ran).

    Like a worker, it runs only kinds registered in this process (invariant 14b).
    ``fast_forward=True`` also brings scheduled jobs (retries after a backoff, a
    ``run_after`` in the future) forward, so a job runs to its end in one call. A job
    held by a wait condition is left where it is: its next pickup would only ask the
    same question again (bring one forward with ``fast_forward(job)`` to check again).
    Returns one report per slice, in order.
    """
    queues = list(queues) if queues else _all_queues(using)
    ttl_ms = conf.ms(conf.get().LEASE_TTL)
    reports: list[SliceReport] = []

    def claim_one() -> list[Job]:
        return store.dequeue(
            queues,
            _OWNER,
            ttl_ms,
            kinds=registry.kinds(),
            limit=1,
            flow=claims.claim_settings(),
            using=using,
        )

    while max_slices is None or len(reports) < max_slices:
        claimed = claim_one()
        if not claimed and fast_forward:
            if _bring_forward(queues, using):
                continue
            # Nothing left to bring forward; but a retry may have come due on its own
            # between the claim and that look (it is then neither due to the claim nor
            # scheduled to the look): one more claim, and only then is the run over.
            claimed = claim_one()
        if not claimed:
            break
        reports.append(run_slice(claimed[0], using=using))
    return reports


def fast_forward(job: Job | Any, *, using: str = DEFAULT_DB_ALIAS) -> Job:
    """Make a scheduled (or backing-off) job due now; returns the row."""
    job_id = getattr(job, "id", job)
    row = store.make_due(job_id, using=using)
    if row is None:
        row = reads.get_job_unscoped(job_id, using=using)
        if row is None:
            raise AssertionError(f"no job {job_id}")
    return row


def assert_started(
    kind: str, *, input: Any = ..., scope: Any = None, count: int | None = None
) -> list[Job]:
    """Assert jobs of ``kind`` were started (with ``input``, if given); return them."""
    jobs, _ = service.list_jobs(scope=scope, kind=kind, page_size=200)
    if input is not ...:
        jobs = [job for job in jobs if job.input == input]
    if count is None and not jobs:
        raise AssertionError(
            f"no {kind!r} job was started" + ("" if input is ... else f" with input {input!r}")
        )
    if count is not None and len(jobs) != count:
        raise AssertionError(f"expected {count} {kind!r} job(s), found {len(jobs)}")
    return jobs


def _all_queues(using: str) -> list[str]:
    queues = set(
        Job.objects.using(using)
        .filter(status__in=LIVE_STATUSES)
        .values_list("queue_name", flat=True)
    )
    return sorted(queues) or [conf.get().DEFAULT_QUEUE]


def _bring_forward(queues: Sequence[str], using: str) -> bool:
    # A paused queue's jobs stay where they are: nothing would claim them (invariant 27).
    paused = {pause.queue for pause in store.list_paused_queues(using=using)}
    queues = [queue for queue in queues if queue not in paused]
    waiting = (
        Job.objects.using(using)
        .filter(
            status__in=LIVE_STATUSES,
            lease_owner__isnull=True,
            cancel_requested_at__isnull=True,
            queue_name__in=list(queues),
            kind__in=registry.kinds(),  # what run_jobs can claim (invariant 14b)
            # Not yet due: a due job the dequeue passed over (its key's limit is full) is
            # left for the next scheduled one, which the fast-forward must still reach.
            next_run_at__gt=Now(),
        )
        .exclude(HELD)
        .order_by("next_run_at")
        .values_list("id", flat=True)[:1]
    )
    for job_id in waiting:
        # None when it came due on its own since: the next dequeue takes it all the same.
        store.make_due(job_id, using=using)
        return True
    return False


def fast_forward_schedule(name: str, *, using: str = DEFAULT_DB_ALIAS) -> datetime:
    """Make schedule ``name``'s next tick due now (database clock); return the tick's instant.

    Five-field cron has minute resolution: instead of sleeping until the minute, a test
    brings the tick to now and lets a worker (woken by the NOTIFY this sends) or
    ``fire_schedules()`` fire it. The returned instant is the tick its job's key names.
    """
    tick = store.fast_forward_schedule(name, notify_channel=conf.get().NOTIFY_CHANNEL, using=using)
    if tick is None:
        raise AssertionError(f"schedule {name!r} is not active, or its tick is already due")
    return tick


def fire_schedules(*, using: str = DEFAULT_DB_ALIAS) -> int:
    """Fire every due schedule once, on this thread, as the scheduler's leader would; return
    how many jobs started (run them with ``run_jobs()``)."""
    return scheduler.fire_due(using=using).started
