"""The database seam (``durable_jobs.db``): what it relies on in psycopg and Django still holds.

Each private use in ``db`` is an optimisation with a safe fallback, which is exactly why a
library upgrade could break it silently: the worker would carry on, slower, or (worse) read
timestamps differently. These tests fail loudly instead, naming the library to look at.
"""

from __future__ import annotations

import datetime

import psycopg
import pytest
from django.db import connection

import durable_jobs as durable
from durable_jobs import db, reads
from durable_jobs.states import Scope


@pytest.fixture
def kind(kinds):
    kinds.add("tests.seam")
    return "tests.seam"


def test_psycopg_still_ships_the_c_timestamptz_loader():
    """psycopg[binary] (our dependency) has ``psycopg._cmodule._psycopg.TimestamptzLoader``."""
    assert psycopg.pq.__impl__ in ("c", "binary"), psycopg.pq.__impl__
    assert db.C_TIMESTAMPTZ_LOADER is not None, (
        f"psycopg {psycopg.__version__} no longer has _cmodule._psycopg.TimestamptzLoader: "
        "durable_jobs.db.read_timestamps_in_c falls back to Django's (slower) loader"
    )


def test_django_still_ships_the_server_binding_cursor():
    """Django's PostgreSQL backend still has ``ServerBindingCursor`` and the cursor steps
    ``start_cursor`` repeats."""
    assert db.ServerBindingCursor is not None
    for step in (
        "close_if_health_check_failed",
        "ensure_connection",
        "validate_thread_sharing",
        "make_cursor",
        "make_debug_cursor",
    ):
        assert callable(getattr(connection, step, None)), f"Django lost {step}()"


@pytest.mark.django_db
def test_the_c_loader_reads_the_same_instants_as_djangos(kind):
    """With the C loader, a job read back has the very same aware datetimes (UTC, same
    tzinfo object) as Django's own loader gives for the same row."""
    job = durable.start(kind, run_after=datetime.timedelta(seconds=30))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT created_at, next_run_at FROM durable_jobs_job WHERE id = %s", [job.id]
        )
        django_read = cursor.fetchone()
    with connection.cursor() as cursor:
        db.read_timestamps_in_c(cursor)
        cursor.execute(
            "SELECT created_at, next_run_at FROM durable_jobs_job WHERE id = %s", [job.id]
        )
        c_read = cursor.fetchone()
    assert c_read == django_read
    assert all(value.tzinfo is datetime.timezone.utc for value in c_read)
    listed, _ = reads.list_jobs(Scope(tenant="default", organization=None))
    assert [j.next_run_at for j in listed if j.id == job.id] == [django_read[1]]


@pytest.mark.django_db
def test_start_cursor_binds_server_side_only_where_the_connection_prepares(kind):
    """Django's default connection (no prepare_threshold) gets Django's own cursor; one
    that prepares statements gets a server-binding cursor that Django wraps as usual."""
    connection.ensure_connection()
    raw = connection.connection
    before = raw.prepare_threshold
    try:
        raw.prepare_threshold = None
        with db.start_cursor() as cursor:
            assert not isinstance(cursor.cursor, psycopg.ServerCursor)
            assert type(cursor.cursor) is not db.ServerBindingCursor
        raw.prepare_threshold = 0
        with db.start_cursor() as cursor:
            assert isinstance(cursor.cursor, db.ServerBindingCursor)
            cursor.execute("SELECT %s::int + 1", [41])
            assert cursor.fetchone() == (42,)
    finally:
        raw.prepare_threshold = before


@pytest.mark.django_db(transaction=True)
def test_a_terminated_backend_is_a_connection_loss_and_a_failed_statement_is_not(other_connection):
    """``is_connection_loss`` tells the two apart from the error alone."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    other_connection.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(Exception) as lost:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    assert db.is_connection_loss(lost.value)
    db.reset_connection()
    with pytest.raises(Exception) as failed:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")
    assert not db.is_connection_loss(failed.value)
    assert db.connection_usable()


# --- array literals and compacted statements: what psycopg is given instead -------------

AWKWARD_TEXT = ["plain", 'with "quotes"', "back\\slash", "comma, {brace}", " spaced ", "", "NULL"]


@pytest.mark.django_db
@pytest.mark.parametrize("binding", ["client", "server"])
def test_an_array_literal_reads_back_as_the_values_it_was_built_from(binding):
    """``db.array_literal`` stands in for a list parameter of the claim (``::text[]``): every
    element comes back as it was, quotes, backslashes, braces, blanks, the empty string and
    a string that reads NULL included, with either way of binding parameters."""
    sql = "SELECT %(values)s::text[], %(empty)s::text[], %(none)s::text[] IS NULL"
    params = {"values": db.array_literal(AWKWARD_TEXT), "empty": db.array_literal([]), "none": None}
    connection.ensure_connection()
    raw = connection.connection
    cursor = psycopg.ClientCursor(raw) if binding == "client" else psycopg.Cursor(raw)
    with cursor:
        values, empty, none_is_null = cursor.execute(sql, params).fetchone()
    assert values == AWKWARD_TEXT
    assert empty == []
    assert none_is_null is True
