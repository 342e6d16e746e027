"""start_many with real transactions and real races (invariant 9, batch-wide).

A batch lands whole or not at all, with or without the caller's ``transaction.atomic()``,
and a refusal wakes nobody and leaves the caller's transaction usable. A batch racing
another start on a key answers like ``start()`` does. A batch too big for one statement
is refused before anything is written. Rows are counted from a second connection, which
sees only what was committed.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import transaction
from django.test import override_settings

import durable_jobs as durable
from durable_jobs.exceptions import BatchTooLarge, IdempotencyConflict, LockKeyHeld
from durable_jobs.models import Job
from testproject.demo.models import Report
from tests.integration.support import (
    connect_to_test_database,
    in_thread,
    job_count,
    other_connection_fixture,  # noqa: F401  (fixture override)
)

KIND = "tests.batch"
QUEUED = "tests.batch_queued"  # its own queue, so its wake-ups can be told apart
CHANNEL = "durable_jobs"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _kinds(kinds):
    kinds.add(KIND)
    kinds.add(QUEUED, queue="reports")
    kinds.add("tests.batch_other")


def _wakeups(conn) -> list[str]:
    return [notice.payload for notice in conn.notifies(timeout=0.3, stop_after=20)]


def _release_once_someone_waits_on_a_lock(release: threading.Event) -> threading.Thread:
    """Set ``release`` as soon as a session of the test database waits on a row lock:
    our insert is then blocked on the other transaction's uncommitted key, so the race is
    really run at the unique index (not decided by a lookup that happened to see it).
    The thread's ``saw_a_wait`` says whether it did."""

    def watch() -> None:
        with connect_to_test_database(autocommit=True) as watcher:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                waiting = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).fetchone()[0]
                if waiting:
                    thread.saw_a_wait = True
                    break
                time.sleep(0.01)
        release.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.saw_a_wait = False
    thread.start()
    return thread


# ---------------------------------------------------------------------------------------
# 1. All or nothing
# ---------------------------------------------------------------------------------------

REFUSED_BATCHES = {
    "key-of-another-organization": (
        IdempotencyConflict,
        [{"kind": QUEUED}] * 3 + [{"kind": QUEUED, "idempotency_key": "taken"}],
    ),
    "key-of-another-kind": (
        IdempotencyConflict,
        [{"kind": QUEUED}] * 3 + [{"kind": QUEUED, "idempotency_key": "same-org"}],
    ),
    "key-repeated-with-another-kind": (
        IdempotencyConflict,
        [
            {"kind": QUEUED, "idempotency_key": "fresh"},
            {"kind": QUEUED},
            {"kind": "tests.batch_other", "idempotency_key": "fresh"},
        ],
    ),
}


def _existing_jobs() -> None:
    """One job of organization B holding key "taken", one of organization A (another kind)
    holding "same-org"."""
    durable.start(KIND, scope=("default", "org-b"), idempotency_key="taken")
    durable.start("tests.batch_other", scope=("default", "org-a"), idempotency_key="same-org")


@pytest.mark.parametrize(("error", "batch"), REFUSED_BATCHES.values(), ids=REFUSED_BATCHES.keys())
def test_start_many__refused_without_an_outer_transaction_writes_nothing_and_wakes_nobody(
    other_connection, error, batch
):
    """Invariant 9: in autocommit the batch is its own transaction, refused whole."""
    _existing_jobs()
    other_connection.execute(f"LISTEN {CHANNEL}")
    before = job_count(other_connection)

    with pytest.raises(error):
        durable.start_many(batch, scope=("default", "org-a"))

    assert job_count(other_connection) == before
    assert _wakeups(other_connection) == []


@pytest.mark.parametrize(("error", "batch"), REFUSED_BATCHES.values(), ids=REFUSED_BATCHES.keys())
def test_start_many__refused_inside_an_outer_transaction_writes_nothing_and_it_carries_on(
    other_connection, error, batch
):
    """Invariant 9: the refusal rolls back only the batch (a savepoint); the caller's own
    rows and a later start commit, and only that later start wakes a worker."""
    _existing_jobs()
    other_connection.execute(f"LISTEN {CHANNEL}")
    before = job_count(other_connection)

    with transaction.atomic():
        Report.objects.create(name="before the batch")
        with pytest.raises(error):
            durable.start_many(batch, scope=("default", "org-a"))
        Report.objects.create(name="after the refusal")
        later = durable.start(KIND, scope=("default", "org-a"))

    assert job_count(other_connection) == before + 1
    assert (
        other_connection.execute(
            "SELECT count(*) FROM durable_jobs_job WHERE id = %s", [later.id]
        ).fetchone()[0]
        == 1
    )
    assert Report.objects.count() == 2
    assert _wakeups(other_connection) == ["default"], "the refused batch's queue was never woken"


# ---------------------------------------------------------------------------------------
# 2. Races with another start
# ---------------------------------------------------------------------------------------


def _hold_a_start_open(
    holding: threading.Event, release: threading.Event, winner: dict, **start_kwargs
):
    def first() -> None:
        with transaction.atomic():
            winner["job"] = durable.start(KIND, **start_kwargs)
            holding.set()
            release.wait(5)

    return in_thread(first)


