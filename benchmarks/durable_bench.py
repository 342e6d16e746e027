"""The durable_jobs scenarios. Imported after ``django.setup()`` by ``benchmarks.run``.

Every figure is computed from the database: completions are counted in SQL, latencies
are ``started_at - created_at`` (both stamped by the database clock) computed in SQL,
throughput is completed rows over the database-clock window from the first claim to the
last completion.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from django.db import connection, transaction

import durable_jobs as durable
from benchmarks import procs
from durable_jobs import conf, store
from durable_jobs.states import Lease

TABLE = "durable_jobs_job"
KIND = "bench.noop"
REPO = Path(__file__).resolve().parent.parent

#: Whether a pending or running job is left, read off the partial indexes of live rows
#: (a walk that stops at the first): the poll of every wait for a fleet to finish. The
#: count of every row not completed it replaced read the whole table each time: on a
#: 40,000-job drain 40-50 ms of the server a poll, every 50 ms, CPU taken from the fleet
#: being measured (docs/performance.rst, "The drain's own poll").
ANY_LIVE = (
    f"SELECT EXISTS (SELECT FROM {TABLE} WHERE status = 'pending') "
    f"OR EXISTS (SELECT FROM {TABLE} WHERE status = 'running')"
)


class Ctx:
    """What every scenario needs: the server, the measuring connection, env, paths."""

    def __init__(
        self, server, dburl: str, env: dict, logs: Path, python: str, *, execution: str = "process"
    ) -> None:
        self.server = server
        self.execution = execution
        self.dburl = dburl
        self.env = env
        self.logs = logs
        self.python = python

    def sql(self, query: str, params=None):
        """Run a measuring query on a fresh autocommit connection (never the Django one)."""
        import psycopg

        with psycopg.connect(self.dburl, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else None

    def worker_cmd(
        self, concurrency: int, *, burst: bool, verbosity: int = 1, execution: str | None = None
    ) -> list[str]:
        cmd = [
            self.python,
            "manage.py",
            "durable_worker",
            "--concurrency",
            str(concurrency),
            "-v",
            str(verbosity),
            "--execution",
            execution or self.execution,
        ]
        return cmd + (["--burst"] if burst else [])

    def worker_env(
        self, *, notify: bool = True, poll_interval: float = 1.0, conn_max_age: str | None = None
    ) -> dict:
        env = dict(self.env)
        env["BENCH_NOTIFY"] = "1" if notify else "0"
        env["BENCH_POLL_INTERVAL"] = repr(poll_interval)
        env["BENCH_CONN_MAX_AGE"] = conn_max_age or ""
        return env


def reset() -> None:
    # CASCADE: the Tasks backend's attempt table references the job table.
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {TABLE} CASCADE")


def fill(n: int, *, batch: int = 500) -> float:
    """Start ``n`` no-op jobs through the public API, ``batch`` per transaction; return seconds."""
    began = time.perf_counter()
    done = 0
    while done < n:
        chunk = min(batch, n - done)
        with transaction.atomic():
            for _ in range(chunk):
                durable.start(KIND)
        done += chunk
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {TABLE}")
    return time.perf_counter() - began


# ---------------------------------------------------------------------------------------
# start rate
# ---------------------------------------------------------------------------------------


def start_rate(n: int, *, atomic: bool = True, prepare_threshold: int | None = None) -> dict:
    """One ``durable.start()`` per transaction, one client (this process).

    ``atomic``: inside ``transaction.atomic()``, as beside domain rows (BEGIN, the insert,
    COMMIT: three round trips); otherwise in autocommit, where the start is one statement
    and its own transaction (one round trip), as a peer's enqueue is.
    ``prepare_threshold``: the connection's, as ``DATABASES[...]["OPTIONS"]["prepare_threshold"]``
    sets it (the opt-in to prepared statements; Django's default None prepares nothing).
    """
    reset()
    connection.ensure_connection()
    before = connection.connection.prepare_threshold
    connection.connection.prepare_threshold = prepare_threshold
    try:
        return _start_rate(n, atomic=atomic)
    finally:
        connection.connection.prepare_threshold = before


def _start_rate(n: int, *, atomic: bool) -> dict:
    with transaction.atomic() if atomic else contextlib.nullcontext():
        durable.start(KIND)  # warm the connection and the code paths
    times = []
    began = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        if atomic:
            with transaction.atomic():
                durable.start(KIND)
        else:
            durable.start(KIND)
        times.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - began
    return {
        "n": n,
        "seconds": elapsed,
        "per_second": n / elapsed,
        "p50_ms": _pct(times, 50) * 1000,
        "p99_ms": _pct(times, 99) * 1000,
    }


def bulk_start(n: int) -> dict:
    """``durable.start_many`` if the API exists; otherwise reported as not implemented."""
    start_many = getattr(durable, "start_many", None)
    if start_many is None:
        try:
            from durable_jobs import service

            start_many = getattr(service, "start_many", None)
        except ImportError:
            start_many = None
    if start_many is None:
        return {"implemented": False}
    import inspect

    reset()
    params = list(inspect.signature(start_many).parameters)
    began = time.perf_counter()
    try:
        with transaction.atomic():
            if params and params[0] == "kind":
                start_many(KIND, [None] * n)
            else:
                start_many([{"kind": KIND, "input": None} for _ in range(n)])
    except Exception as error:  # noqa: BLE001 - an API we did not write: report, never guess
        return {"implemented": True, "error": f"{type(error).__name__}: {error}"[:300]}
    elapsed = time.perf_counter() - began
    count = _count_kind()
    return {
        "implemented": True,
        "n": n,
        "rows": count,
        "seconds": elapsed,
        "per_second": n / elapsed,
    }


def _count_kind() -> int:
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {TABLE} WHERE kind = %s", [KIND])
        return cur.fetchone()[0]


# ---------------------------------------------------------------------------------------
# throughput
# ---------------------------------------------------------------------------------------


def throughput(
    ctx: Ctx,
    n: int,
    *,
    processes: int,
    slots: int,
    tag: str,
    timeout: float,
    conn_max_age: str | None = None,
) -> dict:
    """Pre-fill ``n`` jobs (one INSERT … SELECT of the rows ``start()`` writes), then run
    ``processes`` × ``durable_worker --concurrency slots --burst`` against them."""
    reset()
    began = time.perf_counter()
    fill_pending_sql(ctx, n)
    fill_seconds = time.perf_counter() - began
    return throughput_prefilled(
        ctx,
        n,
        processes=processes,
        slots=slots,
        tag=tag,
        timeout=timeout,
        conn_max_age=conn_max_age,
    ) | {"fill_seconds": fill_seconds}


def throughput_prefilled(
    ctx: Ctx,
    n: int,
    *,
    processes: int,
    slots: int,
    tag: str,
    timeout: float,
    conn_max_age: str | None = None,
    prefix: list[str] | None = None,
    execution: str | None = None,
    extra_env: dict | None = None,
) -> dict:
    cpu0 = procs.server_cpu_seconds(ctx.server.postmaster_pid())
    cmds = [
        (prefix or []) + ctx.worker_cmd(slots, burst=True, execution=execution)
        for _ in range(processes)
    ]
    logs = [ctx.logs / f"durable-{tag}-{i}.log" for i in range(processes)]
    env = ctx.worker_env(conn_max_age=conn_max_age) | (extra_env or {})
    group = procs.Group(cmds, env=env, cwd=REPO, logs=logs)
    results = group.wait(timeout)
    cpu1 = procs.server_cpu_seconds(ctx.server.postmaster_pid())
    row = ctx.sql(
        f"""SELECT count(*) FILTER (WHERE status = 'completed'), count(*),
                   extract(epoch FROM max(finished_at) - min(started_at))
              FROM {TABLE} WHERE kind = %s""",
        [KIND],
    )[0]
    completed, total, window = row
    return procs.drain_figures(
        results,
        n=n,
        completed=completed,
        rows=total,
        window=window,
        server_cpu=(cpu0, cpu1),
        logs=logs,
    ) | {
        "processes": processes,
        "slots_per_process": slots,
        "conn_max_age": conn_max_age or "0 (Django default)",
    }


# ---------------------------------------------------------------------------------------
# latency
# ---------------------------------------------------------------------------------------


def latency(
    ctx: Ctx,
    m: int,
    *,
    notify: bool,
    poll_interval: float,
    slots: int,
    gap: float,
    tag: str,
    conn_max_age: str | None = None,
) -> dict:
    """``m`` single starts, spaced ``gap`` s apart on average, to an idle worker."""
    reset()
    env = ctx.worker_env(notify=notify, poll_interval=poll_interval, conn_max_age=conn_max_age)
    group = procs.Group(
        [ctx.worker_cmd(slots, burst=False)],
        env=env,
        cwd=REPO,
        logs=[ctx.logs / f"durable-latency-{tag}.log"],
    )
    try:
        problem = _warm_up(ctx, group, notify=notify)
        if problem:
            return {"error": problem}
        warm_ids = [r[0] for r in ctx.sql(f"SELECT id FROM {TABLE}")]
        rng = random.Random(6)
        for _ in range(m):
            with transaction.atomic():
                durable.start(KIND)
            time.sleep(rng.uniform(gap / 2, gap * 1.5))
        deadline = time.monotonic() + max(30.0, poll_interval * 5)
        while time.monotonic() < deadline:
            if not ctx.sql(ANY_LIVE)[0][0]:
                break
            time.sleep(0.1)
    finally:
        results = group.stop()
    return _latency_sql(ctx, warm_ids, m) | {
        "worker_exit": results[0].exit_code,
        "max_rss_mib": results[0].max_rss_kib / 1024,
    }


def _warm_up(ctx: Ctx, group: procs.Group, *, notify: bool) -> str | None:
    deadline = time.monotonic() + 60
    for _ in range(3):
        with transaction.atomic():
            durable.start(KIND)
    while time.monotonic() < deadline:
        if not group.alive():
            return f"worker exited during warm-up: {procs.tail(group.logs[0])}"
        done = ctx.sql(f"SELECT count(*) FROM {TABLE} WHERE status = 'completed'")[0][0]
        listening = (not notify) or ctx.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query "
            "ILIKE 'LISTEN %%'"
        )[0][0] > 0
        if done >= 3 and listening:
            return None
        time.sleep(0.1)
    return "worker not ready after 60 s (warm-up jobs not completed or no LISTEN connection)"


def _latency_sql(ctx: Ctx, warm_ids: list, m: int) -> dict:
    row = ctx.sql(
        f"""SELECT count(*),
                   count(*) FILTER (WHERE status = 'completed'),
                   percentile_cont(0.5) WITHIN GROUP
                       (ORDER BY extract(epoch FROM started_at - created_at)),
                   percentile_cont(0.99) WITHIN GROUP
                       (ORDER BY extract(epoch FROM started_at - created_at)),
                   max(extract(epoch FROM started_at - created_at)),
                   avg(extract(epoch FROM started_at - created_at))
              FROM {TABLE} WHERE NOT (id = ANY(%s))""",
        [warm_ids],
    )[0]
    count, completed, p50, p99, worst, mean = row
    return {
        "m": m,
        "rows": count,
        "completed": completed,
        "p50_ms": _ms(p50),
        "p99_ms": _ms(p99),
        "max_ms": _ms(worst),
        "mean_ms": _ms(mean),
        "verified": count == m and completed == m,
    }


def _ms(seconds) -> float | None:
    return None if seconds is None else float(seconds) * 1000


# ---------------------------------------------------------------------------------------
# heartbeat
# ---------------------------------------------------------------------------------------


def heartbeat(ctx: Ctx, seconds: float) -> dict:
    """``store.heartbeat`` in a loop on one lease; the HOT share of the updates it made."""
    reset()
    with transaction.atomic():
        durable.start(KIND, queue="bench_heartbeat")
    ttl_ms = conf.ms(conf.get().LEASE_TTL)
    claimed = store.dequeue(
        ["bench_heartbeat"], f"bench:{uuid.uuid4().hex[:6]}", ttl_ms, kinds=None, limit=1
    )
    if not claimed:
        return {"error": "could not claim the heartbeat job"}
    job = claimed[0]
    lease = Lease(job_id=job.id, owner=job.lease_owner, epoch=job.lease_epoch, ttl_ms=ttl_ms)
    before = _table_stats(ctx)
    beats = 0
    lost = 0
    began = time.perf_counter()
    deadline = began + seconds
    while time.perf_counter() < deadline:
        if store.heartbeat(lease, processed=beats) is None:
            lost += 1
        beats += 1
    elapsed = time.perf_counter() - began
    after = _table_stats(ctx)
    upd = after[0] - before[0]
    hot = after[1] - before[1]
    return {
        "beats": beats,
        "seconds": elapsed,
        "per_second": beats / elapsed,
        "lost": lost,
        "n_tup_upd": upd,
        "n_tup_hot_upd": hot,
        "hot_share": hot / upd if upd else None,
    }


def _table_stats(ctx: Ctx) -> tuple[int, int]:
    # The updating backend (Django's connection) flushes its pending counters now; a fresh
    # connection then reads them (a session caches what it read within a transaction).
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(0.05)
    row = ctx.sql(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s", [TABLE]
    )[0]
    return int(row[0]), int(row[1])


# ---------------------------------------------------------------------------------------
# table size: dequeue and reconciler with many finished rows
# ---------------------------------------------------------------------------------------

FILL_FINISHED = f"""
INSERT INTO {TABLE} (id, tenant_id, kind, status, created_at, updated_at, queue_name, lease_epoch,
                     started_at, finished_at, heartbeat_at, lease_expires_at, domain_mirrored_at)
SELECT gen_random_uuid(), 'default', %(kind)s, 'completed', t - interval '2 seconds', t, 'default',
  1,
       t - interval '1 second', t, t - interval '1 second', t, t
  FROM (SELECT clock_timestamp() - random() * interval '7 days' AS t
          FROM generate_series(1, %(n)s)) AS finished
"""


def grow_finished(ctx: Ctx, target: int) -> dict:
    """Bring the number of finished rows to ``target`` with one INSERT … SELECT generate_series."""
    have = ctx.sql(f"SELECT count(*) FROM {TABLE} WHERE status = 'completed'")[0][0]
    began = time.perf_counter()
    if target > have:
        ctx.sql(FILL_FINISHED, {"kind": KIND, "n": target - have})
    ctx.sql(f"VACUUM (ANALYZE) {TABLE}")
    size = ctx.sql(f"SELECT pg_size_pretty(pg_total_relation_size('{TABLE}'))")[0][0]
    return {
        "finished_rows": target,
        "fill_seconds": time.perf_counter() - began,
        "total_size": size,
    }


# Pending rows exactly as start() writes them (no keys, no subject, due now), for backlogs
# too large to start one by one in the time a benchmark has.
FILL_PENDING = f"""
INSERT INTO {TABLE} (id, tenant_id, kind, status, created_at, updated_at, queue_name,
                     next_run_at, pending_since)
SELECT gen_random_uuid(), 'default', %(kind)s, 'pending', now(), now(), 'default',
       clock_timestamp(), now()
  FROM generate_series(1, %(n)s)
"""


def fill_pending_sql(ctx: Ctx, n: int) -> None:
    ctx.sql(FILL_PENDING, {"kind": KIND, "n": n})
    ctx.sql(f"VACUUM (ANALYZE) {TABLE}")


def _no_flush_wait() -> None:
    """``synchronous_commit = off`` for this session: the size scenarios measure what the table's
    size does to a statement, not the WAL flush every autocommit UPDATE also waits for (on a
    shared disk that flush varies more than everything else put together)."""
    with connection.cursor() as cur:
        cur.execute("SET synchronous_commit TO off")


def _flush_wait_again() -> None:
    with connection.cursor() as cur:
        cur.execute("RESET synchronous_commit")


def dequeue_backlog(ctx: Ctx, backlog: int, *, reps: int, explain_reps: int) -> dict:
    """Time ``store.dequeue`` (limit 1, as a slot calls it) with ``backlog`` pending jobs due."""
    reset()
    fill_pending_sql(ctx, backlog + 20 + reps)
    _no_flush_wait()
    settings = conf.get()
    ttl_ms = conf.ms(settings.LEASE_TTL)
    owner = f"bench:{uuid.uuid4().hex[:6]}"
    queues = [settings.DEFAULT_QUEUE]
    for _ in range(20):
        store.dequeue(queues, owner, ttl_ms, kinds=None, limit=1)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        store.dequeue(queues, owner, ttl_ms, kinds=None, limit=1)
        times.append(time.perf_counter() - t0)
    params = store.claim_params(queues, owner, ttl_ms, kinds=None)
    exec_ms = [_explain_time(store.DEQUEUE, params) for _ in range(explain_reps)]
    _flush_wait_again()
    return {
        "backlog": backlog,
        "dequeue_p50_ms": _pct(times, 50) * 1000,
        "dequeue_exec_p50_ms": _pct(exec_ms, 50),
        "plan": _explain_text(store.DEQUEUE, params),
    }


def dequeue_and_reconcile(ctx: Ctx, *, reps: int, passes: int, explain_reps: int) -> dict:
    """Time ``store.dequeue`` (one row per call, as a slot calls it) and reconciler passes."""
    from durable_jobs.runtime.reconciler import Reconciler

    with connection.cursor() as cur:  # leftovers of the previous size
        cur.execute(f"DELETE FROM {TABLE} WHERE status <> 'completed'")
    warm = 20
    pending = warm + reps + explain_reps + 5
    with transaction.atomic():
        for _ in range(pending):
            durable.start(KIND)
    ctx.sql(f"ANALYZE {TABLE}")
    settings = conf.get()
    ttl_ms = conf.ms(settings.LEASE_TTL)
    owner = f"bench:{uuid.uuid4().hex[:6]}"
    queues = [settings.DEFAULT_QUEUE]
    _no_flush_wait()
    for _ in range(warm):
        store.dequeue(queues, owner, ttl_ms, kinds=None, limit=1)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        got = store.dequeue(queues, owner, ttl_ms, kinds=None, limit=1)
        times.append(time.perf_counter() - t0)
        assert got, "ran out of pending jobs"
    dequeue_params = store.claim_params(queues, owner, ttl_ms, kinds=None)
    exec_ms = [_explain_time(store.DEQUEUE, dequeue_params) for _ in range(explain_reps)]
    plans = {"DEQUEUE": _explain_text(store.DEQUEUE, dequeue_params)}

    reconciler = Reconciler()
    reconciler.run_pass()
    pass_times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        reconciler.run_pass()
        pass_times.append(time.perf_counter() - t0)
    grace_ms = conf.ms(settings.ORPHAN_GRACE)
    candidates = {
        "SELECT_CANCELLING": {"grace_ms": grace_ms, "limit": 100, "tenant": None},
        "SELECT_ORPHANS": {"grace_ms": grace_ms, "limit": 100, "tenant": None},
        "SELECT_STALE_PENDING": {
            "pending_ttl_ms": conf.ms(settings.PENDING_TTL),
            "limit": 100,
            "tenant": None,
        },
        "COUNT_STALE_PENDING": {"pending_ttl_ms": conf.ms(settings.PENDING_TTL), "tenant": None},
        "DELETE_FINISHED": {
            "older_than_ms": conf.ms(settings.RETENTION or 30 * 86400),
            "limit": 1000,
            "tenant": None,
        },
    }
    for name, params in candidates.items():
        sql = getattr(store, name, None)
        if sql is None:
            plans[name] = f"(store.{name} does not exist in this version)"
            continue
        try:
            plans[name] = _explain_text(sql, params)
        except Exception as error:  # noqa: BLE001 - statements evolve; report instead of failing
            plans[name] = f"(EXPLAIN failed: {type(error).__name__}: {error})"
    # What-if (no library change): the retention DELETE with now() — stable, so the planner
    # can use the finished_at index — instead of the volatile clock_timestamp().
    retention = {}
    delete_sql = getattr(store, "DELETE_FINISHED", None)
    if delete_sql is not None:
        params = candidates["DELETE_FINISHED"]
        variant = delete_sql.replace("finished_at < clock_timestamp()", "finished_at < now()")
        try:
            retention = {
                "as_written_ms": _pct([_explain_time(delete_sql, params) for _ in range(5)], 50),
                "with_now_ms": _pct([_explain_time(variant, params) for _ in range(5)], 50),
                "variant_differs": variant != delete_sql,
            }
        except Exception as error:  # noqa: BLE001
            retention = {"error": f"{type(error).__name__}: {error}"}
    _flush_wait_again()
    return {
        "retention_delete": retention,
        "dequeue_p50_ms": _pct(times, 50) * 1000,
        "dequeue_p90_ms": _pct(times, 90) * 1000,
        "dequeue_mean_ms": statistics.fmean(times) * 1000,
        "dequeue_exec_p50_ms": _pct(exec_ms, 50),
        "dequeue_exec_values_ms": exec_ms,
        "reconcile_p50_ms": _pct(pass_times, 50) * 1000,
        "reconcile_max_ms": max(pass_times) * 1000,
        "reps": reps,
        "passes": passes,
        "plans": plans,
    }


def _explain(sql: str, params: dict, options: str):
    """EXPLAIN ANALYZE a statement inside a transaction that is rolled back."""
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(f"EXPLAIN ({options}) {sql}", params)
            rows = cur.fetchall()
        transaction.set_rollback(True)
    return rows


def _explain_text(sql: str, params: dict) -> str:
    return "\n".join(r[0] for r in _explain(sql, params, "ANALYZE, BUFFERS, VERBOSE OFF, SETTINGS"))


def _explain_time(sql: str, params: dict) -> float:
    data = _explain(sql, params, "ANALYZE, FORMAT JSON")[0][0]
    if isinstance(data, str):
        data = json.loads(data)
    return float(data[0]["Execution Time"])


def _pct(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * pct / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


# ---------------------------------------------------------------------------------------
# scale: the throughput curve by total slots, claim contention, NOTIFY wake-ups
# ---------------------------------------------------------------------------------------


#: How ``ActivitySampler`` names a statement in ``pg_stat_activity``: the first words of
#: the claim's and the completions' texts (client-bound, so the values are in them).
STATEMENT_KINDS = (
    ("claim", "WITH queues AS MATERIALIZED"),
    ("batched completion", f"UPDATE {TABLE} AS j SET status = 'completed'"),
    ("one-row completion", f"UPDATE {TABLE} SET status = 'completed'"),
)


def statement_kind(query: str) -> str:
    """``claim``, ``batched completion``, ``one-row completion`` or ``other``."""
    text = " ".join(query.split())
    return next((kind for kind, head in STATEMENT_KINDS if text.startswith(head)), "other")


class ActivitySampler:
    """Sample ``pg_stat_activity`` of the benchmark database every ``every`` seconds in a thread:
    how many backends wait on a lock (claim contention beyond SKIP LOCKED), and what each
    kind of statement is doing while it runs (``waits``: the average number of active
    backends per statement kind and wait event; "CPU" when none, which is on the CPU or
    waiting for one)."""

    def __init__(self, ctx: Ctx, every: float = 0.05) -> None:
        import threading

        import psycopg

        self.samples = 0
        self.lock_waits = 0  # sum over samples of backends waiting on a heavyweight lock
        self.worst = 0
        self.waits: collections.Counter[tuple[str, str]] = collections.Counter()
        self._stop = threading.Event()
        self._conn = psycopg.connect(ctx.dburl, autocommit=True)
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            rows = self._conn.execute(
                "SELECT wait_event_type, wait_event, left(query, 120) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND state = 'active'"
            ).fetchall()
            locked = 0
            for wait_type, wait_event, query in rows:
                locked += wait_type == "Lock"
                event = f"{wait_type}:{wait_event}" if wait_type else "CPU"
                self.waits[(statement_kind(query or ""), event)] += 1
            self.samples += 1
            self.lock_waits += locked
            self.worst = max(self.worst, locked)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=5)
        self._conn.close()
        samples = max(1, self.samples)
        return {
            "samples": self.samples,
            "lock_waiting_backends_mean": self.lock_waits / samples,
            "lock_waiting_backends_max": self.worst,
            "waits": {
                f"{kind} / {event}": round(count / samples, 3)
                for (kind, event), count in self.waits.most_common()
            },
        }


def _xacts(ctx: Ctx) -> int:
    """Committed + rolled back transactions of the benchmark database so far (every DEQUEUE
    call of an autocommit slot is one, found something or not)."""
    time.sleep(
        0.6
    )  # backends flush their counters at most once a second when idle; exited ones at exit
    row = ctx.sql(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = "
        "current_database()"
    )
    return int(row[0][0])


def scale_point(ctx: Ctx, n: int, *, processes: int, slots: int, tag: str, timeout: float) -> dict:
    """One point of the curve: ``n`` pre-filled no-op jobs drained by processes × slots."""
    reset()
    fill_pending_sql(ctx, n)
    before = _xacts(ctx)
    sampler = ActivitySampler(ctx)
    try:
        out = throughput_prefilled(
            ctx, n, processes=processes, slots=slots, tag=f"scale-{tag}", timeout=timeout
        )
    finally:
        activity = sampler.stop()
    after = _xacts(ctx)
    # Each claim transaction that found nothing is a SKIP LOCKED miss or an empty look; per
    # job, the worker's transactions are its claims, its completions and those empty looks.
    # started_at is the claim transaction's now(): one value per claim statement that got rows.
    claims = ctx.sql(f"SELECT count(DISTINCT started_at) FROM {TABLE} WHERE kind = %s", [KIND])[0][
        0
    ]
    return (
        out
        | activity
        | {
            "transactions": after - before,
            "transactions_per_job": (after - before) / n,
            "claim_statements": claims,
        }
    )


def wakeups(ctx: Ctx, m: int, *, processes: int, slots: int, gap: float, tag: str) -> dict:
    """``m`` single starts to an idle fleet of processes × slots: the fleet's transactions per
    start (each woken slot runs at least one DEQUEUE transaction) and the start-to-run latency."""
    reset()
    cmds = [ctx.worker_cmd(slots, burst=False) for _ in range(processes)]
    logs = [ctx.logs / f"durable-wakeups-{tag}-{i}.log" for i in range(processes)]
    group = procs.Group(cmds, env=ctx.worker_env(), cwd=REPO, logs=logs)
    try:
        problem = _warm_up(ctx, group, notify=True)
        if problem:
            return {"error": problem}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # every process listening
            listening = ctx.sql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE '%%durable-listener'"
            )[0][0]
            if listening >= processes:
                break
            time.sleep(0.2)
        time.sleep(2.0)  # the wake-up pass after each LISTEN is over; the fleet is asleep
        warm_ids = [r[0] for r in ctx.sql(f"SELECT id FROM {TABLE}")]
        before = _xacts(ctx)
        rng = random.Random(14)
        for _ in range(m):
            with transaction.atomic():
                durable.start(KIND)
            time.sleep(rng.uniform(gap / 2, gap * 1.5))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not ctx.sql(ANY_LIVE)[0][0]:
                break
            time.sleep(0.1)
        time.sleep(1.0)
        after = _xacts(ctx)
    finally:
        group.stop()
    # The m starts' own transactions (this process) are in the count too: take them out.
    return _latency_sql(ctx, warm_ids, m) | {
        "slots_total": processes * slots,
        "fleet_transactions_per_start": (after - before - m) / m,
    }


# ---------------------------------------------------------------------------------------
# priorities: 100,000 due jobs across priorities
# ---------------------------------------------------------------------------------------

FILL_PRIORITIES = f"""
INSERT INTO {TABLE} (id, tenant_id, kind, status, created_at, updated_at, queue_name,
                     priority, next_run_at, pending_since)
SELECT gen_random_uuid(), 'default', %(kind)s, 'pending', now(), now(), 'default',
       (random() * 20)::int - 10, clock_timestamp() - random() * interval '1 hour', now()
  FROM generate_series(1, %(n)s)
"""

#: Work scheduled for later at the top priority (retries in backoff, held waits, schedules).
FILL_LATER = f"""
INSERT INTO {TABLE} (id, tenant_id, kind, status, created_at, updated_at, queue_name,
                     priority, next_run_at, pending_since)
SELECT gen_random_uuid(), 'default', %(kind)s, 'pending', now(), now(), 'default',
       10, clock_timestamp() + interval '1 day' + random() * interval '1 hour', now()
  FROM generate_series(1, %(n)s)
"""


def priorities(ctx: Ctx, backlog: int, *, claims: int, reps: int) -> dict:
    """``backlog`` due jobs with priorities -10..10: dequeue time (server and client) at the
    start and once ``claims`` jobs are claimed, and whether the claims came in priority order
    (higher first, then earlier due), as one slot would take them; then the dequeue time
    once as many jobs again wait for tomorrow at the top priority, ahead of every due one
    in the index."""
    reset()
    ctx.sql(FILL_PRIORITIES, {"kind": KIND, "n": backlog})
    ctx.sql(f"VACUUM (ANALYZE) {TABLE}")
    _no_flush_wait()
    settings = conf.get()
    ttl_ms = conf.ms(settings.LEASE_TTL)
    owner = f"bench:{uuid.uuid4().hex[:6]}"
    queues = [settings.DEFAULT_QUEUE]
    params = store.claim_params(queues, owner, ttl_ms, kinds=None)
    first_exec = _pct([_explain_time(store.DEQUEUE, params) for _ in range(reps)], 50)
    order = []
    times = []
    for _ in range(claims):
        t0 = time.perf_counter()
        got = store.dequeue(queues, owner, ttl_ms, kinds=None, limit=1)
        times.append(time.perf_counter() - t0)
        order.append((got[0].priority, got[0].id))
    last_exec = _pct([_explain_time(store.DEQUEUE, params) for _ in range(reps)], 50)
    _flush_wait_again()
    # The claimed rows' due times were cleared by the claim; the expected order is read back
    # from the ones still due: none of them may outrank the last one claimed.
    priorities_claimed = [p for p, _ in order]
    in_order = all(a >= b for a, b in itertools.pairwise(priorities_claimed))
    outranked = ctx.sql(
        f"SELECT count(*) FROM {TABLE} WHERE status = 'pending' AND priority > %s",
        [priorities_claimed[-1]],
    )[0][0]
    ctx.sql(FILL_LATER, {"kind": KIND, "n": backlog})
    ctx.sql(f"VACUUM (ANALYZE) {TABLE}")
    later_exec = _pct([_explain_time(store.DEQUEUE, params) for _ in range(reps)], 50)
    return {
        "dequeue_exec_with_later_ms": later_exec,
        "backlog": backlog,
        "claims": claims,
        "dequeue_exec_first_ms": first_exec,
        "dequeue_exec_after_ms": last_exec,
        "dequeue_client_p50_ms": _pct(times, 50) * 1000,
        "dequeue_client_first_100_p50_ms": _pct(times[:100], 50) * 1000,
        "dequeue_client_last_100_p50_ms": _pct(times[-100:], 50) * 1000,
        "priority_order_held": in_order and outranked == 0,
        "pending_outranking_last_claim": outranked,
    }


# ---------------------------------------------------------------------------------------
# memory: worker RSS over many jobs
# ---------------------------------------------------------------------------------------


def _tree_pids(pid: int) -> list[int]:
    """``pid`` and its children (a slot's handler process in process execution). Every
    thread's list: a handler process is the child of the slot thread that started it."""
    out = [pid]
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                children = handle.read().split()
        except OSError:
            continue
        for child in children:
            out.extend(_tree_pids(int(child)))
    return out


def memory(ctx: Ctx, n: int, *, slots: int, chunk: int, tag: str) -> dict:
    """One long-running worker drains ``n`` no-op jobs, started in chunks of ``chunk`` as it goes;
    the RSS of the worker (and of its handler processes) after each chunk."""
    reset()
    cmd = ctx.worker_cmd(slots, burst=False, verbosity=1)
    group = procs.Group(
        [cmd], env=ctx.worker_env(), cwd=REPO, logs=[ctx.logs / f"durable-memory-{tag}.log"]
    )
    curve = []
    try:
        problem = _warm_up(ctx, group, notify=True)
        if problem:
            return {"error": problem}
        pid = group.procs[0].pid
        done = 0
        began = time.perf_counter()
        while done < n:
            size = min(chunk, n - done)
            fill_pending_sql_quiet(ctx, size)
            deadline = time.monotonic() + 600
            while ctx.sql(ANY_LIVE)[0][0]:
                if time.monotonic() > deadline or not group.alive():
                    return {"error": f"worker stalled after {done} jobs", "curve": curve}
                time.sleep(0.05)
            done += size
            ctx.sql(f"DELETE FROM {TABLE} WHERE status = 'completed'")  # keep the table small
            pids = _tree_pids(pid)
            curve.append(
                {
                    "jobs": done,
                    "worker_rss_mib": procs.proc_status_kib(pid, "VmRSS") / 1024,
                    "total_rss_mib": sum(procs.proc_status_kib(p, "VmRSS") for p in pids) / 1024,
                    "processes": len(pids),
                }
            )
        seconds = time.perf_counter() - began
    finally:
        group.stop()
    warm = curve[max(0, len(curve) // 10 - 1)] if curve else None
    last = curve[-1] if curve else None
    return {
        "n": n,
        "chunk": chunk,
        "slots": slots,
        "seconds": seconds,
        "curve": curve,
        "rss_after_warmup_mib": warm["total_rss_mib"] if warm else None,
        "rss_at_end_mib": last["total_rss_mib"] if last else None,
        "growth_mib": (last["total_rss_mib"] - warm["total_rss_mib"]) if warm and last else None,
    }


def fill_pending_sql_quiet(ctx: Ctx, n: int) -> None:
    """``fill_pending_sql`` without the VACUUM (the worker is draining meanwhile), and the
    wake-up ``start()`` would send."""
    ctx.sql(FILL_PENDING, {"kind": KIND, "n": n})
    ctx.sql(
        "SELECT pg_notify(%s, %s)",
        [conf.get().NOTIFY_CHANNEL or "durable_jobs", conf.get().DEFAULT_QUEUE],
    )


# ---------------------------------------------------------------------------------------
# steady: a producer at a fixed rate into an idle fleet (issue #27 item 3)
# ---------------------------------------------------------------------------------------


def steady(ctx: Ctx, *, rate: float, seconds: float, processes: int, slots: int, tag: str) -> dict:
    """One client starts no-op jobs at ``rate`` per second for ``seconds`` (one ``start()``
    per transaction, paced) into a warmed-up, idle fleet of processes × slots: the jobs/s
    the fleet completes while the producer runs, the start-to-run latency, and the
    database's transactions per job (the producer's own taken out). A burst drain measures
    the fleet's boot as well; this measures what a long-running fleet does with a steady
    stream of single starts, where every start's NOTIFY reaches every process."""
    reset()
    cmds = [ctx.worker_cmd(slots, burst=False) for _ in range(processes)]
    logs = [ctx.logs / f"durable-steady-{tag}-{i}.log" for i in range(processes)]
    group = procs.Group(cmds, env=ctx.worker_env(), cwd=REPO, logs=logs)
    try:
        problem = _warm_up(ctx, group, notify=True)
        if problem:
            return {"error": problem}
        time.sleep(2.0)  # every slot's wake-up pass after its LISTEN is over: the fleet sleeps
        settled = _settled(group)  # 64 handler processes take a while to boot on 2 cores
        warm_ids = [r[0] for r in ctx.sql(f"SELECT id FROM {TABLE}")]
        before = _xacts(ctx)
        began = time.monotonic()
        started = 0
        while (elapsed := time.monotonic() - began) < seconds:
            due = int(elapsed * rate) + 1
            while started < due:
                durable.start(KIND)
                started += 1
            time.sleep(max(0.0, started / rate - (time.monotonic() - began)))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not ctx.sql(ANY_LIVE)[0][0]:
                break
            time.sleep(0.1)
        after = _xacts(ctx)
    finally:
        group.stop()
    done, window = ctx.sql(
        f"""SELECT count(*) FILTER (WHERE status = 'completed'),
                   extract(epoch FROM max(finished_at) - min(created_at))
              FROM {TABLE} WHERE NOT (id = ANY(%s))""",
        [warm_ids],
    )[0]
    return _latency_sql(ctx, warm_ids, started) | {
        "offered_per_second": started / seconds,
        "completed_per_second": done / float(window) if window else None,
        "transactions_per_job": (after - before - started) / max(1, started),
        "slots_total": processes * slots,
        "settled_after_s": settled,
    }


def _fleet_cpu(group: procs.Group) -> Callable[[], float]:
    """A reader of the CPU seconds the fleet's processes and their children (the handler
    processes, as they are now) have used so far."""
    import psutil

    tree = []
    for proc in group.procs:
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(proc.pid)
            tree += [parent, *parent.children(recursive=True)]

    def cpu() -> float:
        total = 0.0
        for member in tree:
            with contextlib.suppress(psutil.Error):
                times = member.cpu_times()
                total += times.user + times.system
        return total

    return cpu


def _settled(group: procs.Group, *, idle_share: float = 0.1, timeout: float = 90.0) -> float:
    """Wait until the fleet (its processes and their children) uses under ``idle_share`` of
    a core over a second: booted and asleep. Returns the seconds waited."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        cpu = _fleet_cpu(group)
        first = cpu()
        time.sleep(1.0)
        if cpu() - first < idle_share:
            break
    return time.monotonic() - began


def io_bound(
    ctx: Ctx, *, processes: int, slots: int, per_slot: int, seconds: float, tag: str
) -> dict:
    """``per_slot`` jobs per slot whose slice sleeps ``seconds`` (work waiting on I/O) put
    at once, in one statement and one NOTIFY, before a warmed-up, idle, long-running fleet
    of processes × slots: jobs/s (first claim to last completion) against the ideal
    ``slots / seconds``, and the fleet's CPU per job while it drained them. The fleet's
    boot (a handler process per slot) is over before the jobs arrive: a burst worker's
    window would include it, and 64 handler processes take seconds to boot on 2 cores."""
    out = drain_warmed(
        ctx,
        processes=processes,
        slots=slots,
        n=processes * slots * per_slot,
        seconds=seconds,
        tag=f"io-{tag}",
    )
    if "error" in out:
        return out
    ideal = processes * slots / seconds
    rate = out["per_second"]
    return out | {
        "ideal_per_second": ideal,
        "share_of_ideal": None if rate is None else rate / ideal,
    }


def scale_point_warmed(ctx: Ctx, n: int, *, processes: int, slots: int, tag: str) -> dict:
    """``n`` no-op jobs (slices that sleep 0 s) put at once before a warmed-up, idle fleet of
    processes × slots: the drain's rate without the fleet's boot in its window. A burst
    worker boots a handler process per slot while it drains: at 8 x 8 on 2 cores that boot
    took most of a 5,000-job burst's window."""
    return drain_warmed(ctx, processes=processes, slots=slots, n=n, seconds=0.0, tag=f"warm-{tag}")


def drain_warmed(
    ctx: Ctx,
    *,
    processes: int,
    slots: int,
    n: int,
    seconds: float,
    tag: str,
    pin_seconds: float = 0.0,
) -> dict:
    """``n`` jobs whose slice sleeps ``seconds``, put in one statement and one NOTIFY before
    a warmed-up, idle fleet of processes × slots: jobs/s (first claim to last completion),
    and the fleet's CPU per job while it drained them.

    ``pin_seconds``: another session holds a transaction with an XID open for that long
    from the NOTIFY on (the pinned horizon of issue #27 item 8, briefly); the result then
    has the rate after the pin too, and completions per second through the drain."""
    import psycopg

    from benchmarks import trial

    reset()
    cmds = [ctx.worker_cmd(slots, burst=False) for _ in range(processes)]
    logs = [ctx.logs / f"durable-{tag}-{i}.log" for i in range(processes)]
    group = procs.Group(cmds, env=ctx.worker_env() | trial.BASE_ENV, cwd=REPO, logs=logs)
    try:
        problem = _warm_up(ctx, group, notify=True)
        if problem:
            return {"error": problem}
        _settled(group)
        cpu = _fleet_cpu(group)
        cpu0 = cpu()
        server0 = procs.server_cpu_seconds(ctx.server.postmaster_pid())
        reset()
        # Opened before the drain: a fleet of 64 slots may hold every other connection
        # the server allows while it runs.
        pin_ended = None
        with (
            psycopg.connect(ctx.dburl, autocommit=True) as poll,
            # Only when asked for: at 8 x 8 the fleet holds all but a few of the server's
            # connections.
            psycopg.connect(ctx.dburl) if pin_seconds else contextlib.nullcontext() as pin,
        ):
            ctx.sql(trial.INSERT, {"kind": trial.KIND, "seconds": [seconds] * n})
            ctx.sql("SELECT pg_notify(%s, 'default')", [conf.get().NOTIFY_CHANNEL])
            pinned_until = time.monotonic() + pin_seconds
            if pin_seconds:
                pin.execute("SELECT txid_current()")
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and poll.execute(ANY_LIVE).fetchone()[0]:
                if pin_seconds and pin_ended is None and time.monotonic() >= pinned_until:
                    pin_ended = _end_pin(pin)
                time.sleep(0.05)
            if pin_seconds and pin_ended is None:
                pin_ended = _end_pin(pin)
        used = cpu() - cpu0
        server1 = procs.server_cpu_seconds(ctx.server.postmaster_pid())
    finally:
        group.stop()
    done, window = ctx.sql(
        f"""SELECT count(*) FILTER (WHERE status = 'completed'),
                   extract(epoch FROM max(finished_at) - min(started_at)) FROM {TABLE}"""
    )[0]
    return {
        "n": n,
        "completed": done,
        "per_second": done / float(window) if window else None,
        "worker_cpu_ms_per_job": 1000 * used / n,
        # The server's CPU over the same stretch (its backends, the fleet's among them):
        # with the fleet's, what the machine spends a job, which bounds the rate two
        # cores can reach (docs/performance.rst, "What bounds the last rows, measured").
        "server_cpu_ms_per_job": (
            None if server0 is None or server1 is None else 1000 * (server1 - server0) / n
        ),
        "verified": done == n,
    } | (_after_the_pin(ctx, pin_ended) if pin_ended is not None else {})


def _end_pin(pin):
    """Roll the pinning transaction back; return the server's clock as it ended."""
    ended = pin.execute("SELECT clock_timestamp()").fetchone()[0]
    pin.rollback()
    return ended


def _after_the_pin(ctx: Ctx, pin_ended) -> dict:
    """A pinned drain's completions in each second from its first claim (a second with
    none counts 0), and its rate from a second after the pin ended (``pin_ended``, the
    server's clock) to its last completion (None if it was over by then)."""
    per_second = [
        count
        for (count,) in ctx.sql(
            f"""WITH first AS (SELECT min(started_at) AS at FROM {TABLE}),
                     done AS (
                         SELECT floor(extract(epoch FROM finished_at - first.at))::int AS second
                           FROM {TABLE}, first WHERE finished_at IS NOT NULL
                     )
                SELECT count(done.second)
                  FROM generate_series(0, (SELECT max(second) FROM done)) AS s(second)
                  LEFT JOIN done ON done.second = s.second
                 GROUP BY s.second ORDER BY s.second"""
        )
    ]
    after, window = ctx.sql(
        f"""SELECT count(*), extract(epoch FROM max(finished_at) - (%(ended)s + interval '1 s'))
              FROM {TABLE} WHERE finished_at >= %(ended)s + interval '1 s'""",
        {"ended": pin_ended},
    )[0]
    return {
        "completions_per_second": per_second,
        "per_second_after_pin": after / float(window) if after and window else None,
    }
