"""``python -m benchmarks.scale_bench``: ten million rows and a pooler (issue 14, items 5 and 6).

Three phases, each in a subprocess of its own (each binds Django to its own database):

``size``     finished rows grown by ``INSERT … SELECT generate_series`` through ``--sizes``
             (default 0, 1M, 10M); at each size: DEQUEUE (1 and 8 rows), a full reconciler
             pass, and retention (a pass with nothing to delete, then batches of real
             deletes), ``durable_jobs stats`` (``stats.collect``) and the Prometheus scrape
             (``GET /metrics/durable-jobs`` with a bearer token), each as client time and
             as server time (EXPLAIN ANALYZE execution time), with the plans written to the
             results file; at the largest size stats and the scrape again over a live
             backlog of ``--backlog`` jobs (pending, held, running, retrying, parked).
``ingest``   a sustained ``--ingest-rate`` jobs/s (default 5,000) for ``--ingest-seconds``,
             each job written as a worker writes it (insert pending, claim, complete: three
             row versions), with the reconciler running its real passes and a short
             RETENTION (``--ingest-retention``, default 30 s): live rows, dead tuples, the
             table's size and the backlog past retention sampled every 5 s.
``pooler``   ``--n`` no-op jobs drained by ``durable_worker --burst`` (1 and 4 slots) directly
             and through a PgBouncer in transaction mode started for the run, interleaved.

Servers: ``size`` and ``pooler`` use ``SCALE_DATABASE_URL`` (else ``DATABASE_URL``, else an
embedded server), creating and finally dropping their own ``durable_jobs_scale*``
databases; ``ingest`` uses an embedded server by default (autovacuum on, as in most
deployments; ``--ingest-url`` picks another). Results go to
``benchmarks/results/scale-<timestamp>.md`` and ``.json``.

The machine is shared (2 cores, other jobs running): every figure is noisy. Compare the
sizes within one run; server time (EXPLAIN ANALYZE) is less noisy than client time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.django_env import setup_django

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
TABLE = "durable_jobs_job"
SIZE_DB = "durable_jobs_scale"
INGEST_DB = "durable_jobs_scale_ingest"
POOLER_DB = "durable_jobs_scale_pooler"


# ---------------------------------------------------------------------------------------
# the orchestrating process
# ---------------------------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks ten-million",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--only", default="size,ingest,pooler", help="phases among size, ingest, pooler"
    )
    parser.add_argument(
        "--sizes", default="0,1000000,10000000", help="finished rows to measure at, ascending"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the size database (reuse its rows next time)"
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=20000,
        help="live jobs added over the largest size to time stats and the scrape again (0: none)",
    )
    parser.add_argument(
        "--size-db", default=SIZE_DB, help=f"database of the size phase (default {SIZE_DB})"
    )
    parser.add_argument("--ingest-rate", type=int, default=5000)
    parser.add_argument("--ingest-seconds", type=float, default=180.0)
    parser.add_argument("--ingest-retention", type=float, default=30.0)
    parser.add_argument(
        "--ingest-url", help="server for the ingest phase (default: an embedded server)"
    )
    parser.add_argument(
        "--ingest-table-defaults",
        action="store_true",
        help="ingest with PostgreSQL's autovacuum defaults (RESET what 0007_ops sets), to compare",
    )
    parser.add_argument(
        "--ingest-base",
        type=int,
        default=0,
        help="rows retention must keep (parked jobs) in the table before the ingest starts",
    )
    parser.add_argument(
        "--ingest-fillfactor",
        type=int,
        help="ingest with this fillfactor instead of 70, to compare",
    )
    parser.add_argument("--n", type=int, default=5000, help="jobs per pooler throughput run")
    parser.add_argument(
        "--repeat", type=int, default=2, help="pooler throughput rounds (median reported)"
    )
    parser.add_argument("--output", type=Path)
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.phase:
        return run_phase(args)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    output = args.output or RESULTS / f"scale-{stamp}.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    phases = [p.strip() for p in args.only.split(",") if p.strip()]
    results: dict = {"started": stamp, "args": {k: str(v) for k, v in vars(args).items()}}
    from benchmarks import server as server_mod

    main_url = os.environ.get("SCALE_DATABASE_URL") or os.environ.get("DATABASE_URL", "")
    main_server = _adopt(server_mod, main_url)
    ingest_server = None
    try:
        results["server"] = main_server.describe() | _autovacuum(main_server)
        for phase in phases:
            if phase == "ingest":
                if args.ingest_url:
                    ingest_server = _adopt(server_mod, args.ingest_url)
                else:
                    ingest_server = server_mod._start_embedded()
                server, db = ingest_server, INGEST_DB
                results["ingest_server"] = server.describe() | _autovacuum(server)
            else:
                server, db = main_server, args.size_db if phase == "size" else POOLER_DB
            fresh = not (phase == "size" and args.keep)
            _create(server, db, fresh=fresh)
            out = output.with_suffix(f".{phase}.json")
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.scale_bench",
                "--phase",
                phase,
                "--url",
                server.url(db),
                "--json",
                str(out),
                "--sizes",
                args.sizes,
                "--backlog",
                str(args.backlog),
                "--ingest-rate",
                str(args.ingest_rate),
                "--ingest-seconds",
                str(args.ingest_seconds),
                "--ingest-retention",
                str(args.ingest_retention),
                "--n",
                str(args.n),
                "--repeat",
                str(args.repeat),
            ]
            if args.ingest_table_defaults:
                cmd.append("--ingest-table-defaults")
            if args.ingest_fillfactor:
                cmd += ["--ingest-fillfactor", str(args.ingest_fillfactor)]
            cmd += ["--ingest-base", str(args.ingest_base)]
            print(f"== phase {phase} on {server.url(db)}", flush=True)
            code = subprocess.call(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
            results[phase] = (
                json.loads(out.read_text()) if out.exists() else {"error": f"exit {code}"}
            )
            if not (phase == "size" and args.keep):
                _drop(server, db)
    finally:
        if ingest_server is not None:
            ingest_server.stop()
        if main_server.embedded:
            main_server.stop()
    output.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str))
    output.write_text(render(results))
    print(render_summary(results))
    print(f"results: {output}")
    return 0


def _adopt(server_mod, url: str):
    if url:
        return server_mod.Server(admin_url=url, embedded=False)
    return server_mod._start_embedded()


def _autovacuum(server) -> dict:
    with server.connect() as conn:
        return {
            n: conn.execute(f"SHOW {n}").fetchone()[0]
            for n in (
                "autovacuum",
                "autovacuum_naptime",
                "autovacuum_vacuum_cost_delay",
                "autovacuum_vacuum_cost_limit",
                "maintenance_work_mem",
            )
        }


def _create(server, db: str, *, fresh: bool) -> None:
    with server.connect() as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db]).fetchone()
        if exists and fresh:
            conn.execute(f'DROP DATABASE "{db}" WITH (FORCE)')
        if not exists or fresh:
            conn.execute(f'CREATE DATABASE "{db}"')


def _drop(server, db: str) -> None:
    with server.connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


# ---------------------------------------------------------------------------------------
# a phase, in its own process
# ---------------------------------------------------------------------------------------


def run_phase(args) -> int:
    setup_django(args.url, "durable_jobs_scale")
    phase = {"size": phase_size, "ingest": phase_ingest, "pooler": phase_pooler}[args.phase]
    try:
        out = phase(args)
    except Exception as error:  # noqa: BLE001 - write what went wrong into the results
        import traceback

        traceback.print_exc()
        out = {"error": f"{type(error).__name__}: {error}"}
    args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


def _sql(query: str, params=None):
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else None


def _sizes() -> dict:
    row = _sql(
        f"""SELECT pg_relation_size('{TABLE}'), pg_indexes_size('{TABLE}'),
                  pg_total_relation_size('{TABLE}'),
                          n_live_tup, n_dead_tup, autovacuum_count, vacuum_count
                     FROM pg_stat_user_tables WHERE relname = %s""",
        [TABLE],
    )[0]
    return {
        "heap_mb": row[0] / 2**20,
        "indexes_mb": row[1] / 2**20,
        "total_mb": row[2] / 2**20,
        "n_live_tup": row[3],
        "n_dead_tup": row[4],
        "autovacuum_count": row[5],
        "vacuum_count": row[6],
    }


def _pct(values, q):
    values = sorted(values)
    if not values:
        return None
    k = (len(values) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


# --- size -------------------------------------------------------------------------------


def phase_size(args) -> dict:
    from django.db import connection

    from benchmarks import durable_bench as bench
    from durable_jobs import conf, store

    out = {"sizes": []}
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        print(f"-- {size:,} finished rows", flush=True)
        grown = bench.grow_finished(_ctx(), size) if size else {"finished_rows": 0}
        entry = {"size": size, "grown": grown}
        # DEQUEUE at 1 and 8 rows, the reconciler's pass and selections (benchmarks.durable_bench).
        entry["dequeue_reconcile"] = bench.dequeue_and_reconcile(
            _ctx(), reps=200, passes=10, explain_reps=20
        )
        settings = conf.get()
        ttl_ms = conf.ms(settings.LEASE_TTL)
        with connection.cursor() as cur:
            cur.execute(bench.FILL_PENDING, {"kind": bench.KIND, "n": 8 * 60})
        params8 = store.claim_params(
            [settings.DEFAULT_QUEUE], f"bench:{uuid.uuid4().hex[:6]}", ttl_ms, kinds=None, limit=8
        )
        entry["dequeue8_exec_ms"] = _pct(
            [bench._explain_time(store.DEQUEUE, params8) for _ in range(20)], 50
        )
        entry["dequeue8_plan"] = bench._explain_text(store.DEQUEUE, params8)
        # Before retention deletes rows: the planner's statistics are those of the VACUUM
        # (ANALYZE) after the fill, as autovacuum would keep them (it is off on the service).
        entry["stats_scrape"] = _stats_and_scrape(bench, size)
        entry["retention"] = _retention_at_size(bench, store, conf)
        entry["table"] = _sizes()
        if args.backlog and size == sizes[-1]:
            entry["backlog"] = _add_backlog(args.backlog)
            entry["stats_scrape_backlog"] = _stats_and_scrape(bench, size)
        out["sizes"].append(entry)
        print(json.dumps({k: v for k, v in summarize_size(entry).items()}), flush=True)
    return out


def _retention_at_size(bench, store, conf) -> dict:
    """A retention pass with nothing past RETENTION, then real batches of deletes."""
    from durable_jobs.runtime.reconciler import RETENTION_BATCH, PassReport, Reconciler

    nothing = {
        "older_than_ms": conf.ms(conf.get().RETENTION or 30 * 86400),
        "limit": RETENTION_BATCH,
        "tenant": None,
    }
    idle_exec = [bench._explain_time(store.DELETE_FINISHED, nothing) for _ in range(10)]
    reconciler = Reconciler()
    idle_pass = []
    for _ in range(10):
        t0 = time.perf_counter()
        reconciler.apply_retention(PassReport())
        idle_pass.append(time.perf_counter() - t0)
    # The rows were finished at random moments over the past 7 days: about a third is
    # older than 4.5 days.
    old = {"older_than_ms": int(4.5 * 86400 * 1000), "limit": RETENTION_BATCH, "tenant": None}
    have = _sql(f"SELECT count(*) FROM {TABLE} WHERE status = 'completed'")[0][0]
    out = {
        "idle_exec_p50_ms": _pct(idle_exec, 50),
        "idle_pass_p50_ms": _pct(idle_pass, 50) * 1000,
        "idle_plan": bench._explain_text(store.DELETE_FINISHED, nothing),
    }
    if have < 10 * RETENTION_BATCH:
        return out
    out["delete_plan"] = bench._explain_text(store.DELETE_FINISHED, old)
    batches = []
    for _ in range(10):
        t0 = time.perf_counter()
        deleted = store.delete_finished(**old)
        batches.append((time.perf_counter() - t0, deleted))
    seconds = [b[0] for b in batches]
    out.update(
        {
            "batch_rows": RETENTION_BATCH,
            "batch_ms": [s * 1000 for s in seconds],
            "batch_p50_ms": _pct(seconds, 50) * 1000,
            "rows_per_second": sum(b[1] for b in batches) / sum(seconds),
        }
    )
    return out


STATS_REPEAT = 9
METRICS_TOKEN = "scale-bench-token-0123456789"


def _stats_and_scrape(bench, size: int) -> dict:
    """Time ``stats.collect()`` and the metrics view: the whole call (median of warm calls)
    and each statement it runs on the server (EXPLAIN ANALYZE, median), with their plans."""
    from django.conf import settings
    from django.test import Client

    from durable_jobs.console import stats

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "METRICS_TOKEN": METRICS_TOKEN}
    client = Client()

    def scrape():
        response = client.get("/metrics/durable-jobs", HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}")
        assert response.status_code == 200, response.status_code
        return response.content

    out = {}
    for name, call in (("stats", stats.collect), ("scrape", scrape)):
        call()  # warm-up: connection, caches
        times = []
        for _ in range(STATS_REPEAT):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1000)
        out[name] = {
            "client_p50_ms": _pct(times, 50),
            "client_ms": times,
            "statements": _statements_of(bench, call),
        }
        out[name]["server_ms"] = sum(s.get("exec_p50_ms") or 0 for s in out[name]["statements"])
    answer = stats.collect()
    completed = sum(counts.get("completed", 0) for counts in answer["by_kind"].values())
    out["answer"] = {
        "estimated": answer["estimated"],
        "completed": completed,
        "pending": answer["pending"],
        "running": answer["running"],
        "held": answer["held"],
        "running_expired_leases": answer["running_expired_leases"],
        "retrying": answer["retrying"],
        "parked_by_reason": answer["parked_by_reason"],
        "finished_last": answer["finished_last"],
    }
    out["exact"] = dict(_sql(f"SELECT status, count(*) FROM {TABLE} GROUP BY status"))
    out["scrape_lines"] = len(scrape().splitlines())
    print(
        f"   stats {out['stats']['client_p50_ms']:.1f} ms (server {out['stats']['server_ms']:.1f} "
        "ms), "
        f"scrape {out['scrape']['client_p50_ms']:.1f} ms (server {out['scrape']['server_ms']:.1f} "
        "ms) "
        f"at {size:,}",
        flush=True,
    )
    return out


def _statements_of(bench, call) -> list[dict]:
    """Each statement ``call`` runs: its client time there, its EXPLAIN ANALYZE time and plan."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        call()
    out = []
    for query in captured.captured_queries:
        sql = query["sql"]
        entry = {"sql": sql, "client_ms": float(query["time"]) * 1000}
        head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        # The planner's own estimates (EXPLAIN) are not explained again; the transaction
        # control around the statistics read has no plan.
        if head in ("SELECT", "WITH"):
            try:
                entry["exec_p50_ms"] = _pct([bench._explain_time(sql, None) for _ in range(5)], 50)
                entry["plan"] = bench._explain_text(sql, None)
            except Exception as error:  # noqa: BLE001 - report instead of failing
                entry["plan"] = f"(EXPLAIN failed: {type(error).__name__}: {error})"
        out.append(entry)
    return out


