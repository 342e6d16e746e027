"""Failure paths a review found unguarded: mirrors failing in the reconciler, a mirror's
own database error, handlers that exit, bad handler policy."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection

import durable_jobs as durable
from durable_jobs import testing
from durable_jobs.exceptions import ConfigurationError
from durable_jobs.runtime.reconciler import Reconciler
from tests.factories import JobFactory, reload, running

pytestmark = pytest.mark.django_db


def test_a_mirror_raising_a_database_error_never_blocks_the_reconciler(kinds):
    def mirror(job, outcome):
        raise IntegrityError("duplicate key in the domain table")

    kinds.add("tests.bad_mirror", mirror=mirror, max_mirror_attempts=2)
    kinds.add("tests.good")
    bad = JobFactory(kind="tests.bad_mirror", cancel_requested_at=-10)
    good = JobFactory(kind="tests.good", cancel_requested_at=-5)
    orphan = running(kind="tests.good", lease_expires_at=-60)
    Reconciler().run_pass()
    assert reload(good).status == "cancelled", "the neighbour was not blocked"
    assert reload(orphan).status == "pending", "the later steps still ran"
    assert reload(bad).mirror_attempts == 1 and reload(bad).status == "pending"
    Reconciler().run_pass()
    parked = reload(bad)
    assert (parked.status, parked.error_code, parked.mirror_attempts) == (
        "failed",
        "mirror_failed",
        2,
    )


def test_a_mirror_s_statement_timeout_counts_against_the_mirror_not_the_work(kinds):
    def mirror(job, outcome):
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '1ms'")
            cursor.execute("SELECT pg_sleep(0.2)")

    kinds.add("tests.slow_mirror", lambda job: durable.DONE, mirror=mirror, max_mirror_attempts=3)
    job = durable.start("tests.slow_mirror")
    assert [r.outcome for r in testing.run_jobs()] == ["mirror_retry"]
    after = reload(job)
    assert (
        after.mirror_attempts == 1 and after.lease_owner is None and after.consecutive_failures == 0
    )


def test_a_handler_calling_sys_exit_fails_its_slice_and_the_slot_lives(kinds):
    def handler(job):
        raise SystemExit(3)

    kinds.add("tests.exits", handler)
    job = durable.start("tests.exits")
    assert [r.outcome for r in testing.run_jobs()] == ["retrying"]
    assert reload(job).error_code == "SystemExit"


def test_handler_policy_is_validated_and_timedeltas_accepted(kinds):
    handler = kinds.add(
        "tests.policy", slice_budget=timedelta(minutes=5), lease_ttl=timedelta(seconds=90)
    )
    assert handler.setting("SLICE_BUDGET") == 300.0 and handler.setting("LEASE_TTL") == 90.0
    for bad in (
        {"slice_budget": -1},
        {"max_consecutive_failures": "5"},
        {"lease_ttl": float("nan")},
        {"mirror": "not callable"},
        {"classify": 3},
        {"queue": "bad queue"},
    ):
        with pytest.raises(ConfigurationError):
            kinds.add("tests.policy_bad", **bad)


def test_start_many_repeating_a_key_with_another_kind_is_a_conflict():
    with pytest.raises(durable.IdempotencyConflict):
        durable.start_many(
            [
                {"kind": "demo.flaky", "idempotency_key": "k"},
                {"kind": "demo.noop", "idempotency_key": "k"},
            ]
        )


def test_an_aware_run_after_beyond_ten_years_is_refused():
    from datetime import datetime, timezone

    with pytest.raises(durable.InvalidInput, match="run_after"):
        durable.start("demo.flaky", run_after=datetime(9999, 1, 1, tzinfo=timezone.utc))
