"""The backlog figures the console, `durable_jobs stats` and the gauges show: counted off the
two deliverable indexes (rows with and without a flow key), so they follow the live backlog
and never the finished history, and count a keyed row as surely as an unkeyed one."""

from __future__ import annotations

import pytest
from django.db import connection

from durable_jobs.console import queries
from tests.factories import JobFactory
from tests.integration.support import pages_read

pytestmark = pytest.mark.django_db


def fill_history(rows: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {queries.TABLE} (id, tenant_id, kind, status, created_at, updated_at,"
            " queue_name, priority, finished_at)"
            " SELECT gen_random_uuid(), 'default', 'test.done', 'completed', now(), now(),"
            "        'default', 0, now() - interval '1 day' FROM generate_series(1, %s)",
            [rows],
        )
        cursor.execute(f"ANALYZE {queries.TABLE}")


def waiting_jobs() -> None:
    JobFactory(queue_name="default", next_run_at=-1)  # due
    JobFactory(queue_name="default", next_run_at=3600)  # scheduled for later
    JobFactory(queue_name="default", next_run_at=-1, flow_key="tenant:a")  # keyed, due
    JobFactory(queue_name="mail", next_run_at=3600, flow_key="tenant:b")  # keyed, later
    # a failed slice waiting for its retry: running, lease released
    JobFactory(queue_name="mail", status="running", lease_owner=None, next_run_at=-1)
    JobFactory(queue_name="mail", status="running", lease_owner=None, next_run_at=-1, flow_key="k")


def test_queue_backlogs_count_keyed_and_unkeyed_rows_alike():
    waiting_jobs()
    JobFactory(queue_name="default", status="completed", next_run_at=None)  # history
    assert queries.queue_backlogs() == {"default": (3, 2), "mail": (3, 2)}


def test_the_retrying_figure_counts_released_leases_with_and_without_a_key():
    waiting_jobs()
    figures = queries.stats_figures([1])
    assert figures["retrying"] == 2


def test_backlog_reads_follow_the_backlog_not_the_history():
    """20,000 finished rows beside six waiting ones: both reads stay a few pages."""
    fill_history(20_000)
    waiting_jobs()
    assert queries.queue_backlogs() == {"default": (3, 2), "mail": (3, 2)}
    assert pages_read(queries.QUEUE_BACKLOGS, {}) < 50