# Live jobs over the finished history: pending (a tenth held by a wait condition), running
# under a lease (a tenth expired), running with a released lease after a failed slice
# (retrying), and parked. ``stats`` counts every one of them exactly.
BACKLOG = f"""
INSERT INTO {TABLE} (id, tenant_id, kind, status, created_at, updated_at, queue_name, priority,
  lease_owner,
                     lease_epoch, lease_expires_at, heartbeat_at, next_run_at, pending_since,
                       started_at,
                     finished_at, parked_at, error_class, error_code, held_since, wait_for)
SELECT gen_random_uuid(), 'default', 'bench.backlog.' || (g %% 10), b.status,
  now() - interval '1 minute', now(),
       'default', 0, b.owner, 1, b.expires, b.beat, b.next_run, b.pending_since, b.started,
       b.finished, b.parked,
       b.error_class, b.error_code, b.held, b.wait_for
  FROM generate_series(1, %(n)s) g
 CROSS JOIN LATERAL (
     SELECT * FROM (VALUES
         -- of every 20: pending (0-9), pending and held (10), running under a lease (11-15),
         -- running with an expired lease (16), retrying (17-18), parked (19)
         (g %% 20 < 10, 'pending', NULL, NULL::timestamptz, NULL::timestamptz,
           now() + interval '1 hour',
          now() - interval '1 minute', NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
            NULL, NULL,
          NULL::timestamptz, NULL::jsonb),
         (g %% 20 = 10, 'pending', NULL, NULL, NULL, now() + interval '1 hour',
           now() - interval '1 minute',
          NULL, NULL, NULL, NULL, NULL, now() - interval '1 minute',
            '{{"after": "2099-01-01T00:00:00Z"}}'),
         (g %% 20 BETWEEN 11 AND 15, 'running', 'bench:' || g, now() + interval '1 minute', now(),
           NULL, NULL,
          now(), NULL, NULL, NULL, NULL, NULL, NULL),
         (g %% 20 = 16, 'running', 'bench:' || g, now() - interval '1 minute',
           now() - interval '2 minutes', NULL,
          NULL, now(), NULL, NULL, NULL, NULL, NULL, NULL),
         (g %% 20 IN (17, 18), 'running', NULL, NULL, NULL, now() + interval '1 hour', NULL, now(),
           NULL, NULL,
          'transient', NULL, NULL, NULL),
         (g %% 20 = 19, 'failed', NULL, NULL, NULL, NULL, NULL, now(), now(), now(), 'transient',
           'poison', NULL,
          NULL)
     ) AS v(pick, status, owner, expires, beat, next_run, pending_since, started, finished, parked,
            error_class, error_code, held, wait_for)
     WHERE v.pick
 ) AS b
"""


