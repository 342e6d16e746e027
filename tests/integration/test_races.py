"""Races between an operator and a late worker: exactly one of them wins, on two connections."""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.states import Lease
from tests.factories import reload, running

pytestmark = pytest.mark.django_db(transaction=True)


def race(*actions):
    """Run each action on its own thread and connection, released together; return results."""
    barrier = threading.Barrier(len(actions))
    results: list = [None] * len(actions)

    def run(index, action):
        barrier.wait()
        try:
            results[index] = action()
        except Exception as error:  # noqa: BLE001 - the loser may be refused with an error
            results[index] = error
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(actions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_cancel_racing_completion_leaves_exactly_one_terminal_status(kinds):
    """Invariant 8: cancellation is a request; it never overwrites a completion."""
    kinds.add("tests.noop")
    for _ in range(10):
        job = running(lease_expires_at=60)
        lease = Lease(job_id=job.id, owner="worker-a", epoch=1, ttl_ms=1000)
        completed, cancelled = race(lambda: store.complete(lease), lambda: durable.cancel(job.id))
        after = reload(job)
        assert completed is not None and after.status == "completed", (
            "the holder's completion stands"
        )
        assert isinstance(cancelled, durable.WrongState) or cancelled.status == "running"


def test_the_cancel_cas_and_a_completion_cannot_both_win(kinds):
    kinds.add("tests.noop")
    for _ in range(10):
        job = running(lease_expires_at=60, cancel_requested_at=-1)
        lease = Lease(job_id=job.id, owner="worker-a", epoch=1, ttl_ms=1000)
        done, cancelled = race(lambda: store.complete(lease), lambda: store.finish_cancelled(lease))
        assert (done is None) != (cancelled is None), "exactly one terminal CAS applies"
        assert reload(job).status in ("completed", "cancelled")


def test_operator_redrive_racing_a_late_completion(kinds):
    """A stalled worker completes late while an operator re-drives its expired lease."""
    kinds.add("tests.noop")
    for _ in range(10):
        job = running(lease_expires_at=-120)
        lease = Lease(job_id=job.id, owner="worker-a", epoch=1, ttl_ms=1000)
        done, redriven = race(lambda: store.complete(lease), lambda: durable.redrive(job.id))
        after = reload(job)
        if done is not None:
            assert after.status == "completed" and isinstance(redriven, durable.WrongState)
        else:
            assert (
                after.status == "pending"
                and after.lease_epoch == 2
                and not isinstance(redriven, Exception)
            )


def test_orphan_take_racing_the_old_worker_s_heartbeat(kinds):
    """Whoever wins, the old holder never keeps writing after a take."""
    kinds.add("tests.noop")
    for _ in range(10):
        job = running(lease_expires_at=-60)
        lease = Lease(job_id=job.id, owner="worker-a", epoch=1, ttl_ms=60_000)
        beat, taken = race(
            lambda: store.heartbeat(lease),
            lambda: store.take_orphan(job.id, grace_ms=0, backoff_ms=0),
        )
        if taken is not None:
            assert beat is None or reload(job).lease_epoch == 2
            assert store.heartbeat(lease) is None, "after the take the old lease is dead"
        else:
            assert beat is False, "the heartbeat renewed first, so the job was no orphan any more"


def test_an_orphan_take_waits_for_a_fenced_transaction_holding_the_row(kinds):
    """A fenced transaction holds the row; a concurrent take waits for it and then wins."""
    kinds.add("tests.noop")
    job = running(lease_expires_at=-60)
    lease = Lease(job_id=job.id, owner="worker-a", epoch=1, ttl_ms=60_000)
    inside = threading.Event()
    release = threading.Event()

    def fenced_writer():
        try:
            with transaction.atomic():
                assert store.assert_lease(lease)
                inside.set()
                release.wait(5)
                return store.write_checkpoint(lease, {"at": 1})
        finally:
            connections.close_all()

    def taker():
        try:
            inside.wait(5)
            threading.Timer(0.3, release.set).start()
            return store.take_orphan(job.id, grace_ms=0, backoff_ms=0)
        finally:
            connections.close_all()

    wrote, taken = race(fenced_writer, taker)
    assert wrote is True, "the fence held the row: its write landed first"
    assert taken is None, (
        "the checkpoint renewed the lease, so the job was no orphan by the time the take ran"
    )
    assert reload(job).checkpoint == {"at": 1}


def _reconcile():
    from durable_jobs.runtime.reconciler import Reconciler

    return Reconciler().run_pass()


@pytest.mark.parametrize("step", ["yield", "fail"])
def test_cancel_racing_a_yield_or_a_failure_still_ends_the_job_cancelled(kinds, step):
    """Invariant 8: whichever lands first, the request survives and the reconciler honours it."""
    kinds.add("tests.noop")
    for _ in range(5):
        job = running(lease_expires_at=60)
        lease = Lease(job_id=job.id, owner="worker-a", epoch=1, ttl_ms=1000)
        if step == "yield":
            holder = lambda: store.yield_slice(lease)  # noqa: E731
        else:
            holder = lambda: store.fail_slice(  # noqa: E731
                lease,
                error_class="transient",
                code="x",
                message="m",
                max_failures=5,
                backoff_base_ms=10,
                backoff_max_ms=10,
            )
        written, requested = race(holder, lambda: durable.cancel(job.id))
        assert written is not None and not isinstance(requested, Exception)
        _reconcile()
        assert reload(job).status == "cancelled"


def test_cancel_racing_an_operator_redrive_ends_consistently(kinds):
    kinds.add("tests.noop")
    for _ in range(5):
        job = running(
            status="failed",
            lease_owner=None,
            finished_at=-1,
            error_code="terminal",
            error_class="terminal",
        )
        redriven, cancelled = race(lambda: durable.redrive(job.id), lambda: durable.cancel(job.id))
        assert not isinstance(redriven, Exception)
        _reconcile()
        after = reload(job)
        if isinstance(
            cancelled, durable.WrongState
        ):  # the cancel came first: a failed job is not live
            assert after.status == "pending"
        else:  # the re-drive came first: the pending job was then cancelled
            assert after.status == "cancelled"


def test_operator_redrive_racing_a_late_heartbeat(kinds):
    """A stalled worker wakes and heartbeats while an operator re-drives its expired lease:
    either the heartbeat renews first (the redrive is refused: the job is alive again) or
    the redrive wins and the heartbeat finds its lease gone. Never both."""
    kinds.add("tests.noop")
    for _ in range(10):
        job = running(lease_expires_at=-120)
        lease = Lease(job_id=job.id, owner="worker-a", epoch=1, ttl_ms=60_000)
        beat, redriven = race(lambda: store.heartbeat(lease), lambda: durable.redrive(job.id))
        after = reload(job)
        if isinstance(redriven, durable.WrongState):
            assert beat is False and after.status == "running" and after.lease_epoch == 1
        else:
            assert beat is None and after.status == "pending" and after.lease_epoch == 2
