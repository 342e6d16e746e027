"""``python -m benchmarks.admin_bench``: the operator console on a million rows (issue 12).

Starts its own PostgreSQL the way ``python -m benchmarks`` does (an embedded server, or
databases of its own on the server of ``DATABASE_URL``), migrates, fills the job table
with ``--rows`` jobs in one ``INSERT … SELECT generate_series`` (mostly finished, a few
pending, running, held, parked and failed, ten kinds, five tenants, a month of history),
runs ANALYZE, then times every page of issue 12's goals table through Django's test
client as a logged-in superuser: one warm-up, then the median of ``--repeat`` requests.
It prints each page's time against its goal and the EXPLAIN (ANALYZE, BUFFERS) plan of the
page's slowest statement, and writes both to ``benchmarks/results/admin-<UTC>.md``.
It also times ``durable_jobs stats`` (``stats.collect``) and the Prometheus scrape, then
adds ``--bulk`` (20,000) pending jobs of their own kind and times a "select all" cancel of
them: the request, and the background job that does the work.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

# The "select all" population: pending jobs of one kind, added after the page timings.
FILL_BULK = """
INSERT INTO durable_jobs_job (id, tenant_id, kind, status, queue_name, created_at, updated_at,
  pending_since,
                              next_run_at)
SELECT gen_random_uuid(), 'tenant-' || (g %% 5), 'bench.bulk', 'pending', 'default',
       now() - g * interval '1 millisecond', now(), now(), now() + interval '1 day'
  FROM generate_series(1, %(rows)s) g
"""

FILL = """
INSERT INTO durable_jobs_job (
    id, tenant_id, organization_id, kind, status, created_at, updated_at, input, idempotency_key,
      lock_key,
    subject_type, subject_id, queue_name, processed_count, total_count, started_at, finished_at,
      parked_at,
    error_class, error_code, pending_since, next_run_at, lease_owner, lease_epoch, lease_expires_at,
    heartbeat_at, held_since, wait_label)
SELECT gen_random_uuid(),
       'tenant-' || (g %% 5),
       CASE WHEN g %% 3 = 0 THEN 'org-' || (g %% 7) END,
       'bench.kind' || (g %% 10),
       s.status,
       now() - g * interval '2.5 seconds',
       now() - g * interval '2.5 seconds',
       jsonb_build_object('n', g),
       'idem-' || g,
       CASE WHEN g %% 10 = 0 THEN 'lock-' || g END,
       'bench.report', g::text,
       CASE WHEN g %% 4 = 0 THEN 'reports' ELSE 'default' END,
       CASE WHEN s.status = 'completed' THEN 100 ELSE g %% 100 END,
       CASE WHEN g %% 2 = 0 THEN 100 END,
       now() - g * interval '2.5 seconds',
       CASE WHEN s.status IN ('completed', 'failed',
         'cancelled') THEN now() - g * interval '2.5 seconds' END,
       CASE WHEN s.parked THEN now() - g * interval '2.5 seconds' END,
       CASE WHEN s.status = 'failed' THEN 'transient' END,
       CASE WHEN s.parked THEN 'poison' WHEN s.status = 'failed' THEN 'retry_exhausted' END,
       CASE WHEN s.status = 'pending' THEN now() - g * interval '2.5 seconds' END,
       CASE WHEN s.status = 'pending'
            THEN now() + interval '1 day' + (g %% 600) * interval '1 second' END,
       CASE WHEN s.status = 'running' THEN 'bench-worker:' || g END,
       1,
       CASE WHEN s.status = 'running' THEN now() + CASE WHEN g %% 2 = 0 THEN interval '1 hour'
                                                       ELSE interval '-1 hour' END END,
       CASE WHEN s.status = 'running' THEN now() - interval '5 seconds' END,
       CASE WHEN s.held THEN now() - interval '10 minutes' END,
       CASE WHEN s.held THEN 'profile:inventory-ready' END
  FROM generate_series(1, %(rows)s) g
 CROSS JOIN LATERAL (
       SELECT CASE WHEN g %% 1000 = 0 THEN 'pending' WHEN g %% 1000 = 1 THEN 'running'
                   WHEN g %% 1000 IN (2, 3, 4) THEN 'failed' WHEN g %% 1000 = 5 THEN 'cancelled'
                   WHEN g %% 1000 = 6 THEN 'pending'
                   ELSE 'completed' END AS status,
              g %% 1000 = 2 AS parked,
              g %% 1000 = 6 AS held
 ) s