def _add_backlog(n: int) -> dict:
    """Add ``n`` live and parked jobs (not due for an hour: the next size's cleanup drops them)."""
    t0 = time.perf_counter()
    _sql(BACKLOG, {"n": n})
    # What autovacuum's insert threshold would do after such a burst (it is off on the service).
    _sql(f"VACUUM (ANALYZE) {TABLE}")
    return {
        "jobs": n,
        "seconds": time.perf_counter() - t0,
        "by_status": dict(
            _sql(
                f"SELECT status, count(*) FROM {TABLE} WHERE status <> 'completed' GROUP BY status"
            )
        ),
    }


def _ctx():
    from benchmarks import durable_bench as bench

    class _NoServer:
        def postmaster_pid(self):
            return None

    return bench.Ctx(
        _NoServer(), os.environ["DATABASE_URL"], dict(os.environ), RESULTS, sys.executable
    )


# --- ingest ------------------------------------------------------------------------------

INGEST_INSERT = f"""
INSERT INTO {TABLE} (id, tenant_id, kind, status, created_at, updated_at, queue_name, next_run_at,
  pending_since)
SELECT gen_random_uuid(), 'default', 'bench.ingest', 'pending', now(), now(), 'ingest',
  clock_timestamp(), now()
  FROM generate_series(1, %(n)s)
RETURNING id
"""
INGEST_BASE = f"""
INSERT INTO {TABLE} (id, tenant_id, kind, status, created_at, updated_at, queue_name, started_at,
  finished_at,
                     parked_at, error_class, error_code, domain_mirrored_at)
SELECT gen_random_uuid(), 'default', 'bench.base', 'failed', now(), now(), 'ingest', now(), now(),
  now(),
       'transient', 'poison', now()
  FROM generate_series(1, %(n)s)
"""
INGEST_CLAIM = f"""
UPDATE {TABLE} SET status = 'running', lease_owner = 'ingest:' || id::text,
  lease_epoch = lease_epoch + 1,
       lease_expires_at = clock_timestamp() + interval '60 seconds',
         heartbeat_at = clock_timestamp(),
       pending_since = NULL, next_run_at = NULL, started_at = now(), updated_at = now()
 WHERE id = ANY(%(ids)s::uuid[])
"""
INGEST_COMPLETE = f"""
UPDATE {TABLE} SET status = 'completed', finished_at = now(), domain_mirrored_at = now(),
  lease_owner = NULL,
       lease_expires_at = NULL, updated_at = now()
 WHERE id = ANY(%(ids)s::uuid[])
"""


