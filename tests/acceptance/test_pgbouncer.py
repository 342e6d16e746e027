"""Workers behind PgBouncer in transaction mode (issue 14, deliverable 6).

Each test starts its own ``pgbouncer`` (tests/pooler.py) in front of the test's
PostgreSQL and points the worker subprocesses at it. A transaction-mode pooler breaks
anything kept in a server session between transactions: LISTEN, session-level SET,
prepared statements, advisory locks. The worker must run every job, recover from a
SIGKILL, and, with the default settings, say in its log that wake-ups do not arrive.
"""

from __future__ import annotations

import signal

import pytest
from django.db.models import Count

import durable_jobs as durable
from durable_jobs.models import Job
from testproject.demo.models import Effect
from tests.acceptance.harness import backends_of, wait_until
from tests.pooler import PgBouncer

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

DEAF = "wake-ups are not arriving"


@pytest.fixture
def pooler(db_url, tmp_path):
    bouncer = PgBouncer(db_url, tmp_path).start()
    yield bouncer
    bouncer.stop()
    print(f"--- pgbouncer log ---\n{bouncer.log()[-4000:]}")


def _all_done(jobs) -> bool:
    return not Job.objects.filter(
        id__in=[j.id for j in jobs], status__in=["pending", "running"]
    ).exists()


def test_behind_the_pooler_jobs_run_and_the_worker_says_wake_ups_are_lost(processes, pooler):
    worker = processes.worker(
        "--concurrency",
        "2",
        app_name="durable-test-pooled",
        env={"DATABASE_URL": pooler.url, "DURABLE_JOBS_POLL_INTERVAL": "0.5"},
    )
    jobs = [durable.start("demo.flaky", input={"failures": 0}) for _ in range(30)]
    wait_until(
        lambda: _all_done(jobs), timeout=60, message="every job to finish through the pooler"
    )
    assert set(
        Job.objects.filter(id__in=[j.id for j in jobs]).values_list("status", flat=True)
    ) == {"completed"}
    # The listener's probe NOTIFY never comes back through the pooler: the worker says so.
    wait_until(
        lambda: DEAF in worker.output(),
        timeout=20,
        message="the worker to log that wake-ups are lost",
    )
    output = worker.output()
    assert "LISTEN_DATABASE" in output and "NOTIFY_CHANNEL = None" in output
    assert "prepared statement" not in output, output[-3000:]
    assert "cannot claim" not in output, output[-3000:]


def test_polling_only_behind_the_pooler_runs_jobs_without_a_warning(processes, pooler):
    worker = processes.worker(
        "--concurrency",
        "2",
        app_name="durable-test-polling",
        env={
            "DATABASE_URL": pooler.url,
            "DURABLE_JOBS_NOTIFY_CHANNEL": "",
            "DURABLE_JOBS_POLL_INTERVAL": "0.2",
        },
    )
    jobs = [durable.start("demo.flaky", input={"failures": 1}) for _ in range(10)]
    wait_until(lambda: _all_done(jobs), timeout=60, message="every job to finish by polling")
    assert set(
        Job.objects.filter(id__in=[j.id for j in jobs]).values_list("status", flat=True)
    ) == {"completed"}
    assert DEAF not in worker.output()
    assert not backends_of("durable-test-polling/durable-listener"), (
        "no listener with NOTIFY_CHANNEL = None"
    )


def test_a_listener_on_a_direct_connection_wakes_pooled_slots_at_once(processes, pooler, db_url):
    worker = processes.worker(
        "--concurrency",
        "1",
        app_name="durable-test-direct",
        env={
            "DATABASE_URL": pooler.url,
            "TESTPROJECT_LISTEN_DATABASE_URL": db_url,
            "DURABLE_JOBS_POLL_INTERVAL": "120",
        },
    )
    wait_until(
        lambda: "wake-ups arrive" in worker.output(),
        timeout=30,
        message="the listener's probe to come back over the direct connection",
    )
    job = durable.start("demo.flaky", input={"failures": 0})  # its NOTIFY passes through no pooler
    # The slot sleeps on a 120 s poll: only the wake-up can start the job this soon.
    wait_until(
        lambda: Job.objects.get(id=job.id).status == "completed",
        timeout=15,
        message="the job to run on the wake-up, not the 120 s poll",
    )
    assert DEAF not in worker.output()


def test_crash_recovery_behind_the_pooler(processes, pooler):
    fast = {"DATABASE_URL": pooler.url, "DURABLE_JOBS_RECONCILE_INTERVAL": "0.3"}
    imports = [
        durable.start("demo.import", input={"rows": 8, "batch": 1, "delay": 0.15}) for _ in range(3)
    ]
    doomed = processes.worker("--concurrency", "3", app_name="durable-test-pooled-doomed", env=fast)
    wait_until(
        lambda: (
            Job.objects.filter(id__in=[j.id for j in imports], processed_count__gte=2).count() >= 2
        ),
        message="the imports to be under way",
    )
    doomed.signal(signal.SIGKILL)
    doomed.wait()
    assert Job.objects.filter(status="running", lease_owner__isnull=False).exists(), (
        "the kill left orphans"
    )

    survivor = processes.worker(
        "--concurrency", "3", app_name="durable-test-pooled-survivor", env=fast
    )
    wait_until(
        lambda: _all_done(imports), timeout=90, message="the orphans to be re-driven and finished"
    )
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0
    final = Job.objects.filter(id__in=[j.id for j in imports])
    assert {job.status for job in final} == {"completed"}
    assert any(job.redrives >= 1 for job in final), "the reconciler re-drove the orphans"
    effects = Effect.objects.filter(job_id__in=[j.id for j in imports])
    assert not effects.values("job_id", "item").annotate(n=Count("id")).filter(n__gt=1).exists()
    assert effects.count() == 3 * 8


def test_starts_in_autocommit_behind_the_pooler_never_fail_whatever_session_they_land_in(
    pooler,
):
    """A start in autocommit prepares its insert in the server session it runs in; a
    transaction-mode pooler hands each statement any server session. A start that lands
    in one without the statement falls back to the plain insert (and its connection
    prepares nothing more): no start fails, every row is written once."""
    import psycopg
    from django.db import connections
    from django.db.backends.postgresql.base import DatabaseWrapper
    from psycopg.conninfo import conninfo_to_dict

    via = conninfo_to_dict(pooler.url)
    pooled = DatabaseWrapper(
        {
            **connections["default"].settings_dict,
            "HOST": via["host"],
            "PORT": via["port"],
            "CONN_MAX_AGE": 0,
        },
        alias="pooled",
    )
    connections["pooled"] = pooled
    try:
        started = [durable.start("demo.noop", input={"n": n}, using="pooled") for n in range(4)]
        # Another client holds the server session those starts ran in (the pooler reuses
        # the last one first): the next starts run in a session that never saw the insert.
        with psycopg.connect(pooler.url) as other:
            other.execute("SELECT 1")  # a transaction left open holds its session
            started += [
                durable.start("demo.noop", input={"n": n}, using="pooled") for n in range(4, 12)
            ]
        started += [
            durable.start("demo.noop", input={"n": n}, using="pooled") for n in range(12, 20)
        ]
    finally:
        pooled.close()
        del connections["pooled"]
    rows = Job.objects.filter(id__in=[job.id for job in started])
    assert sorted(row.input["n"] for row in rows) == list(range(20))
    assert {row.status for row in rows} == {"pending"}
