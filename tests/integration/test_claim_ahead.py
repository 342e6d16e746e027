"""While a batch's last slices run in the handler process, its slot claims the next batch and
queues it behind: the handler process goes straight on, and the claims taken ahead are held,
handed back and never run twice like any batch-mate."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.db.models import Max, Min

import durable_jobs as durable
from durable_jobs import conf, store
from durable_jobs.models import Job
from durable_jobs.runtime import completer
from durable_jobs.runtime.runner import ChildRunner
from durable_jobs.runtime.worker import SlotState, Worker
from tests.integration.support import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _run_in_a_thread(worker: Worker) -> tuple[threading.Thread, list[int]]:
    """Start ``worker.run()`` on a thread of its own; its exit code lands in the list."""
    exit_code: list[int] = []
    thread = threading.Thread(target=lambda: exit_code.append(worker.run()), daemon=True)
    thread.start()
    return thread, exit_code


def _claims_in_order() -> list[dict]:
    """One row per claim statement (the jobs it took share its ``started_at``): when it
    claimed, and when the last of its jobs was completed."""
    return list(
        Job.objects.values("started_at")
        .annotate(first_done=Min("finished_at"), last_done=Max("finished_at"))
        .order_by("started_at")
    )


def _drain_on_one_slot(seconds: float, count: int) -> list[Job]:
    """Start ``count`` jobs of ``seconds`` each, drain them with one slot, and check that
    every one completed on its first claim; return their rows."""
    durable.start_many([{"kind": "demo.brief", "input": {"seconds": seconds}}] * count)
    worker = Worker(concurrency=1, burst=True, execution="process", reconcile=False)
    assert worker.run() == 0

    jobs = list(Job.objects.all())
    assert [job.status for job in jobs] == ["completed"] * count
    assert {(job.lease_epoch, job.redrives) for job in jobs} == {(1, 0)}, "one claim per job"
    return jobs


def test_the_next_batch_is_claimed_while_the_last_slice_of_the_one_before_runs():
    """20 ms slices on one slot: each batch after the first few is claimed before the batch
    ahead of it is completed (its last slice was still running), and every job still runs
    exactly once on its first claim."""
    _drain_on_one_slot(0.02, 40)
    claims = _claims_in_order()
    overlapped = [
        later
        for earlier, later in zip(claims, claims[1:], strict=False)
        if later["started_at"] < earlier["last_done"]
    ]
    assert len(overlapped) >= len(claims) // 2, (
        f"{len(overlapped)} of {len(claims)} claims were made while the batch before ran"
    )


def test_quick_slices_are_claimed_ahead_while_several_of_the_batch_are_still_to_run():
    """No-op-sized slices on one slot: the claim ahead goes out while several slices of the
    batch are still queued in the handler process (enough to cover the claim's round
    trip), not as its last slice starts: the handler process keeps running while the slot
    waits on the server. Seen in the rows: a batch has more than one job completed after
    the next batch was claimed. Every job still runs once, on its first claim."""
    jobs = _drain_on_one_slot(0, 600)
    claimed_at = sorted({job.started_at for job in jobs})
    left_to_run = [
        sum(1 for job in jobs if job.started_at == earlier and job.finished_at > later)
        for earlier, later in zip(claimed_at, claimed_at[1:], strict=False)
    ]
    assert max(left_to_run) >= 2, (
        f"jobs of each batch completed after the next claim: {left_to_run}"
    )


def test_claims_taken_ahead_of_a_slice_that_proves_slow_go_back_to_the_queue_while_it_runs():
    """The last slice of a quick batch runs long: the claims taken ahead of it are handed back
    uncharged once it has run QUICK_SLICE, not kept waiting behind it, so any slot can take
    them while it still runs."""
    quick = [durable.start("demo.brief", input={"seconds": 0.01}) for _ in range(3)]
    slow = durable.start("demo.brief", input={"seconds": 1.0})
    behind = [durable.start("demo.brief", input={"seconds": 0.01}) for _ in range(4)]
    ttl_ms = conf.ms(conf.get().LEASE_TTL)  # the handler's own: its claims may be sent ahead
    worker = Worker(concurrency=1, execution="process", reconcile=False)
    slot = SlotState(number=0, generation=0, owner="slot", batch=4)
    runner = ChildRunner(role="durable-child-test", stopping=worker.stopping)
    try:
        runner.ensure_started()
        claimed = store.dequeue(["default"], "slot", ttl_ms, kinds=None, limit=4)
        assert [job.id for job in claimed] == [job.id for job in (*quick, slow)]
        worker._run_claimed(slot, claimed, ttl_ms, runner)
    finally:
        runner.close()

    ran = {job.id: job for job in Job.objects.filter(id__in=[j.id for j in (*quick, slow)])}
    assert {job.status for job in ran.values()} == {"completed"}
    slow_done = ran[slow.id].finished_at
    rows = list(Job.objects.filter(id__in=[job.id for job in behind]))
    taken_ahead = [row for row in rows if row.lease_epoch == 1]
    assert taken_ahead, "the slot claimed ahead while the slow slice ran"
    for row in taken_ahead:
        assert (row.status, row.lease_owner, row.redrives, row.consecutive_failures) == (
            "running",
            None,
            0,
            0,
        ), "handed back, uncharged, not run"
        assert row.updated_at < slow_done, "handed back while the slow slice still ran"
    assert len(store.dequeue(["default"], "next", 60_000, kinds=None, limit=10)) == 4


def test_a_stop_mid_run_hands_back_the_claims_taken_ahead_and_runs_nothing_twice():
    """A worker asked to stop while its slot holds claims taken ahead (queued in its handler
    process): what the handler process had started finishes and is recorded, the rest goes
    back to the queue uncharged, and nothing stays leased to the stopped worker."""
    total = 200
    durable.start_many([{"kind": "demo.brief", "input": {"seconds": 0.02}} for _ in range(total)])
    worker = Worker(concurrency=1, execution="process", reconcile=False)
    thread, exit_code = _run_in_a_thread(worker)
    wait_until(
        lambda: Job.objects.filter(status="completed").count() >= 30,
        message="30 jobs to complete",
        timeout=30,
    )
    worker.stop()
    thread.join(30)
    assert exit_code == [0]

    jobs = list(Job.objects.all())
    completed = [job for job in jobs if job.status == "completed"]
    left = [job for job in jobs if job.status != "completed"]
    assert completed and left, "stopped mid-run"
    assert all(job.lease_epoch == 1 and job.redrives == 0 for job in completed)
    for job in left:
        assert (job.lease_owner, job.redrives, job.consecutive_failures, job.interruptions) == (
            None,
            0,
            0,
            0,
        ), f"{job.id} was left leased or charged"
    assert len(store.dequeue(["default"], "next", 60_000, kinds=None, limit=total)) == len(left), (
        "everything not completed is deliverable again at once"
    )


def _completer_backends() -> list[int]:
    """This database's connections a worker's completer thread holds (``<app>/completer``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE %s",
            ["%/completer"],
        )
        return [row[0] for row in cursor.fetchall()]