def phase_ingest(args) -> dict:
    """``rate`` jobs/s through the three writes of a job's life; the reconciler deletes them."""
    import psycopg
    from django.conf import settings
    from django.db import connections

    from durable_jobs.runtime.reconciler import Reconciler

    settings.DURABLE_JOBS = {
        **settings.DURABLE_JOBS,
        "RETENTION": args.ingest_retention,
        "RECONCILE_INTERVAL": 5.0,
    }
    if args.ingest_table_defaults:
        _sql(f"ALTER TABLE {TABLE} RESET ({', '.join(_migration_0007().AUTOVACUUM)})")
    if args.ingest_fillfactor:
        _sql(f"ALTER TABLE {TABLE} SET (fillfactor = {int(args.ingest_fillfactor)})")
    if args.ingest_base:
        # A table that is mostly rows retention keeps (a 30-day RETENTION at thousands of
        # jobs/s holds billions): parked jobs, which it never deletes.
        t0 = time.monotonic()
        _sql(INGEST_BASE, {"n": args.ingest_base})
        _sql(f"VACUUM (ANALYZE) {TABLE}")
        print(f"base of {args.ingest_base:,} rows in {time.monotonic() - t0:.0f} s", flush=True)
    reloptions = _sql("SELECT reloptions FROM pg_class WHERE relname = %s", [TABLE])[0][0]
    stop = threading.Event()
    reconciler = Reconciler()
    deleted = [0]
    passes: list[float] = []

    def reconcile():
        from durable_jobs.runtime.reconciler import PassReport

        while not stop.is_set():
            t0 = time.perf_counter()
            report = PassReport()
            try:
                reconciler.apply_retention(report)
            except Exception as error:  # noqa: BLE001
                print(f"retention failed: {error}", flush=True)
            passes.append(time.perf_counter() - t0)
            deleted[0] += report.deleted
            stop.wait(5.0)
        connections.close_all()

    thread = threading.Thread(target=reconcile, daemon=True)
    thread.start()
    samples = []
    inserted = 0
    began = time.monotonic()
    next_sample = began
    lag = 0.0
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        pending: list = []  # (claimed ids) waiting to complete on the next tick
        tick = 0
        while time.monotonic() - began < args.ingest_seconds:
            t0 = time.monotonic()
            ids = [r[0] for r in conn.execute(INGEST_INSERT, {"n": args.ingest_rate}).fetchall()]
            conn.execute(INGEST_CLAIM, {"ids": ids})
            if pending:
                conn.execute(INGEST_COMPLETE, {"ids": pending})
            pending = ids
            inserted += len(ids)
            tick += 1
            if time.monotonic() >= next_sample:
                sample = {
                    "t": round(time.monotonic() - began, 1),
                    "inserted": inserted,
                    "deleted": deleted[0],
                }
                sample.update(_sizes())
                sample["past_retention"] = _sql(
                    f"SELECT count(*) FROM {TABLE} WHERE finished_at IS NOT NULL AND parked_at IS "
                    "NULL "
                    f"AND finished_at < now() - %s * interval '1 second'",
                    [args.ingest_retention],
                )[0][0]
                samples.append(sample)
                print(json.dumps(sample), flush=True)
                next_sample += 5.0
            spent = time.monotonic() - t0
            lag += max(0.0, spent - 1.0)
            time.sleep(max(0.0, began + tick - time.monotonic()))
        if pending:
            conn.execute(INGEST_COMPLETE, {"ids": pending})
    elapsed = time.monotonic() - began
    stop.set()
    thread.join(30)
    steady = [s for s in samples if s["t"] >= args.ingest_retention + 15]
    vacuumed = [s for s in samples if s["autovacuum_count"] + s["vacuum_count"] >= 1]
    return {
        "rate_target": args.ingest_rate,
        "seconds": elapsed,
        "inserted": inserted,
        "achieved_rate": inserted / elapsed,
        "deleted": deleted[0],
        "retention_s": args.ingest_retention,
        "base_rows": args.ingest_base,
        "reloptions": reloptions,
        "retention_pass_p50_ms": (_pct(passes, 50) or 0) * 1000,
        "retention_pass_max_ms": max(passes or [0]) * 1000,
        "passes": len(passes),
        "steady_total_mb_first": steady[0]["total_mb"] if steady else None,
        "steady_total_mb_last": steady[-1]["total_mb"] if steady else None,
        "steady_heap_mb_min": min((s["heap_mb"] for s in steady), default=None),
        "steady_heap_mb_max": max((s["heap_mb"] for s in steady), default=None),
        "dead_max": max((s["n_dead_tup"] for s in samples), default=None),
        "after_first_vacuum_total_mb": [
            min((s["total_mb"] for s in vacuumed), default=None),
            max((s["total_mb"] for s in vacuumed), default=None),
        ],
        "after_first_vacuum_seconds": vacuumed[0]["t"] if vacuumed else None,
        "autovacuums": samples[-1]["autovacuum_count"] if samples else None,
        "past_retention_max_steady": max((s["past_retention"] for s in steady), default=None),
        "samples": samples,
        "final": _sizes(),
    }