def test_start_many__racing_a_start_on_an_idempotency_key_returns_the_first_job(other_connection):
    """Invariant 9: the other transaction's row is uncommitted, so our lookup misses it and
    our insert waits at the unique index, then fails there. The batch looks again, finds
    the winner, and answers with it, as ``start()`` does; our transaction carries on."""
    holding, release, winner = threading.Event(), threading.Event(), {}
    thread = _hold_a_start_open(holding, release, winner, idempotency_key="req-1")
    assert holding.wait(5)
    watcher = _release_once_someone_waits_on_a_lock(release)
    try:
        with transaction.atomic():
            ids = durable.start_many(
                [
                    {"kind": KIND, "idempotency_key": "req-1"},
                    {"kind": KIND, "idempotency_key": "req-2"},
                    {"kind": KIND},
                ]
            )
            Report.objects.create(name="still usable")
    finally:
        release.set()
        thread.join(5)
        watcher.join(5)

    assert watcher.saw_a_wait, "the batch's insert should have waited at the unique index"
    assert ids[0] == winner["job"].id
    assert len(set(ids)) == 3
    assert job_count(other_connection) == 3 and Report.objects.count() == 1


def test_start_many__racing_a_start_on_a_lock_key_names_the_holder_and_writes_nothing(
    other_connection,
):
    """Invariant 9: losing the lock-key race at the index refuses the whole batch with a
    ``LockKeyHeld`` naming the winner; the caller's transaction stays usable."""
    holding, release, winner = threading.Event(), threading.Event(), {}
    thread = _hold_a_start_open(holding, release, winner, lock_key="report:1")
    assert holding.wait(5)
    watcher = _release_once_someone_waits_on_a_lock(release)
    try:
        with transaction.atomic():
            with pytest.raises(LockKeyHeld) as caught:
                durable.start_many([{"kind": KIND}, {"kind": KIND, "lock_key": "report:1"}])
            Report.objects.create(name="still usable")
    finally:
        release.set()
        thread.join(5)
        watcher.join(5)

    assert watcher.saw_a_wait
    assert caught.value.holder_id == winner["job"].id
    assert job_count(other_connection) == 1 and Report.objects.count() == 1


def test_start_many__a_retry_racing_its_original_with_a_lock_key_returns_the_first_job(
    other_connection,
):
    """Invariant 9: same idempotency key and lock key as the racing original: the batch
    loses at the lock-key index, yet answers with the original, as ``start()`` does."""
    holding, release, winner = threading.Event(), threading.Event(), {}
    thread = _hold_a_start_open(
        holding, release, winner, idempotency_key="req-1", lock_key="report:1"
    )
    assert holding.wait(5)
    watcher = _release_once_someone_waits_on_a_lock(release)
    try:
        ids = durable.start_many(
            [{"kind": KIND, "idempotency_key": "req-1", "lock_key": "report:1"}]
        )
    finally:
        release.set()
        thread.join(5)
        watcher.join(5)

    assert watcher.saw_a_wait
    assert ids == [winner["job"].id]
    assert job_count(other_connection) == 1


# ---------------------------------------------------------------------------------------
# 3. A bound on the batch
# ---------------------------------------------------------------------------------------

SMALL_BATCHES = {"MAX_BATCH_BYTES": 20_000, "MAX_PAYLOAD_BYTES": 10_000}


def _item(n: int) -> dict:
    return {"kind": QUEUED, "input": {"n": n, "text": "x" * 4_000}}


def test_start_many__a_batch_over_max_batch_bytes_is_refused_before_anything_is_written(
    other_connection,
):
    """Four jobs of ~4 kB fit in 20 kB; a fifth is just over. The refusal names the size
    and the limit, stores nothing, and the caller's transaction carries on."""
    other_connection.execute(f"LISTEN {CHANNEL}")
    with override_settings(DURABLE_JOBS=SMALL_BATCHES), transaction.atomic():
        with pytest.raises(BatchTooLarge) as caught:
            durable.start_many([_item(n) for n in range(5)])
        assert job_count(other_connection) == 0
        landed = durable.start_many([_item(n) for n in range(4)])

    error = caught.value
    assert isinstance(error, ValueError) and error.field == "jobs"
    assert error.limit == 20_000 and 20_000 < error.size < 25_000 and error.count == 5
    assert (
        "20000" in str(error) and "MAX_BATCH_BYTES" in str(error) and str(error.size) in str(error)
    )
    assert job_count(other_connection) == 4 == len(set(landed))
    assert _wakeups(other_connection) == ["reports"]


def test_start_many__an_oversized_batch_is_refused_while_it_is_read():
    """The bound holds memory too: a generator is read only up to the job that crosses
    the limit, so a huge batch is never held whole before being refused."""
    read: list[int] = []

    def many():
        for n in range(50):
            read.append(n)
            yield _item(n)

    with override_settings(DURABLE_JOBS=SMALL_BATCHES), pytest.raises(BatchTooLarge):
        durable.start_many(many())
    assert len(read) == 5
    assert Job.objects.count() == 0


def test_start_many__one_job_is_never_refused_for_the_batch_size():
    """A batch of one is what ``start()`` accepts: only the payload limits apply to it."""
    with override_settings(DURABLE_JOBS={"MAX_BATCH_BYTES": 1_000, "MAX_PAYLOAD_BYTES": 10_000}):
        [job_id] = durable.start_many([_item(0)])
        with pytest.raises(BatchTooLarge):
            durable.start_many([_item(1), _item(2)])
    assert list(Job.objects.values_list("id", flat=True)) == [job_id]
