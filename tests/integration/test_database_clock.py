"""Invariant 2, time is the database's: a worker whose clock is hours off changes nothing.

Python's clocks (``time.time`` and ``django.utils.timezone.now``) are moved hours away
from the database's; the lease predicates still decide by ``clock_timestamp()``, and the
leases written are relative to ``db.database_now()``.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

import durable_jobs as durable
from durable_jobs import store
from tests.factories import JobFactory, reload, running
from tests.integration.support import DEFAULT_SCOPE, SLACK, db_now, delivery_of, lease_of

OFFSETS = [timedelta(hours=5), timedelta(hours=-5)]
IDS = ["worker-clock-ahead", "worker-clock-behind"]


@pytest.fixture(params=OFFSETS, ids=IDS)
def skewed_worker_clock(request, monkeypatch):
    """Move this process's clocks by the offset; return the offset."""
    offset: timedelta = request.param
    real_now, real_time = timezone.now, time.time
    monkeypatch.setattr(timezone, "now", lambda: real_now() + offset)
    monkeypatch.setattr(time, "time", lambda: real_time() + offset.total_seconds())
    assert abs(timezone.now() - db_now() - offset) < timedelta(minutes=1)  # the skew is real
    return offset


@pytest.mark.django_db
def test_claim__decides_lease_expiry_by_the_database_clock(skewed_worker_clock):
    """Invariant 2."""
    live = running(lease_expires_at=60)
    expired = running(lease_expires_at=-1)

    assert store.claim(live.id, DEFAULT_SCOPE, delivery_of(live), "w", 30_000) is None
    before = db_now()
    claimed = store.claim(expired.id, DEFAULT_SCOPE, delivery_of(expired), "w", 30_000)
    assert claimed is not None
    assert (
        before + timedelta(seconds=30)
        <= claimed.lease_expires_at
        <= db_now() + timedelta(seconds=30)
    )


@pytest.mark.django_db
def test_heartbeat__writes_a_lease_relative_to_the_database_clock(skewed_worker_clock):
    """Invariant 2."""
    job = running(lease_expires_at=1)
    before = db_now()

    assert store.heartbeat(lease_of(job, ttl_ms=20_000)) is False

    row = reload(job)
    assert (
        before + timedelta(seconds=20) <= row.lease_expires_at <= db_now() + timedelta(seconds=20)
    )
    assert before <= row.heartbeat_at <= db_now()


@pytest.mark.django_db
def test_take_orphan__decides_by_the_database_clock(skewed_worker_clock):
    """Invariant 2."""
    live = running(lease_expires_at=60)
    dead = running(lease_expires_at=-60)

    assert store.take_orphan(live.id, grace_ms=10_000, backoff_ms=0) is None
    assert store.take_orphan(dead.id, grace_ms=10_000, backoff_ms=0) is not None


@pytest.mark.django_db
def test_dequeue_and_fail_slice__schedule_on_the_database_clock(skewed_worker_clock):
    """Invariant 2."""
    due = JobFactory(next_run_at=-1)
    JobFactory(next_run_at=3600)  # an hour ahead on the database clock

    [claimed] = store.dequeue(["default"], "host", 30_000, kinds=None, limit=10)
    assert claimed.id == due.id

    before = db_now()
    store.fail_slice(
        lease_of(claimed),
        error_class="transient",
        code="x",
        message=None,
        max_failures=5,
        backoff_base_ms=10_000,
        backoff_max_ms=10_000,
    )
    assert (
        before + timedelta(seconds=5) <= reload(due).next_run_at <= db_now() + timedelta(seconds=10)
    )


@pytest.mark.django_db
def test_start__schedules_run_after_on_the_database_clock(skewed_worker_clock, kinds):
    """Invariant 2."""
    kinds.add("tests.clock")
    before = db_now()
    job = durable.start("tests.clock", run_after=timedelta(minutes=10))
    assert (
        before + timedelta(minutes=10) - SLACK
        <= job.next_run_at
        <= db_now() + timedelta(minutes=10)
    )
    assert store.dequeue(["default"], "host", 30_000, kinds=None) == []