def _migration_0007():
    import importlib

    return importlib.import_module("durable_jobs.migrations.0007_ops")


# --- pooler -------------------------------------------------------------------------------


def phase_pooler(args) -> dict:
    from benchmarks import durable_bench as bench
    from tests.pooler import PgBouncer

    logs = RESULTS / f"scale-pooler-logs-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    bouncer = PgBouncer(os.environ["DATABASE_URL"], logs / "pgbouncer", pool_size=20).start()
    runs: dict = {}
    latency: dict = {}
    try:
        for round_ in range(args.repeat):
            for slots in (1, 4):
                for path in ("direct", "pgbouncer"):
                    env = dict(os.environ)
                    if path == "pgbouncer":
                        env["DATABASE_URL"] = bouncer.url
                    ctx = bench.Ctx(
                        _ctx().server, os.environ["DATABASE_URL"], env, logs, sys.executable
                    )
                    tag = f"{path}-{slots}-{round_}"
                    result = bench.throughput(
                        ctx, args.n, processes=1, slots=slots, tag=tag, timeout=300
                    )
                    runs.setdefault(f"{path}_{slots}", []).append(result)
                    print(tag, round(result.get("per_second") or 0), "jobs/s", flush=True)
        # Start-to-run latency, 4 slots, POLL_INTERVAL 1 s: the wake-up through a direct
        # LISTEN, through a direct LISTEN_DATABASE beside pooled slots, and polling only.
        latency = {}
        for path, notify, listen in (
            ("direct", True, False),
            ("pgbouncer+LISTEN_DATABASE", True, True),
            ("pgbouncer, polling only", False, False),
        ):
            env = dict(os.environ)
            if path != "direct":
                env["DATABASE_URL"] = bouncer.url
            if listen:
                env["BENCH_LISTEN_DATABASE_URL"] = os.environ["DATABASE_URL"]
            ctx = bench.Ctx(_ctx().server, os.environ["DATABASE_URL"], env, logs, sys.executable)
            latency[path] = bench.latency(
                ctx,
                100,
                notify=notify,
                poll_interval=1.0,
                slots=4,
                gap=0.05,
                tag=f"pooler-{len(latency)}",
            )
            print(
                path, {k: latency[path].get(k) for k in ("p50_ms", "p99_ms", "error")}, flush=True
            )
    finally:
        bouncer.stop()
    out = {
        "n": args.n,
        "repeat": args.repeat,
        "pgbouncer_log_tail": bouncer.log()[-3000:],
        "runs": runs,
        "latency": latency,
    }
    for key, values in runs.items():
        rates = [r["per_second"] for r in values if r.get("per_second") and r.get("verified")]
        out[f"{key}_median"] = statistics.median(rates) if rates else None
    for slots in (1, 4):
        direct, pooled = out.get(f"direct_{slots}_median"), out.get(f"pgbouncer_{slots}_median")
        out[f"cost_{slots}"] = (pooled / direct - 1) if direct and pooled else None
    return out


