"""Heartbeat and checkpoint: progress, the cancel flag, forgiveness (invariant 7), lease
arithmetic on ``clock_timestamp()`` (invariant 2) and the HOT update (invariant 12)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, transaction

from durable_jobs import store
from durable_jobs.states import Delivery, Scope
from tests.factories import reload, running
from tests.integration.support import (  # noqa: F401  (other_connection: fixture override)
    db_now,
    lease_of,
    other_connection_fixture,
)

# ---------------------------------------------------------------------------------------
# heartbeat
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_heartbeat__extends_the_lease_from_the_database_clock():
    """Invariants 2 and 4: the holder's heartbeat extends the lease by the TTL on the database
    clock."""
    job = running(lease_expires_at=1, heartbeat_at=-30)
    before = db_now()

    assert store.heartbeat(lease_of(job, ttl_ms=45_000)) is False

    row = reload(job)
    assert (
        before + timedelta(seconds=45) <= row.lease_expires_at <= db_now() + timedelta(seconds=45)
    )
    assert row.heartbeat_at >= before


@pytest.mark.django_db
def test_heartbeat__records_processed_and_leaves_it_when_omitted():
    """Invariant 12: progress rides on the heartbeat; an omitted count is no change."""
    job = running(processed_count=3)
    store.heartbeat(lease_of(job), processed=11)
    assert reload(job).processed_count == 11
    store.heartbeat(lease_of(job))
    assert reload(job).processed_count == 11


@pytest.mark.django_db
def test_heartbeat__total_none_clears_the_total_and_omitting_it_keeps_it():
    """Invariant 12: ``total=None`` is a value ("unknown"); an omitted total is no change."""
    job = running(total_count=100)

    store.heartbeat(lease_of(job), processed=1)
    assert reload(job).total_count == 100
    store.heartbeat(lease_of(job), total=250)
    assert reload(job).total_count == 250
    store.heartbeat(lease_of(job), total=None)
    assert reload(job).total_count is None


@pytest.mark.django_db
def test_heartbeat__committed_resets_the_suspicion_budgets():
    """Invariant 7: a committed unit resets consecutive_failures and redrives_since_commit."""
    job = running(consecutive_failures=3, redrives_since_commit=2, last_committed_at=None)

    store.heartbeat(lease_of(job))
    row = reload(job)
    assert (row.consecutive_failures, row.redrives_since_commit, row.last_committed_at) == (
        3,
        2,
        None,
    )

    store.heartbeat(lease_of(job), committed=True)
    row = reload(job)
    assert (row.consecutive_failures, row.redrives_since_commit) == (0, 0)
    assert row.last_committed_at is not None


@pytest.mark.django_db
def test_heartbeat__returns_true_once_cancel_was_requested():
    """Invariant 8: a running slice observes the request at its next heartbeat."""
    job = running()
    assert store.heartbeat(lease_of(job)) is False
    assert store.request_cancel(job.id, Scope(tenant=job.tenant_id), by="ops") is not None
    assert store.heartbeat(lease_of(job)) is True
    assert reload(job).status == "running"  # the request wrote no status


@pytest.mark.django_db(transaction=True)
def test_heartbeat__lock_timeout_bounds_the_wait_behind_a_fenced_transaction(other_connection):
    """Invariant 5: while another transaction holds the row (a fenced domain write), a
    heartbeat with ``lock_timeout_ms`` raises after the timeout rather than blocking."""
    job = running()
    with other_connection.transaction():
        other_connection.execute(
            "SELECT 1 FROM durable_jobs_job WHERE id = %s FOR UPDATE", [job.id]
        )
        started = time.monotonic()
        with pytest.raises(OperationalError):
            store.heartbeat(lease_of(job), lock_timeout_ms=150)
        assert time.monotonic() - started < 2.0
    assert store.heartbeat(lease_of(job), lock_timeout_ms=150) is False


# ---------------------------------------------------------------------------------------
# write_checkpoint
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_write_checkpoint__stores_the_checkpoint_and_forgives():
    """Invariant 7: a checkpoint is a committed unit."""
    job = running(consecutive_failures=2, redrives_since_commit=4, processed_count=1, total_count=9)
    before = db_now()

    assert (
        store.write_checkpoint(
            lease_of(job, ttl_ms=20_000), {"cursor": 42, "ünï": "cödé"}, processed=5
        )
        is True
    )

    row = reload(job)
    assert row.checkpoint == {"cursor": 42, "ünï": "cödé"}
    assert (row.processed_count, row.total_count) == (5, 9)
    assert (row.consecutive_failures, row.redrives_since_commit) == (0, 0)
    assert row.last_committed_at >= before
    assert row.lease_expires_at >= before + timedelta(seconds=20)


@pytest.mark.django_db
def test_write_checkpoint__total_none_clears_the_total():
    """Invariant 7: the checkpoint carries progress like the heartbeat (``None`` clears, omitted
    keeps)."""
    job = running(total_count=9)
    store.write_checkpoint(lease_of(job), {"c": 1})
    assert reload(job).total_count == 9
    store.write_checkpoint(lease_of(job), {"c": 2}, total=None)
    assert reload(job).total_count is None


# ---------------------------------------------------------------------------------------
# Invariant 2: a lease extended at the end of a long transaction is not born expired
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("extend", ["heartbeat", "write_checkpoint", "claim"])
def test_lease_extension__is_computed_from_clock_timestamp_not_the_transaction_start(extend):
    """Invariant 2: ``now()`` is the transaction's start. A lease of 300 ms written 400 ms
    into a transaction from ``now()`` would already be expired; from
    ``clock_timestamp()`` it is still live."""
    job = running(lease_expires_at=-1) if extend == "claim" else running()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT now(), pg_sleep(0.4)")
            tx_start = cursor.fetchone()[0]
        if extend == "heartbeat":
            assert store.heartbeat(lease_of(job, ttl_ms=300)) is False
        elif extend == "write_checkpoint":
            assert store.write_checkpoint(lease_of(job, ttl_ms=300), {"c": 1}) is True
        else:
            scope = Scope(tenant=job.tenant_id)
            delivery = Delivery(seq=job.continuation_seq, redrives=job.redrives)
            assert store.claim(job.id, scope, delivery, "worker-b", 300) is not None
        row = reload(job)
        assert row.lease_expires_at > tx_start + timedelta(milliseconds=300) + timedelta(
            milliseconds=300
        )
        assert row.lease_expires_at > db_now()


# ---------------------------------------------------------------------------------------
# Invariant 12: the heartbeat is a HOT update
# ---------------------------------------------------------------------------------------


def _flush_stats_of_this_backend() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")


def _update_counts(conn, *, at_least_updates: int | None = None, baseline=None) -> tuple[int, int]:
    """``(n_tup_upd, n_tup_hot_upd)`` of the job table, waiting for the lazy flush."""
    deadline = time.monotonic() + 5
    while True:
        upd, hot = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relname = 'durable_jobs_job'"
        ).fetchone()
        if (
            at_least_updates is None
            or upd - baseline[0] >= at_least_updates
            or time.monotonic() > deadline
        ):
            return upd, hot
        _flush_stats_of_this_backend()
        time.sleep(0.05)


@pytest.mark.django_db(transaction=True)
def test_heartbeat__is_a_hot_update(other_connection):
    """Invariant 12: the heartbeat touches no indexed column (nor one in an index's
    predicate), so PostgreSQL updates the row in place without touching any index.

    A control update of an indexed column (``next_run_at``) through the same measurement
    shows it would notice a non-HOT heartbeat."""
    if connection.pg_version < 150000:
        pytest.skip("pg_stat_force_next_flush() needs PostgreSQL 15")
    beats = 60
    job = running()
    lease = lease_of(job)
    _flush_stats_of_this_backend()
    base = _update_counts(other_connection)

    for i in range(beats):
        assert store.heartbeat(lease, processed=i, total=beats, committed=(i % 2 == 0)) is False
    _flush_stats_of_this_backend()
    after_beats = _update_counts(other_connection, at_least_updates=beats, baseline=base)

    upd, hot = after_beats[0] - base[0], after_beats[1] - base[1]
    assert upd >= beats
    assert hot >= 0.9 * upd, f"only {hot} of {upd} heartbeat updates were HOT"

    controls = 10
    for _ in range(controls):
        _touch_indexed_column(job.id)
    _flush_stats_of_this_backend()
    after_control = _update_counts(
        other_connection, at_least_updates=controls, baseline=after_beats
    )
    assert after_control[0] - after_beats[0] >= controls
    assert after_control[1] - after_beats[1] == 0, (
        "the control update of an indexed column counted as HOT"
    )


def _touch_indexed_column(job_id) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE durable_jobs_job SET next_run_at = clock_timestamp() WHERE id = %s", [job_id]
        )
