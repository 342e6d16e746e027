"""A slot claims several quick jobs in one statement, and hands back what it did not start."""

from __future__ import annotations

import math
import threading
import time

import pytest
from django.db.models import Count

import durable_jobs as durable
from durable_jobs import conf, store
from durable_jobs.models import Job
from durable_jobs.runtime.supervision import HAND_BACK_BUSY_WAIT, HAND_BACK_WAIT_MS
from durable_jobs.runtime.worker import PREFETCH_WINDOW, QUICK_SLICE, Pace, SlotState, Worker
from tests.factories import reload
from tests.integration.support import connect_to_test_database

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_burst_of_quick_jobs_is_claimed_in_batches_and_all_complete():
    durable.start_many([{"kind": "demo.noop"} for _ in range(60)])
    worker = Worker(concurrency=1, burst=True)
    assert worker.run() == 0
    assert Job.objects.filter(status="completed").count() == 60
    claims = Job.objects.values("started_at").annotate(n=Count("id"))
    assert max(row["n"] for row in claims) > 1, "some jobs were claimed by one statement"
    assert all(job.lease_epoch == 1 and job.redrives == 0 for job in Job.objects.all()), (
        "each row its own claim"
    )


def test_claims_left_unstarted_at_shutdown_are_handed_back_without_spending_budget():
    durable.start_many([{"kind": "demo.noop"} for _ in range(3)])
    worker = Worker(concurrency=1)
    claimed = store.dequeue(["default"], "slot", 60_000, kinds=None, limit=3)
    worker.stopping.set()
    slot = SlotState(number=0, generation=0, owner="slot")
    worker._run_claimed(slot, claimed, 60_000, None)
    for job in claimed:
        after = reload(job)
        assert (after.status, after.lease_owner, after.redrives, after.consecutive_failures) == (
            "running",
            None,
            0,
            0,
        )
    assert len(store.dequeue(["default"], "next", 60_000, kinds=None, limit=5)) == 3, (
        "deliverable again at once"
    )


def lock_row_for(job, seconds: float) -> threading.Thread:
    """Another session holds ``job``'s row lock for ``seconds``, as a claim re-checking a
    row it saw deliverable, or the heartbeat's statement, does for a moment."""
    locked = threading.Event()

    def hold() -> None:
        with connect_to_test_database() as conn:
            conn.execute("SELECT 1 FROM durable_jobs_job WHERE id = %s FOR UPDATE", [job.id])
            locked.set()
            time.sleep(seconds)
            conn.rollback()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert locked.wait(10), "the row lock was taken"
    return thread


def hand_back_at_shutdown(claimed) -> float:
    """A stopping worker's slot hands its unstarted claims back; return how long it took."""
    worker = Worker(concurrency=1)
    worker.stopping.set()
    began = time.monotonic()
    worker._run_claimed(SlotState(number=0, generation=0, owner="slot"), claimed, 60_000, None)
    return time.monotonic() - began


def test_a_claim_whose_row_is_locked_for_a_moment_is_still_handed_back():
    """On a saturated server a claim's row may be locked for longer than the first
    wait: left to its lease, the job would wait LEASE_TTL plus ORPHAN_GRACE (90 s by
    default) to run. The hand-back waits for it once more instead."""
    durable.start_many([{"kind": "demo.noop"} for _ in range(3)])
    claimed = store.dequeue(["default"], "slot", 60_000, kinds=None, limit=3)
    holder = lock_row_for(claimed[0], seconds=3 * HAND_BACK_WAIT_MS / 1000)
    took = hand_back_at_shutdown(claimed)
    holder.join()
    assert took >= 2 * HAND_BACK_WAIT_MS / 1000, "it waited for the locked row"
    for job in claimed:
        after = reload(job)
        assert (after.lease_owner, after.redrives, after.consecutive_failures) == (None, 0, 0)
    assert len(store.dequeue(["default"], "next", 60_000, kinds=None, limit=5)) == 3, (
        "all three deliverable again at once"
    )


def test_a_claim_locked_past_every_wait_is_left_to_its_lease_and_the_others_go_back():
    durable.start_many([{"kind": "demo.noop"} for _ in range(3)])
    claimed = store.dequeue(["default"], "slot", 60_000, kinds=None, limit=3)
    holder = lock_row_for(claimed[0], seconds=HAND_BACK_BUSY_WAIT + 2)
    took = hand_back_at_shutdown(claimed)
    holder.join()
    assert took < HAND_BACK_BUSY_WAIT + 1.5, "the wait for a locked row is bounded"
    assert reload(claimed[0]).lease_owner == claimed[0].lease_owner, "left to its lease"
    for job in claimed[1:]:
        assert reload(job).lease_owner is None, "the claims after it were handed back"