# ---------------------------------------------------------------------------------------
# the results file
# ---------------------------------------------------------------------------------------


def summarize_size(entry: dict) -> dict:
    dr = entry.get("dequeue_reconcile", {})
    ret = entry.get("retention", {})
    return {
        "size": entry["size"],
        "dequeue1_exec_ms": dr.get("dequeue_exec_p50_ms"),
        "dequeue1_client_ms": dr.get("dequeue_p50_ms"),
        "dequeue8_exec_ms": entry.get("dequeue8_exec_ms"),
        "reconcile_pass_ms": dr.get("reconcile_p50_ms"),
        "retention_idle_exec_ms": ret.get("idle_exec_p50_ms"),
        "retention_idle_pass_ms": ret.get("idle_pass_p50_ms"),
        "retention_batch_ms": ret.get("batch_p50_ms"),
        "retention_rows_per_s": ret.get("rows_per_second"),
        "total_mb": entry.get("table", {}).get("total_mb"),
        "stats_ms": entry.get("stats_scrape", {}).get("stats", {}).get("client_p50_ms"),
        "stats_server_ms": entry.get("stats_scrape", {}).get("stats", {}).get("server_ms"),
        "scrape_ms": entry.get("stats_scrape", {}).get("scrape", {}).get("client_p50_ms"),
        "scrape_server_ms": entry.get("stats_scrape", {}).get("scrape", {}).get("server_ms"),
    }