def test_batched_completions_beside_the_claim_ahead_survive_a_cut_and_close_with_the_worker(
    monkeypatch,
):
    """A one-slot worker on a host of two cores completes a batch's finished slices on a
    connection of its own (its completer, named in pg_stat_activity) while the slot claims
    the next batch on the slot's. That connection is cut mid-run: the completion in flight,
    or the next one, reconnects and lands, and every job still runs exactly once, on its
    first claim. The worker closes the connection when it stops."""
    monkeypatch.setattr(completer, "usable_cores", lambda: 2)
    total = 4000
    durable.start_many([{"kind": "demo.brief", "input": {"seconds": 0}}] * total)
    worker = Worker(concurrency=1, burst=True, execution="process", reconcile=False)
    thread, exit_code = _run_in_a_thread(worker)
    wait_until(_completer_backends, message="the completer's connection", timeout=60)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS"
            " pid) AS cut",
            [_completer_backends()],
        )
    assert Job.objects.exclude(status="completed").exists(), "cut while jobs were still to run"
    thread.join(120)
    assert exit_code == [0]

    jobs = list(Job.objects.all())
    assert [job.status for job in jobs] == ["completed"] * total
    assert {(job.lease_epoch, job.redrives) for job in jobs} == {(1, 0)}, "one claim per job"
    wait_until(lambda: not _completer_backends(), message="the completer's connection to close")


def test_a_worker_with_as_many_slots_as_cores_holds_no_completer_connection(monkeypatch):
    """The completer pays only with a core the slots leave idle: two slots on two cores
    complete on their own connections, and the worker never opens a third."""
    monkeypatch.setattr(completer, "usable_cores", lambda: 2)
    total = 2000
    durable.start_many([{"kind": "demo.brief", "input": {"seconds": 0}}] * total)
    worker = Worker(concurrency=2, burst=True, execution="process", reconcile=False)
    thread, exit_code = _run_in_a_thread(worker)
    seen: set[int] = set()
    while thread.is_alive():
        seen.update(_completer_backends())
        time.sleep(0.01)
    assert exit_code == [0]
    assert Job.objects.filter(status="completed").count() == total
    assert not seen, "no completer connection"