@pytest.mark.parametrize("execution", ["thread", "process"])
def test_a_batch_running_past_the_prefetch_window_hands_the_rest_back_uncharged(execution):
    """Slices each under QUICK_SLICE but together past PREFETCH_WINDOW: the claims still
    waiting go back to the queue at once (the whole batch never runs), charged nothing."""
    from durable_jobs.runtime.runner import ChildRunner

    per_slice = 0.6 * QUICK_SLICE
    count = math.ceil(2 * PREFETCH_WINDOW / per_slice) + 1  # together past twice the window
    jobs = [durable.start("demo.brief", input={"seconds": per_slice}) for _ in range(count)]
    worker = Worker(concurrency=1, execution=execution)
    slot = SlotState(number=0, generation=0, owner="slot")
    runner = (
        ChildRunner(role="durable-child-test", stopping=worker.stopping)
        if execution == "process"
        else None
    )
    try:
        if runner is not None:
            runner.ensure_started()
        claimed = store.dequeue(["default"], "slot", 60_000, kinds=None, limit=count)
        assert len(claimed) == count
        worker._run_claimed(slot, claimed, 60_000, runner)
    finally:
        if runner is not None:
            runner.close()
    rows = [reload(job) for job in jobs]
    completed = [row for row in rows if row.status == "completed"]
    handed_back = [row for row in rows if row.status != "completed"]
    assert completed, "the batch ran until its window closed"
    assert handed_back, "what was still waiting after the window was not run by this slot"
    for row in handed_back:
        assert (row.lease_owner, row.lease_epoch, row.redrives, row.consecutive_failures) == (
            None,
            1,
            0,
            0,
        )
    assert len(store.dequeue(["default"], "next", 60_000, kinds=None, limit=count)) == len(
        handed_back
    ), "deliverable again"


def test_a_batch_its_handler_process_ran_ahead_of_a_late_slot_is_completed_in_one_statement(
    monkeypatch,
):
    """On a saturated machine the handler process runs a batch's no-op slices while its
    slot thread waits for a CPU; the slot, back past PREFETCH_WINDOW, finds every claim
    already run. Nothing is left to hand back, and the finished slices are completed
    together: each one's own statement (and a round trip to the handler process per
    slice) was three in four of the transactions 64 slots on 2 cores spent (issue #27)."""
    from durable_jobs.runtime.runner import ChildRunner

    run = ChildRunner.run
    heard: list[str] = []

    def first_heard_late(self, context, **kwargs):
        ran = run(self, context, **kwargs)
        if not heard:
            time.sleep(1.5 * PREFETCH_WINDOW)  # the child runs the rest meanwhile
        heard.append(str(context.id))
        return ran

    monkeypatch.setattr(ChildRunner, "run", first_heard_late)
    count = 12
    ttl_ms = conf.ms(conf.get().LEASE_TTL)  # the handler's own: its claims go to the child at once
    jobs = [durable.start("demo.noop") for _ in range(count)]
    worker = Worker(concurrency=1, execution="process")
    slot = SlotState(number=0, generation=0, owner="slot")
    runner = ChildRunner(role="durable-child-test", stopping=worker.stopping)
    try:
        runner.ensure_started()
        claimed = store.dequeue(["default"], "slot", ttl_ms, kinds=None, limit=count)
        assert len(claimed) == count
        pace = worker._run_claimed(slot, claimed, ttl_ms, runner)
    finally:
        runner.close()
    rows = [reload(job) for job in jobs]
    assert [row.status for row in rows] == ["completed"] * count, "all ran, none handed back"
    assert all(row.lease_epoch == 1 and row.redrives == 0 for row in rows), "each ran once"
    assert pace is Pace.LONG, "the batch ran past its window: the next claim is halved"
    # Rows completed by one statement share its transaction's timestamp.
    statements = len({row.finished_at for row in rows})
    assert statements <= 2, f"{count} slices completed by {statements} statements"


def test_a_slot_grows_its_batch_only_while_batches_come_back_full_and_quick():
    from durable_jobs.runtime.worker import next_batch

    assert next_batch(1, 1, Pace.QUICK, 64) == 4, "a full claim of quick slices: four times"
    assert next_batch(4, 4, Pace.QUICK, 32) == 16
    assert next_batch(32, 32, Pace.QUICK, 32) == 32, "MAX_PREFETCH caps it"
    assert next_batch(8, 3, Pace.QUICK, 32) == 8, "a thin queue does not grow it"
    assert next_batch(8, 3, Pace.QUICK, 4) == 4, "a lowered MAX_PREFETCH applies at once"
    assert next_batch(16, 16, Pace.LONG, 32) == 8
    assert next_batch(1, 1, Pace.LONG, 32) == 1
    assert next_batch(16, 16, Pace.SLOW, 32) == 1