def _f(value, digits=2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def render_summary(results: dict) -> str:
    lines = []
    size = results.get("size", {})
    if size.get("sizes"):
        lines.append(
            "| finished rows | DEQUEUE 1 / 8 (server ms) | reconciler pass (ms) | retention, "
            "nothing due "
            "(server ms / pass ms) | retention batch of 5,000 (ms) | delete rows/s | table MB |"
        )
        lines.append("|---:|---:|---:|---:|---:|---:|---:|")
        for entry in size["sizes"]:
            s = summarize_size(entry)
            lines.append(
                f"| {s['size']:,} | {_f(s['dequeue1_exec_ms'], 3)} / "
                f"{_f(s['dequeue8_exec_ms'], 3)} | "
                f"{_f(s['reconcile_pass_ms'])} | {_f(s['retention_idle_exec_ms'], 3)} / "
                f"{_f(s['retention_idle_pass_ms'])} | {_f(s['retention_batch_ms'], 0)} | "
                f"{_f(s['retention_rows_per_s'], 0)} | {_f(s['total_mb'], 0)} |"
            )
        lines.append("")
        lines.append(
            "| finished rows | `durable_jobs stats`: call / server (ms) | < 100 ms | Prometheus "
            "scrape: call / server (ms) | < 100 ms | statements per call | finished counts |"
        )
        lines.append("|---:|---:|---|---:|---|---:|---|")
        for entry in size["sizes"]:
            live = entry.get("backlog", {}).get("jobs", 0)
            for key, label in (
                ("stats_scrape", f"{entry['size']:,}"),
                ("stats_scrape_backlog", f"{entry['size']:,} + {live:,} live"),
            ):
                if key not in entry:
                    continue
                lines.append(_stats_row(label, entry[key]))
    elif "size" in results:
        lines.append(f"size: {size}")
    ingest = results.get("ingest")
    if ingest and "error" not in ingest:
        lines.append("")
        lines.append(
            f"ingest: {_f(ingest['achieved_rate'], 0)} jobs/s for {_f(ingest['seconds'], 0)} s "
            f"(target {ingest['rate_target']:,}), RETENTION {ingest['retention_s']:.0f} s: "
            f"{ingest['deleted']:,} of {ingest['inserted']:,} deleted; steady total size "
            f"{_f(ingest['steady_total_mb_first'], 0)} -> {_f(ingest['steady_total_mb_last'], 0)} "
            "MB, "
            f"heap {_f(ingest['steady_heap_mb_min'], 0)}-{_f(ingest['steady_heap_mb_max'], 0)} MB; "
            f"dead tuples max {_f(ingest['dead_max'])}; rows past retention (steady, max) "
            f"{_f(ingest['past_retention_max_steady'])}; after the first vacuum "
            f"({_f(ingest.get('after_first_vacuum_seconds'), 0)} s) total "
            f"{'-'.join(_f(v, 0) for v in ingest.get('after_first_vacuum_total_mb') or [])} MB "
            "over "
            f"{ingest.get('autovacuums')} autovacuums, base {ingest.get('base_rows', 0):,} rows; "
            "retention pass p50/max "
            f"{_f(ingest['retention_pass_p50_ms'], 0)}/{_f(ingest['retention_pass_max_ms'], 0)} ms"
        )
    elif ingest:
        lines.append(f"ingest: {ingest}")
    pooler = results.get("pooler")
    if pooler and "error" not in pooler:
        lines.append("")
        for slots in (1, 4):
            lines.append(
                f"pooler, {slots} slot(s): direct {_f(pooler.get(f'direct_{slots}_median'), 0)} "
                f"jobs/s, PgBouncer {_f(pooler.get(f'pgbouncer_{slots}_median'), 0)} jobs/s "
                f"({_f((pooler.get(f'cost_{slots}') or 0) * 100, 1)} %)"
            )
        for path, result in (pooler.get("latency") or {}).items():
            lines.append(
                f"latency, {path}: p50 {_f(result.get('p50_ms'))} ms, p99 "
                f"{_f(result.get('p99_ms'))} ms"
                + (f" ({result['error']})" if result.get("error") else "")
            )
    elif pooler:
        lines.append(f"pooler: {pooler}")
    return "\n".join(lines)


def _verdict(ms) -> str:
    return "—" if ms is None else ("PASS" if ms < 100 else "**MISS**")


def _stats_row(label: str, data: dict) -> str:
    if "stats" not in data:
        return f"| {label} | {data} | | | | | |"
    st, sc = data["stats"], data["scrape"]
    answer = data.get("answer", {})
    counts = "estimated" if answer.get("estimated") else "exact"
    return (
        f"| {label} | {_f(st['client_p50_ms'], 1)} / {_f(st['server_ms'], 1)} | "
        f"{_verdict(st['client_p50_ms'])} | "
        f"{_f(sc['client_p50_ms'], 1)} / {_f(sc['server_ms'], 1)} | "
        f"{_verdict(sc['client_p50_ms'])} | "
        f"{len(st['statements'])} / {len(sc['statements'])} | {counts} "
        f"(completed {_f(answer.get('completed'))} of "
        f"{_f(data.get('exact', {}).get('completed'))}) |"
    )


def _statement_plans(title: str, data: dict) -> list[str]:
    parts = []
    for name in ("stats", "scrape"):
        call = data.get(name)
        if not call:
            continue
        parts += [
            f"### {title}: {'durable_jobs stats' if name == 'stats' else 'Prometheus scrape'}, "
            f"call {call['client_p50_ms']:.1f} ms (median of {len(call['client_ms'])}), server "
            f"{call['server_ms']:.2f} ms over {len(call['statements'])} statements",
            "",
        ]
        for i, st in enumerate(call["statements"], 1):
            exec_ms = st.get("exec_p50_ms")
            parts += [
                f"{i}. client {st['client_ms']:.2f} ms, server "
                f"{'—' if exec_ms is None else f'{exec_ms:.3f} ms'}",
                "",
                "```",
                st["sql"].strip(),
            ]
            if st.get("plan"):
                parts += ["", st["plan"]]
            parts += ["```", ""]
    return parts


def render(results: dict) -> str:
    parts = [
        f"# Scale and pooler benchmark, {results['started']}",
        "",
        "Shared machine (2 cores, other jobs running): figures are noisy; compare within the run.",
        "",
        render_summary(results),
        "",
        "## Servers",
        "",
        "```",
        json.dumps(results.get("server"), indent=2),
        json.dumps(results.get("ingest_server"), indent=2),
        "```",
        "",
    ]
    for entry in results.get("size", {}).get("sizes", []):
        parts += [f"## Plans at {entry['size']:,} finished rows", ""]
        plans = dict(entry.get("dequeue_reconcile", {}).get("plans", {}))
        plans["DEQUEUE (limit 8)"] = entry.get("dequeue8_plan")
        plans["DELETE_FINISHED (nothing past RETENTION)"] = entry.get("retention", {}).get(
            "idle_plan"
        )
        plans["DELETE_FINISHED (a batch of 5,000 real deletes)"] = entry.get("retention", {}).get(
            "delete_plan"
        )
        for name, plan in plans.items():
            if plan:
                parts += [f"### {name}", "", "```", plan, "```", ""]
        if entry.get("stats_scrape"):
            parts += _statement_plans(f"{entry['size']:,} finished rows", entry["stats_scrape"])
        if entry.get("stats_scrape_backlog"):
            parts += [f"Live backlog added: `{json.dumps(entry.get('backlog'))}`", ""]
            parts += _statement_plans(
                f"{entry['size']:,} finished rows + live backlog", entry["stats_scrape_backlog"]
            )
    ingest = results.get("ingest")
    if ingest and ingest.get("samples"):
        header = (
            "| t (s) | inserted | deleted | live | dead | past retention | heap MB | indexes MB | "
            "total MB | autovacuums |"
        )
        parts += [
            "## Ingest samples",
            "",
            header,
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in ingest["samples"]:
            parts.append(
                f"| {s['t']} | {s['inserted']:,} | {s['deleted']:,} | {s['n_live_tup']:,} | "
                f"{s['n_dead_tup']:,} | {s['past_retention']:,} | {s['heap_mb']:.0f} | "
                f"{s['indexes_mb']:.0f} | {s['total_mb']:.0f} | {s['autovacuum_count']} |"
            )
        parts.append("")
        parts.append(f"Table storage parameters: `{ingest.get('reloptions')}`")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.exit(main())
