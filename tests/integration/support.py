"""Small helpers shared by the integration tests (leases, deliveries, row snapshots, the
pages a statement reads, a pinned horizon).

Rows are built with ``tests.factories``; these helpers only name the lease or delivery a
row carries, so a test can write ``lease_of(job, epoch=job.lease_epoch - 1)`` and read
like the fence it pins.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from durable_jobs import db, store
from durable_jobs.models import Job
from durable_jobs.states import Delivery, Lease, Scope
from tests.factories import reload

DEFAULT_SCOPE = Scope(tenant="default")
TTL_MS = 60_000
#: Tolerance for comparing a stamp written by one statement with clocks read around it.
SLACK = timedelta(milliseconds=500)

FAIL_DEFAULTS = dict(
    error_class="transient",
    code="boom",
    message="it broke",
    max_failures=5,
    backoff_base_ms=1_000,
    backoff_max_ms=60_000,
)


def lease_of(
    job: Job, *, owner: str | None = None, epoch: int | None = None, ttl_ms: int = TTL_MS
) -> Lease:
    """The lease ``job`` carries now, or a forged one (another owner, an older epoch)."""
    return Lease(
        job_id=job.id,
        owner=job.lease_owner if owner is None else owner,
        epoch=job.lease_epoch if epoch is None else epoch,
        ttl_ms=ttl_ms,
    )


def delivery_of(job: Job) -> Delivery:
    return Delivery(seq=job.continuation_seq, redrives=job.redrives)


def db_now() -> datetime:
    return db.database_now()


def snapshot(job: Job | Any) -> dict[str, Any]:
    """Every column of the row as it is in the database now."""
    row = reload(job)
    return {f.attname: getattr(row, f.attname) for f in Job._meta.concrete_fields}


def claim(job: Job, owner: str = "worker-b", *, ttl_ms: int = TTL_MS, scope: Scope = DEFAULT_SCOPE):
    """Claim ``job`` with the delivery it carries now; return ``(row, lease)`` or ``(None, None)``.
    Claim ``job`` with the delivery it carries now; return ``(row, lease)`` or ``(None, None)``."""
    claimed = store.claim(job.id, scope, delivery_of(reload(job)), owner, ttl_ms)
    if claimed is None:
        return None, None
    return claimed, lease_of(claimed, ttl_ms=ttl_ms)


def fail(lease: Lease, **overrides: Any):
    return store.fail_slice(lease, **{**FAIL_DEFAULTS, **overrides})


def connect_to_test_database(**kwargs: Any) -> psycopg.Connection:
    """A new psycopg connection to the database Django's connection uses.

    Reads the host from ``OPTIONS['host']`` too: the embedded server is reached through a
    socket directory given there, which ``tests.conftest.database_url`` does not read
    (it falls back to the default socket and finds no test database).
    """
    s = connection.settings_dict
    options = s.get("OPTIONS") or {}
    params: dict[str, Any] = {"dbname": s["NAME"], "user": s.get("USER") or "postgres"}
    if s.get("PASSWORD"):
        params["password"] = s["PASSWORD"]
    host = s.get("HOST") or options.get("host")
    port = s.get("PORT") or options.get("port")
    if host:
        params["host"] = host
    if port:
        params["port"] = str(port)
    return psycopg.connect(**params, **kwargs)


@pytest.fixture(name="other_connection")
def other_connection_fixture(transactional_db):
    """A second, autocommit connection (overrides the conftest one; see above)."""
    conn = connect_to_test_database(autocommit=True)
    yield conn
    conn.close()


@pytest.fixture(name="prepare_threshold")
def prepare_threshold_fixture():
    """Set the connection's ``prepare_threshold`` (what ``OPTIONS["prepare_threshold"]``
    sets) for one test, and put Django's default back."""
    connection.ensure_connection()
    raw = connection.connection
    before = raw.prepare_threshold

    def set_to(value):
        raw.prepare_threshold = value

    yield set_to
    raw.prepare_threshold = before


def prepared_statements(like: str) -> int:
    """How many statements this connection has prepared whose text matches ``like``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", [like]
        )
        return cursor.fetchone()[0]


def job_count(conn) -> int:
    """How many job rows another connection sees (committed rows only)."""
    return conn.execute("SELECT count(*) FROM durable_jobs_job").fetchone()[0]


def in_thread(target) -> threading.Thread:
    """Run ``target`` on a thread with its own Django connection (its own transaction),
    closed at the end."""

    def run() -> None:
        try:
            target()
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_until(check, message: str, timeout: float = 10.0) -> None:
    """Poll ``check`` until it is true; fail naming ``message`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {message}")


def parent_with_live_children(
    kinds: Any, count: int = 3, *, queue: str = "default", **start: Any
) -> tuple[Job, list[Job]]:
    """A parent held waiting for ``count`` children, each held waiting for the grandchild it
    spawned, which is pending: a live tree two levels deep, its kinds served from ``queue``.
    Returns (parent, children)."""
    from durable_jobs import service, testing

    def parent(job):
        with job.fenced():
            job.spawn_many([{"kind": "tests.tree.child", "key": f"c{i}"} for i in range(count)])
        return job.wait_for_children()

    def child(job):
        with job.fenced():
            job.spawn("tests.tree.grandchild", key="g")
        return job.wait_for_children()

    kinds.add("tests.tree.parent", parent, queue=queue)
    kinds.add("tests.tree.child", child, queue=queue)
    kinds.add("tests.tree.grandchild", queue=queue)
    job = service.start("tests.tree.parent", **start)
    testing.run_jobs(queues=[queue], max_slices=1 + count)
    children = list(Job.objects.filter(parent_id=job.id).order_by("spawn_key"))
    assert [(c.status, c.children_total) for c in children] == [("pending", 1)] * count
    return reload(job), children


def pages_read(sql: str, params: dict[str, Any]) -> int:
    """Pages ``sql`` reads now: EXPLAIN (ANALYZE, BUFFERS) in a transaction rolled back.
    Tests count a statement's cost in pages, never in time."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    if isinstance(plan, str):
        plan = json.loads(plan)
    return plan[0]["Plan"]["Shared Hit Blocks"] + plan[0]["Plan"]["Shared Read Blocks"]


def insert_jobs_due_an_hour_ago(count: int) -> None:
    """``count`` pending jobs in the default queue, due an hour ago, a millisecond apart."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {store.TABLE} (id, tenant_id, kind, status, created_at, updated_at,"
            " queue_name, priority, next_run_at, pending_since)"
            " SELECT gen_random_uuid(), 'default', 'test.old', 'pending', now(), now(),"
            "        'default', 0, now() - interval '1 hour' + n * interval '1 ms', now()"
            "   FROM generate_series(1, %s) AS n",
            [count],
        )


@contextlib.contextmanager
def pinned_horizon() -> Iterator[None]:
    """Another session holds a transaction with an XID open: while it lasts, vacuum
    removes no row version that died after it began."""
    pin = connect_to_test_database(application_name="pins-the-horizon")
    pin.execute("SELECT txid_current()")
    try:
        yield
    finally:
        pin.rollback()
        pin.close()
