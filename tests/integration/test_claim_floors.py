"""A pinned horizon does not make every claim slower than the last (issue #27 item 8).

While a session holds a transaction open, vacuum removes no row version that died after
it began, and the dequeue index keeps an entry for every job claimed since: a claim
reading the queue from its start walks them all. A worker's claim starts each level's
scan at a floor just before the oldest row its last claim took there
(``durable_jobs.runtime.claim_floors``), and a sweep without floors, at least once a
second, takes what appeared below a floor. Cost is counted in pages read, never in time.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.models import Job
from durable_jobs.runtime.worker import Worker
from tests.factories import JobFactory
from tests.integration.support import (
    insert_jobs_due_an_hour_ago,
    pages_read,
    pinned_horizon,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)

CLAIMED_UNDER_THE_PIN = 5000
MARGIN_SECONDS = store.FLOOR_MARGIN_MS / 1000


def _pages_read(floors) -> int:
    """Pages the default claim reads now (limit 1, rolled back), given ``floors``."""
    params = store.claim_params(["default"], "probe", 30_000, kinds=None, floors=floors)
    return pages_read(store.DEQUEUE_OPEN, params)


def _floors_from(claimed) -> list:
    return [(job.queue_name, job.priority, due) for job, due in claimed]


@pytest.fixture
def pinned_and_claimed():
    """5,000 jobs due an hour ago, all claimed while another session pins the horizon."""
    insert_jobs_due_an_hour_ago(CLAIMED_UNDER_THE_PIN)
    with pinned_horizon():
        claimed = 0
        while claimed < CLAIMED_UNDER_THE_PIN:
            got = store.dequeue(["default"], "host-1", 30_000, kinds=None, limit=500)
            assert got, "every old job is claimable"
            claimed += len(got)
        yield


def test_a_claim_from_its_floor_reads_past_none_of_what_the_pinned_horizon_kept(
    pinned_and_claimed,
):
    first = JobFactory(next_run_at=-1)
    swept = store.dequeue_from(["default"], "host-1", 30_000, kinds=None)
    assert [job.id for job, _ in swept] == [first.id]
    floors = _floors_from(swept)
    second = JobFactory(next_run_at=-0.5)

    from_the_floor = _pages_read(floors)
    from_the_start = _pages_read(())
    claimed = store.dequeue_from(["default"], "host-1", 30_000, kinds=None, floors=floors)

    # PostgreSQL 15 (no skip scan) reads the level search's index pages between the floor
    # and the dead entries it filters: 56 pages against 468 measured; 18 reads fewer.
    assert from_the_start > 4 * from_the_floor, (from_the_start, from_the_floor)
    assert from_the_floor < 120, f"the floored claim read {from_the_floor} pages"
    assert [job.id for job, _ in claimed] == [second.id]


def test_a_new_priority_level_is_found_by_a_floored_claim(pinned_and_claimed):
    JobFactory(next_run_at=-1)
    floors = _floors_from(store.dequeue_from(["default"], "host-1", 30_000, kinds=None))
    urgent = JobFactory(priority=9, next_run_at=-0.1)  # a level no claim has seen yet

    claimed = store.dequeue_from(["default"], "host-1", 30_000, kinds=None, floors=floors)

    assert [job.id for job, _ in claimed] == [urgent.id]


def test_a_row_due_before_the_floor_is_left_to_a_sweep(pinned_and_claimed):
    """The contract the worker's sweeps exist for: a floor skips what is due before it."""
    JobFactory(next_run_at=-1)
    floors = _floors_from(store.dequeue_from(["default"], "host-1", 30_000, kinds=None))
    late = JobFactory(next_run_at=-600)  # a start with a run time in the past

    floored = store.dequeue_from(["default"], "host-1", 30_000, kinds=None, floors=floors)
    swept = store.dequeue_from(["default"], "host-1", 30_000, kinds=None)

    assert floored == []
    assert [job.id for job, _ in swept] == [late.id]


@pytest.fixture
def worker(settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "POLL_INTERVAL": 0.5}
    worker = Worker(concurrency=2, execution="thread", reconcile=False)
    exit_code: list[int] = []
    thread = threading.Thread(target=lambda: exit_code.append(worker.run()), daemon=True)
    thread.start()
    yield worker
    worker.stop()
    thread.join(timeout=30)
    assert exit_code == [0], "the worker stopped cleanly"


def _completed(job) -> bool:
    return Job.objects.get(id=job.id).status == "completed"


def test_a_running_worker_runs_a_start_committed_long_after_it_was_inserted(worker):
    """The start's run time is its insert's clock; its transaction commits after the
    worker's floor passed it. A sweep finds it."""
    inserted = threading.Event()
    committed: list[str] = []

    def slow_transaction() -> None:
        try:
            with transaction.atomic():
                committed.append(str(durable.start("demo.noop").id))
                inserted.set()
                time.sleep(MARGIN_SECONDS + 1.5)
        finally:
            connections.close_all()

    opener = threading.Thread(target=slow_transaction)
    opener.start()
    assert inserted.wait(10)
    # Meanwhile the worker claims newer jobs: its floor moves past the open start's run time.
    newer = []
    for _ in range(int(MARGIN_SECONDS * 4) + 6):
        newer.append(durable.start("demo.noop"))
        time.sleep(0.25)
    opener.join()
    wait_until(lambda: all(_completed(job) for job in newer), "the newer jobs to run")
    # Due before any floor the worker holds: only a sweep sees it.
    in_the_past = durable.start(
        "demo.noop", run_after=timezone.now() - timedelta(seconds=3 * MARGIN_SECONDS)
    )

    wait_until(lambda: Job.objects.get(id=committed[0]).status == "completed", "the late commit")
    wait_until(lambda: _completed(in_the_past), "the job due in the past")
