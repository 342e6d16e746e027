"""Newest-first reads after the newest-first indexes left running rows out (migration 0017).

A claim's version of a row (status ``running``) no longer enters durable_jobs_recent,
_status_recent, _kind_recent, _queue_recent or _tenant_recent. What an operator or a
caller of ``list_jobs`` would notice if a reader forgot: a running job missing from its
place in the list, or a page that reads the whole history. Both are checked here, the
second in pages read (never in time), beside 20,000 finished rows.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext

import durable_jobs as durable
from durable_jobs import reads
from durable_jobs.console import admin as console_admin
from durable_jobs.console import queries
from durable_jobs.models import TABLE, Job, newest_first
from durable_jobs.states import Scope
from tests.factories import JobFactory, running
from tests.integration.support import pages_read

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/durable_jobs/job/"
HISTORY = 20_000


def fill_history(rows: int = HISTORY) -> None:
    """``rows`` finished jobs of kind tests.done, all older than anything a test starts."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (id, tenant_id, kind, status, created_at, updated_at,"
            " queue_name, priority, finished_at)"
            " SELECT gen_random_uuid(), 'default', 'tests.done', 'completed',"
            "        now() - interval '1 day' - n * interval '1 second', now(), 'default', 0,"
            "        now() - interval '1 day' FROM generate_series(1, %s) AS n",
            [rows],
        )
        cursor.execute(f"ANALYZE {TABLE}")


def created_ago(job: Job, seconds: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET created_at = now() - %s * interval '1 second' WHERE id = %s",
            [seconds, job.id],
        )


@pytest.fixture
def timeline() -> list[Job]:
    """Five jobs of kind tests.mixed, a minute apart, newest first; the second and the
    fourth are running (one holds a lease, one waits out a retry with its lease released)."""
    jobs = [
        JobFactory(kind="tests.mixed"),
        running(kind="tests.mixed"),
        JobFactory(kind="tests.mixed", status="completed", next_run_at=None, finished_at=0),
        running(kind="tests.mixed", lease_owner=None, next_run_at=30),
        JobFactory(kind="tests.mixed", status="failed", next_run_at=None, finished_at=0),
    ]
    for minutes, job in enumerate(jobs):
        created_ago(job, 60 * (minutes + 1))
    return jobs


