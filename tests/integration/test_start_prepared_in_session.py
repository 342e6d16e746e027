"""``start()`` in autocommit on a connection that prepares nothing itself (Django's
default) prepares its insert in the server session, by a name its text decides, from the
connection's third start on (``db.SessionStatement``): what a DBA sees in
``pg_prepared_statements``, and what happens when the session loses it."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import durable_jobs as durable
from durable_jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def _session_starts() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name FROM pg_prepared_statements WHERE name LIKE 'durable_jobs_start_%%'"
        )
        return [name for (name,) in cursor.fetchall()]


def _fresh_connection() -> None:
    connection.close()
    connection.ensure_connection()


def _fresh_connection_that_prepared_it() -> None:
    _fresh_connection()
    for _ in range(3):
        durable.start("demo.noop")
    assert len(_session_starts()) == 1, "prepared at the third start"


def test_a_connection_that_starts_many_jobs_prepares_the_insert_once():
    _fresh_connection()
    first_two = [durable.start("demo.noop", input={"n": n}) for n in range(2)]
    assert _session_starts() == [], "a connection that starts one or two jobs prepares nothing"
    rest = [
        durable.start("demo.noop", input={"n": n}, priority=n, run_after=60 * n)
        for n in range(2, 8)
    ]
    assert len(_session_starts()) == 1, "prepared once, then executed"
    for started in first_two + rest:
        row = Job.objects.get(id=started.id)
        # What the prepared statement wrote and returned is what start() promised.
        assert (row.status, row.input, row.priority) == ("pending", started.input, started.priority)
        assert row.next_run_at == started.next_run_at and row.created_at == started.created_at
    assert rest[-1].next_run_at > rest[0].next_run_at, "run_after reached the row"


def test_a_start_in_atomic_runs_the_plain_statement_and_rolls_back_with_the_caller():
    _fresh_connection_that_prepared_it()
    prepared = _session_starts()
    with pytest.raises(RuntimeError), transaction.atomic():
        undone = durable.start("demo.noop")
        raise RuntimeError("the caller's transaction fails")
    assert not Job.objects.filter(id=undone.id).exists(), "rolled back with the caller"
    with transaction.atomic():
        kept = durable.start("demo.noop")
    assert Job.objects.filter(id=kept.id).exists()
    assert _session_starts() == prepared


def test_a_session_that_lost_the_statement_goes_on_starting_jobs():
    """``DISCARD ALL`` (what a session-mode pooler runs between clients) drops it: the
    next start falls back to the plain statement, and the connection prepares nothing
    more (the server session changed under it once; a transaction-mode pooler does so
    at every statement)."""
    _fresh_connection_that_prepared_it()
    with connection.cursor() as cursor:
        cursor.execute("DISCARD ALL")
    after = [durable.start("demo.noop", input={"n": n}) for n in range(5)]
    assert Job.objects.filter(id__in=[job.id for job in after]).count() == 5
    assert _session_starts() == [], "given up on this connection"
    _fresh_connection_that_prepared_it()  # a new connection prepares it again


def test_a_session_holding_the_name_already_is_used_as_it_is():
    """Behind a pooler another client may have prepared it in the server session this
    connection is handed: the same text under the same name, so the start uses it."""
    _fresh_connection_that_prepared_it()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, statement FROM pg_prepared_statements "
            "WHERE name LIKE 'durable_jobs_start_%%'"
        )
        [(name, prepare)] = cursor.fetchall()
    _fresh_connection()
    with connection.cursor() as cursor:
        cursor.execute(prepare)  # as another client of a pooler would have
    started = [durable.start("demo.noop", input={"n": n}) for n in range(4)]
    assert Job.objects.filter(id__in=[job.id for job in started]).count() == 4
    assert _session_starts() == [name]


def test_a_migration_that_changes_a_returned_column_does_not_fail_the_next_start():
    """A deploy migrates while a web process keeps its connection: PostgreSQL refuses to
    run the prepared insert once a column it returns changed type ("cached plan must not
    change result type"). The start runs the plain statement instead."""
    _fresh_connection_that_prepared_it()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE durable_jobs_job ALTER COLUMN total_count TYPE numeric")
    try:
        started = durable.start("demo.noop", total_count=7)
        assert Job.objects.get(id=started.id).total_count == 7
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE durable_jobs_job ALTER COLUMN total_count TYPE bigint")


def test_django_s_query_log_and_execute_wrappers_still_see_every_prepared_start():
    """The prepared start runs on a driver cursor kept for the connection's life, still
    wrapped by Django's cursor: ``assertNumQueries``, ``connection.queries`` and the
    execute wrappers that tracing tools install see each start's statement."""
    _fresh_connection_that_prepared_it()
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper), CaptureQueriesContext(connection) as logged:
        started = [durable.start("demo.noop", input={"n": n}) for n in range(3)]
    assert [sql.split(" (")[0] for sql in seen] == [f"EXECUTE {_session_starts()[0]}"] * 3
    assert len(logged.captured_queries) == 3
    assert all(query["sql"].startswith("EXECUTE durable_jobs_start_") for query in logged)
    assert Job.objects.filter(id__in=[job.id for job in started]).count() == 3