def test_a_batch_grows_no_further_than_its_slices_fit_in_the_prefetch_window():
    """50 ms slices: a batch of 8 would run 400 ms, past PREFETCH_WINDOW (250 ms), and hand
    its last claims back every other batch; sized to the window it holds 4 and stays there."""
    from durable_jobs.runtime.pacing import fits_in_window
    from durable_jobs.runtime.worker import next_batch

    fits = fits_in_window(0.0505)
    assert fits == 4
    assert next_batch(4, 4, Pace.QUICK, 64, fits) == 4, "full and quick, but 8 would not fit"
    assert next_batch(2, 2, Pace.QUICK, 64, fits) == 4
    assert next_batch(8, 8, Pace.LONG, 64, fits) == 4
    assert next_batch(4, 4, Pace.QUICK, 2, fits) == 2, "MAX_PREFETCH still caps it"
    assert fits_in_window(0.0001) == 2250, "no-op slices: MAX_PREFETCH is the bound"
    assert fits_in_window(0.3) == 1
    assert fits_in_window(None) is None
    assert next_batch(4, 4, Pace.QUICK, 64, None) == 16, "nothing measured yet: no bound"


def test_a_slot_claims_ahead_with_enough_slices_queued_to_cover_the_claim():
    """How many slices are still queued in the handler process when the slot claims ahead:
    the claim's round trip over the mean slice, at least the running one, at most half of
    what the last claim sent (the claims taken ahead wait behind them)."""
    from durable_jobs.runtime.pacing import claim_lead

    assert claim_lead(None, 0.0002, 64) == 1, "nothing measured yet: as the last slice starts"
    assert claim_lead(0.002, None, 64) == 1
    assert claim_lead(0.003, 0.02, 4) == 1, "one 20 ms slice covers a 3 ms claim"
    assert claim_lead(0.002, 0.0002, 64) == 10
    assert claim_lead(0.005, 0.0001, 16) == 8, "half of what was sent, at most"
    assert claim_lead(0.005, 0.0001, 1) == 1


def test_max_prefetch_defaults_by_execution_mode_and_a_setting_overrides_it():
    from durable_jobs import conf
    from durable_jobs.exceptions import ConfigurationError
    from durable_jobs.runtime.worker import prefetch_ceiling

    assert prefetch_ceiling(None, "process") == 64
    assert prefetch_ceiling(None, "thread") == 8, (
        "a crash in thread execution takes the whole batch"
    )
    assert prefetch_ceiling(1, "process") == 1
    for bad in (0, -4, 2.5, "8", True):
        with pytest.raises(ConfigurationError, match="MAX_PREFETCH"):
            conf.Settings(MAX_PREFETCH=bad)


@pytest.mark.parametrize(
    ("kind", "job_input", "next_claim"),
    [
        ("demo.brief", {"seconds": 0.0}, 4),
        ("demo.brief", {"seconds": 1.5 * QUICK_SLICE}, 1),
        ("demo.slow_mirror", {"mirror_seconds": 1.5 * QUICK_SLICE}, 1),
    ],
    ids=["quick-run", "slow-handler", "slow-mirror"],
)
def test_a_slice_is_judged_by_its_own_work_not_by_how_late_the_slot_heard_of_it(
    monkeypatch, kind, job_input, next_claim
):
    """On a saturated machine a slot thread hears of a no-op run tens of milliseconds late.
    Judged by that delay, every slice looked slow and every slot fell back to one claim
    per job. Judged by its own work, a quick run stays quick (the slot's next claim asks
    for four), while a slow handler (by the handler process's clock) or a slow mirror (on
    the slot) is still slow (the next claim asks for one)."""
    from durable_jobs.runtime.runner import ChildRunner

    late = 1.5 * QUICK_SLICE  # as a starved slot thread sees a no-op
    run = ChildRunner.run
    heard_late: list[str] = []

    def run_heard_late(self, context, **kwargs):
        ran = run(self, context, **kwargs)
        time.sleep(late)  # the answer is in; the slot thread gets to it late
        heard_late.append(str(context.id))
        return ran

    limits: list[int] = []
    dequeue = store.dequeue_from  # the worker's claim

    def counted(*args, limit, **kwargs):
        limits.append(limit)
        return dequeue(*args, limit=limit, **kwargs)

    monkeypatch.setattr(ChildRunner, "run", run_heard_late)
    monkeypatch.setattr(store, "dequeue_from", counted)
    jobs = [durable.start(kind, input=job_input) for _ in range(2)]
    worker = Worker(concurrency=1, execution="process", burst=True, reconcile=False)
    assert worker.run() == 0
    assert [reload(job).status for job in jobs] == ["completed", "completed"]
    assert heard_late, "the slot heard of the run late"
    assert limits[:2] == [1, next_claim], f"claims asked for {limits}"