"""

PAGES = [
    # (label, goal ms, path)
    ("change list, no filter", 150, ""),
    ("filter status=completed", 150, "?status=completed"),
    ("filter status=pending", 150, "?status=pending"),
    ("filter kind", 150, "?kind=bench.kind3"),
    ("filter queue", 150, "?queue=reports"),
    ("filter tenant", 150, "?tenant=tenant-2"),
    ("filter organization", 150, "?organization=org-3"),
    ("filter parked", 150, "?parked=yes"),
    ("filter parked reason", 150, "?parked=poison"),
    ("filter lease expired", 150, "?lease_expired=yes"),
    ("filter held", 150, "?held=yes"),
    ("search by job id", 20, "?q={job_id}"),
    ("search by idempotency key", 20, "?q=idem-500000"),
    ("search, no match", 300, "?q=no-such-key-anywhere"),
    ("search, kind prefix", 300, "?q=bench.kind3"),
    ("page 10,000 (bounded)", 300, "?p=10000"),
    ("detail page", 150, "{job_id}/change/"),
    ("live progress (50 ids)", 150, "live/?{ids}"),
]


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks console",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="jobs in the table (default 1,000,000)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed requests per page (median)")
    parser.add_argument(
        "--bulk", type=int, default=20_000, help="pending jobs a 'select all' cancel acts on"
    )
    return parser.parse_args(argv)


def _timed(fn, repeat):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), result


def _slowest_plan(fn):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        fn()
    queries = [
        q
        for q in captured.captured_queries
        if q["sql"].lstrip().upper().startswith(("SELECT", "WITH"))
        and "django_session" not in q["sql"]
        and "auth_" not in q["sql"]
    ]
    if not queries:
        return 0.0, "(no job query)"
    slowest = max(queries, key=lambda q: float(q["time"]))
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + slowest["sql"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    sql_ms = float(slowest["time"]) * 1000
    return (
        sql_ms,
        f"-- {sql_ms:.1f} ms, {len(queries)} job queries on the "
        f"page\n{slowest['sql'][:600]}\n{plan}",
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings_bench")
    from benchmarks import server as server_mod

    server = server_mod.start()
    try:
        os.environ["DATABASE_URL"] = server.url(server_mod.DATABASES["durable"])
        return run(args, server)
    finally:
        server.stop()


def run(args, server) -> int:
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from durable_jobs.console import stats

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    settings.DURABLE_JOBS = {
        **getattr(settings, "DURABLE_JOBS", {}),
        "METRICS_TOKEN": "bench-token-0123456789",
    }
    call_command("migrate", verbosity=0)
    t0 = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(FILL, {"rows": args.rows})
    fill_s = time.perf_counter() - t0
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE durable_jobs_job")
        cursor.execute(
            "SELECT id FROM durable_jobs_job WHERE idempotency_key = 'idem-%s'" % (args.rows // 2)
        )
        job_id = cursor.fetchone()[0]
        cursor.execute("SELECT id FROM durable_jobs_job WHERE status = 'running' LIMIT 50")
        ids = "&".join(f"id={row[0]}" for row in cursor.fetchall())
        cursor.execute(
            "SELECT count(*), pg_size_pretty(pg_total_relation_size('durable_jobs_job')) "
            "FROM durable_jobs_job"
        )
        total, size = cursor.fetchone()
    print(f"filled {total:,} rows in {fill_s:.1f} s (table with indexes: {size})")
    User.objects.create_superuser("bench", "bench@example.invalid", "pw")
    client = Client()
    client.force_login(User.objects.get(username="bench"))
    base = "/admin/durable_jobs/job/"
    rows, plans = [], []

    def page(url):
        def get():
            response = client.get(url)
            if response.status_code != 200:
                raise SystemExit(f"{url}: HTTP {response.status_code}")
            return response

        return get

    for label, goal, path in PAGES:
        url = base + path.format(job_id=job_id, ids=ids)
        ms, _ = _timed(page(url), args.repeat)
        sql_ms, plan = _slowest_plan(page(url))
        rows.append((label, goal, ms, sql_ms))
        plans.append((label, url, plan))
    metrics = Client()

    def scrape():
        response = metrics.get(
            "/metrics/durable-jobs", HTTP_AUTHORIZATION="Bearer bench-token-0123456789"
        )
        assert response.status_code == 200, response.status_code

    ms, _ = _timed(scrape, args.repeat)
    sql_ms, plan = _slowest_plan(scrape)
    rows.append(("Prometheus scrape (bearer token)", 100, ms, sql_ms))
    plans.append(("Prometheus scrape", "/metrics/durable-jobs", plan))
    ms, _ = _timed(lambda: stats.collect(), args.repeat)
    rows.append(("durable_jobs stats (stats.collect)", 100, ms, None))
    # "Select all" cancel over --bulk pending jobs: the request only starts a background job.
    with connection.cursor() as cursor:
        cursor.execute(FILL_BULK, {"rows": args.bulk})
        # What autovacuum does after an insert burst (its insert threshold); see the plan.
        cursor.execute("VACUUM ANALYZE durable_jobs_job")
        cursor.execute("SELECT id FROM durable_jobs_job WHERE kind = 'bench.bulk' LIMIT 1")
        pending_id = str(cursor.fetchone()[0])
    ms, _ = _timed(scrape, args.repeat)
    sql_ms, plan = _slowest_plan(scrape)
    rows.append((f"Prometheus scrape, {args.bulk:,} more live jobs", 100, ms, sql_ms))
    plans.append(
        (f"Prometheus scrape, {args.bulk:,} more live jobs", "/metrics/durable-jobs", plan)
    )

    def bulk():
        response = client.post(
            base + "?kind=bench.bulk",
            {
                "action": "cancel_jobs",
                "select_across": "1",
                "_selected_action": [pending_id],
                "index": "0",
                "confirm": "yes",
            },
        )
        assert response.status_code == 302, response.status_code

    t0 = time.perf_counter()
    bulk()
    ms = (time.perf_counter() - t0) * 1000
    rows.append((f"'select all' cancel of {args.bulk:,} jobs (the request)", 300, ms, None))
    # The background job that request started, run here the way a worker slot runs it.
    from durable_jobs import testing
    from durable_jobs.models import Job

    t0 = time.perf_counter()
    testing.run_jobs(queues=["default"])
    took = time.perf_counter() - t0
    job = Job.objects.get(kind="durable_jobs.bulk_action")
    bulk_note = (
        f"The background cancel job walked {job.processed_count:,} jobs in {took:.1f} s "
        f"({job.processed_count / took:,.0f} jobs/s), status {job.status}, result {job.result}."
    )
    print(bulk_note)
    refused = metrics.get("/metrics/durable-jobs").status_code

    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"# Operator console on {total:,} rows ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)",
        "",
        (
            f"PostgreSQL {server.describe().get('server_version')}, table with indexes {size}, "
            f"median of {args.repeat} warm requests; a scrape without credentials answers "
            f"{refused}; load average {load} on {os.cpu_count()} cores at the end."
        ),
        "",
        bulk_note,
        "",
        "| page | goal | median (whole request) | its slowest SQL statement | |",
        "|---|---:|---:|---:|---|",
    ]
    for label, goal, ms, sql_ms in rows:
        sql = "-" if sql_ms is None else f"{sql_ms:.1f} ms"
        lines.append(
            f"| {label} | < {goal} ms | {ms:.1f} ms | {sql} | {'PASS' if ms < goal else 'MISS'} |"
        )
    lines += ["", "## Plans (the slowest statement of each page)", ""]
    for label, url, plan in plans:
        lines += [f"### {label} — `{url}`", "", "```", plan, "```", ""]
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"admin-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}.md"
    out.write_text(text)
    print(f"\nwritten to {out}")
    return 0 if all(ms < goal for _, goal, ms, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