@pytest.fixture
def operator(client) -> User:
    user = User.objects.create_user("op", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(user)
    return user


def ids_in_page_order(client, query: str, wanted: list[Job]) -> list[str]:
    response = client.get(CHANGELIST + query)
    assert response.status_code == 200, response.status_code
    page = response.content.decode()
    shown = [str(job.id) for job in wanted if str(job.id) in page]
    return sorted(shown, key=page.index)


def test_the_console_lists_running_jobs_in_their_place_on_one_page_and_across_pages(
    client, operator, timeline, monkeypatch
):
    expected = [str(job.id) for job in timeline]
    # One page: the whole answer at once.
    assert ids_in_page_order(client, "?kind=tests.mixed", timeline) == expected
    assert ids_in_page_order(client, "", timeline) == expected
    # Sorted by the kind column (one kind here, so newest first within it).
    assert ids_in_page_order(client, "?kind=tests.mixed&o=1", timeline) == expected
    # Pages of two: each running job on the page its age puts it on.
    monkeypatch.setattr(console_admin.JobAdmin, "list_per_page", 2)
    pages = [ids_in_page_order(client, f"?kind=tests.mixed&p={n}", timeline) for n in (1, 2, 3)]
    assert pages == [expected[0:2], expected[2:4], expected[4:5]]
    # Filtered on the running word: only the one holding its lease.
    assert ids_in_page_order(client, "?status=running", timeline) == [expected[1]]


def test_list_jobs_pages_through_running_and_finished_jobs_newest_first(timeline):
    scope = Scope(tenant="default")
    first, total = reads.list_jobs(scope, kind="tests.mixed", page=1, page_size=3)
    second, _ = reads.list_jobs(scope, kind="tests.mixed", page=2, page_size=3)
    assert total == 5
    assert [job.id for job in first + second] == [job.id for job in timeline]
    jobs, total = durable.list_jobs(scope=scope, kind="tests.mixed", status="running")
    assert total == 2 and {job.id for job in jobs} == {timeline[1].id, timeline[3].id}


def test_filter_choices_include_kinds_and_organizations_only_running_jobs_have():
    fill_history()
    running(kind="tests.only-running", organization_id="org-running", tenant_id="t-running")
    assert "tests.only-running" in queries.distinct_values("kind", limit=100)
    assert "t-running" in queries.distinct_values("tenant_id", limit=100)
    assert "org-running" in queries.recent_organizations(sample=10, limit=100)


def test_newest_first_pages_a_values_list_with_running_rows_in_place(timeline):
    """What the bulk action's chunks read (console.bulk; end to end, a running row in a
    bulk cancel is test_console's busy-row test)."""
    rows = list(
        newest_first(Job.objects.filter(kind="tests.mixed").values_list("id", "created_at"), 0, 4)
    )
    assert [row[0] for row in rows] == [job.id for job in timeline[:4]]


def selects_run_by(call) -> list[str]:
    """The SELECT statements ``call`` runs, as sent (parameters bound client-side)."""
    with CaptureQueriesContext(connection) as captured:
        call()
    return [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip().startswith(("(SELECT", "SELECT", "WITH"))
    ]


def test_every_newest_first_read_is_a_short_walk_beside_a_long_history(client, operator, timeline):
    fill_history()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_relation_size('{TABLE}') / current_setting('block_size')::int")
        table_pages = cursor.fetchone()[0]
    # A read of the table reads every page of it; a short walk (the newest fifty rows and
    # the few running ones) a handful. The bound leaves room for the dead index entries
    # earlier tests' rolled-back rows leave behind in a shared test database.
    few_pages = table_pages // 3
    assert table_pages > 600  # about 740 for the history alone: else the bound proves nothing
    scope = Scope(tenant="default")
    reads_ = {
        "the console's first page": lambda: client.get(CHANGELIST),
        "its tenth page": lambda: client.get(CHANGELIST + "?p=10"),
        "a kind's only page": lambda: client.get(CHANGELIST + "?kind=tests.mixed"),
        "a queue's first page": lambda: client.get(CHANGELIST + "?queue=default"),
        "a tenant's first page": lambda: client.get(CHANGELIST + "?tenant=default"),
        "the list sorted by kind": lambda: client.get(CHANGELIST + "?o=1"),
        "list_jobs of a kind": lambda: reads.list_jobs(scope, kind="tests.mixed"),
        "the kinds": lambda: queries.distinct_values("kind", limit=100),
        "the organizations": lambda: queries.recent_organizations(sample=200, limit=100),
    }
    pages = {
        (what, sql): pages_read(sql, None)
        for what, call in reads_.items()
        for sql in selects_run_by(call)
    }
    assert len(pages) >= len(reads_)
    # The console's organization choices read a fixed sample of the newest rows (10,000):
    # bounded by the sample, not by the table. "the organizations" reads a small sample and
    # is held to the bound like the rest.
    slow = [
        (what, n, " ".join(sql[sql.find("WHERE") :].split())[:300])
        for (what, sql), n in pages.items()
        if n >= few_pages
        and not ("DISTINCT organization_id" in sql and what != "the organizations")
    ]
    assert not slow, (table_pages, slow)
    # The deepest page served (a deeper link shows it) is a page, not the rest of the table.
    deepest = client.get(CHANGELIST + "?p=999").content.decode()
    assert len(set(re.findall(CHANGELIST + r"([0-9a-f-]{36})/change/", deepest))) == 50
    # The whole scope's page of list_jobs (its count reads every row of the scope, as a
    # count must): the page itself is a walk of twenty.
    [page_sql] = [sql for sql in selects_run_by(lambda: reads.list_jobs(scope)) if "LIMIT" in sql]
    assert pages_read(page_sql, None) < few_pages
