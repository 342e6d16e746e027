"""``durable_jobs stats`` and the scrape on a large table: live rows counted exactly through
partial indexes, finished rows estimated from ANALYZE's joint (kind, status) statistics."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

from durable_jobs.console import queries, stats
from tests.factories import JobFactory, live_worker, running

pytestmark = pytest.mark.django_db


def fill_finished(kind: str, status: str, n: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO durable_jobs_job (id, tenant_id, kind, status, queue_name, created_at,"
            " updated_at, finished_at)"
            " SELECT gen_random_uuid(), 'default', %s, %s, 'default', now(), now(), now()"
            " FROM generate_series(1, %s)",
            [kind, status, n],
        )


def test_a_large_table_counts_live_jobs_exactly_and_estimates_finished_ones(monkeypatch):
    fill_finished("tests.a", "completed", 600)
    fill_finished("tests.b", "cancelled", 200)
    JobFactory(kind="tests.a")
    JobFactory(kind="tests.a", pending_since=-60)
    running(kind="tests.b", lease_expires_at=-30)
    JobFactory(
        kind="tests.b",
        status="failed",
        parked_at=-1,
        finished_at=-1,
        error_code="poison",
        pending_since=None,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_jobs_job")
    monkeypatch.setattr(stats, "EXACT_BELOW", 100)  # "large" from 100 rows on
    data = stats.collect()
    assert data["estimated"] is True
    assert data["by_kind"]["tests.a"]["pending"] == 2 and data["by_kind"]["tests.b"]["running"] == 1
    assert data["pending"] == 2 and data["running"] == 1 and data["running_expired_leases"] == 1
    assert data["parked_by_reason"] == {"poison": 1}
    # ANALYZE read every row of this small table: its frequencies are the true shares.
    assert data["by_kind"]["tests.a"]["completed"] == pytest.approx(600, abs=6)
    assert data["by_kind"]["tests.b"]["cancelled"] == pytest.approx(200, abs=6)
    out = io.StringIO()
    call_command("durable_jobs", "stats", "--all-tenants", stdout=out)
    assert "planner's estimates" in out.getvalue()


def test_a_scoped_count_on_a_large_table_estimates_finished_jobs_per_status(monkeypatch):
    fill_finished("tests.a", "completed", 300)
    JobFactory(kind="tests.a", tenant_id="acme")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_jobs_job")
    monkeypatch.setattr(stats, "EXACT_BELOW", 100)
    data = stats.collect(tenant="acme")
    assert data["by_kind"]["tests.a"] == {"pending": 1}
    assert data["pending"] == 1
    assert set(data["by_kind"].get("*", {})) <= {"completed", "failed", "cancelled"}


def test_a_small_table_is_counted_exactly():
    fill_finished("tests.a", "completed", 5)
    data = stats.collect()
    assert data["estimated"] is False and data["by_kind"] == {"tests.a": {"completed": 5}}


def test_the_backlog_figures_and_throughput_windows_come_from_one_statement(
    django_assert_max_num_queries,
):
    JobFactory(kind="tests.a", status="completed", finished_at=-30, pending_since=None)
    JobFactory(kind="tests.a", status="cancelled", finished_at=-180, pending_since=None)
    JobFactory(
        kind="tests.a", status="completed", finished_at=-1200, pending_since=None
    )  # before every window
    JobFactory(
        kind="tests.a",
        status="failed",
        parked_at=-10,
        finished_at=-10,
        error_code="poison",
        pending_since=None,
    )
    running(kind="tests.a", lease_owner=None, lease_expires_at=None, next_run_at=30)  # retrying
    JobFactory(kind="tests.a", held_since=-60, next_run_at=60)
    JobFactory(
        kind="tests.a", tenant_id="other", status="completed", finished_at=-30, pending_since=None
    )
    # 7: the five reads of the job table plus one of the paused queues (invariant 27; a
    # table with one row per paused queue) and one of the flow keys (invariant 26; a table
    # with one row per key).
    with django_assert_max_num_queries(7):
        data = stats.collect(tenant="default")
    assert data["finished_last"] == {
        "1m": {"completed": 1, "failed": 1, "cancelled": 0},
        "5m": {"completed": 1, "failed": 1, "cancelled": 1},
        "15m": {"completed": 1, "failed": 1, "cancelled": 1},
    }
    assert data["retrying"] == 1 and data["held"] == 1 and data["running_expired_leases"] == 0
    # The retrying row holds no lease: it is waiting, not running (monitors must not count it).
    assert data["pending"] == 1 and data["running"] == 0 and data["waiting"] == 1
    assert (
        data["by_kind"]["tests.a"]["waiting"] == 1 and "running" not in data["by_kind"]["tests.a"]
    )
    assert stats.collect()["finished_last"]["1m"]["completed"] == 2
    assert data["finished_last_estimated"] == []


def test_a_busy_window_is_the_newest_rows_rate_not_a_read_of_every_row(monkeypatch):
    """At thousands of jobs a second a 15-minute window is millions of rows: read a sample.

    600 jobs finished over the last two minutes, one every 200 ms. Sampled 200 at a time,
    the sample spans the last 40 seconds, so every window reaches past it: each is the
    sample's rate carried over the window, and flagged. With a sample that holds every
    row, the windows are exact counts again.
    """

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO durable_jobs_job (id, tenant_id, kind, status, queue_name, created_at,"
            " updated_at, finished_at)"
            " SELECT gen_random_uuid(), 'default', 'tests.a', 'completed', 'default', now(), now(),"
            " statement_timestamp() - i * interval '200 milliseconds'"
            " FROM generate_series(1, 600) AS i"
        )
    monkeypatch.setattr(queries, "FINISHED_SAMPLE", 200)

    data = stats.collect()

    assert data["finished_last_estimated"] == ["1m", "5m", "15m"]
    # 200 rows in 40 s is 5 a second: about 300 a minute (the clock moves a little between
    # the insert and the read, so allow a few percent).
    assert 285 <= data["finished_last"]["1m"]["completed"] <= 315, data["finished_last"]
    assert 1425 <= data["finished_last"]["5m"]["completed"] <= 1575, data["finished_last"]

    monkeypatch.setattr(queries, "FINISHED_SAMPLE", 1000)  # now the sample holds every row
    data = stats.collect()
    assert data["finished_last_estimated"] == []
    assert data["finished_last"]["1m"]["completed"] in (
        299,
        300,
    )  # the clock moved a few ms since the insert
    assert data["finished_last"]["15m"]["completed"] == 600


@pytest.mark.django_db
def test_a_claim_handed_back_or_retrying_is_waiting_and_kinds_no_live_worker_runs_are_named():
    """A running row without a lease (handed back unstarted, or a failed slice in its
    backoff) is waiting in the counts; a kind with live jobs that no live worker can run
    is named with how many wait for it (invariant 14b)."""

    running(kind="tests.a")  # a live lease: running
    running(kind="tests.a", lease_owner=None, lease_expires_at=None, next_run_at=-1)  # handed back
    JobFactory(kind="tests.new")
    live_worker(kinds=("tests.a",))
    data = stats.collect()
    assert data["by_kind"] == {"tests.a": {"running": 1, "waiting": 1}, "tests.new": {"pending": 1}}
    assert (data["running"], data["waiting"], data["pending"]) == (1, 1, 1)
    assert data["unserved_kinds"] == {"tests.new": 1}
