"""``--profile``: where a no-op slice spends its time at 4 slots.

* Statements per slice: ``pg_stat_statements`` (the server is started with it preloaded)
  around a 4-slot burst run; sessions opened from ``pg_stat_database.sessions``.
* The wake-up path: statements per job while an idle 4-slot worker is woken by NOTIFY.
* The start path: statements per ``durable.start()``.
* A py-spy profile (wall clock, idle included) of the 4-slot worker's slot threads.
* What-ifs measured with EXPLAIN ANALYZE on variants of DEQUEUE (no library code changes).
* What the operator console's newest-first indexes cost: the 1-slot no-op drain and
  ``start()`` in autocommit with them whole (before migration 0017), as built (running
  rows kept out), and without them, interleaved (they are put back).
"""

from __future__ import annotations

import collections
import re
import statistics
import time
from pathlib import Path

from django.db import transaction

import durable_jobs as durable
from benchmarks import durable_bench, procs, report
from benchmarks.durable_bench import KIND, REPO, TABLE
from durable_jobs import store

STATEMENTS = """
SELECT calls, total_exec_time, rows, regexp_replace(query, '\\s+', ' ', 'g')
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND query NOT ILIKE '%%pg_stat_statements%%'
 ORDER BY calls DESC, total_exec_time DESC
"""


def run(ctx, plan, raw: dict) -> str:
    if not ctx.server.pg_stat_statements:
        return "pg_stat_statements could not be preloaded on this server; profile skipped."
    ctx.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    n = plan.n
    out: list[str] = []
    prof: dict = {}
    raw["profile"] = prof

    # --- 1. statements per slice, 4-slot burst -------------------------------------------
    durable_bench.reset()
    durable_bench.fill_pending_sql(ctx, n)
    sessions0 = _sessions(ctx)
    ctx.sql("SELECT pg_stat_statements_reset()")
    result = durable_bench.throughput_prefilled(
        ctx, n, processes=1, slots=4, tag="profile", timeout=plan.worker_timeout
    )
    stmts = _statements(ctx)
    sessions = _sessions(ctx) - sessions0
    prof["burst"] = {"throughput": result, "statements": stmts, "sessions": sessions}
    out.append(f"### Statements per job, 4-slot burst of {n:,} no-op jobs\n")
    out.append(
        f"{report.num(result.get('per_second'))} jobs/s; {sessions} PostgreSQL sessions opened in "
        f"all; worker CPU {1000 * result['worker_cpu_seconds'] / n:.2f} ms/job, server CPU "
        + (
            f"{1000 * result['server_cpu_seconds'] / n:.2f} ms/job"
            if result.get("server_cpu_seconds") is not None
            else "n/a"
        )
        + "\n"
    )
    out.append(report.block(_statements_table(stmts, n)))

    # --- 2. the wake-up path: NOTIFY to an idle 4-slot worker ------------------------------
    m = min(plan.latency_m, 100)
    ctx.sql("SELECT pg_stat_statements_reset()")
    lat = durable_bench.latency(
        ctx,
        m,
        notify=True,
        poll_interval=plan.poll_interval,
        slots=4,
        gap=0.05,
        tag="profile-notify",
    )
    stmts = _statements(ctx)
    prof["notify"] = {"latency": lat, "statements": stmts}
    jobs = m + 3  # the warm-up jobs ran in the window too
    out.append(
        f"### Statements per job, {m} single starts (50 ms apart) to an idle 4-slot worker woken "
        "by NOTIFY\n"
    )
    out.append(
        f"latency p50/p99 {lat.get('p50_ms') or 0:.1f}/{lat.get('p99_ms') or 0:.1f} ms "
        "(the client's start() statements are included below)\n"
    )
    out.append(report.block(_statements_table(stmts, jobs)))

    # --- 3. the start path ----------------------------------------------------------------
    durable_bench.reset()
    ctx.sql("SELECT pg_stat_statements_reset()")
    k = 200
    for _ in range(k):
        with transaction.atomic():
            durable.start(KIND)
    stmts = _statements(ctx)
    prof["start"] = {"statements": stmts}
    out.append(f"### Statements per durable.start() (one per transaction, {k} starts)\n")
    out.append(report.block(_statements_table(stmts, k)))

    # --- 4. py-spy --------------------------------------------------------------------------
    spy = _py_spy(ctx)
    if isinstance(spy, str):
        out.append("### py-spy\n\n" + spy)
    else:
        durable_bench.reset()
        durable_bench.fill_pending_sql(ctx, n)
        dump = ctx.logs / "py-spy-slots.txt"
        prefix = [str(spy), "record", "--idle", "-r", "200", "-f", "raw", "-o", str(dump), "--"]
        result = durable_bench.throughput_prefilled(
            ctx, n, processes=1, slots=4, tag="pyspy", timeout=plan.worker_timeout, prefix=prefix
        )
        breakdown = _spy_breakdown(dump)
        prof["py-spy"] = {"throughput": result, "breakdown": breakdown}
        out.append("### py-spy: where the slot threads' wall time goes (idle included), 4 slots\n")
        out.append(
            f"{report.num(result.get('per_second'))} jobs/s under the profiler (200 Hz); raw "
            f"stacks: {dump}\n"
        )
        out.append(report.block(_breakdown_table(breakdown)))
        durable_bench.reset()
        durable_bench.fill_pending_sql(ctx, n)
        dump_cpu = ctx.logs / "py-spy-cpu.txt"
        prefix = [str(spy), "record", "--gil", "-r", "200", "-f", "raw", "-o", str(dump_cpu), "--"]
        result = durable_bench.throughput_prefilled(
            ctx,
            n,
            processes=1,
            slots=4,
            tag="pyspy-cpu",
            timeout=plan.worker_timeout,
            prefix=prefix,
        )
        cpu_text = _spy_cpu(dump_cpu)
        prof["py-spy-cpu"] = {"throughput": result, "text": cpu_text}
        out.append(
            "### py-spy --gil: where the worker's Python time goes (samples of the GIL holder), 4 "
            "slots\n"
        )
        out.append(
            f"{report.num(result.get('per_second'))} jobs/s under the profiler; raw stacks: "
            f"{dump_cpu}\n"
        )
        out.append(report.block(cpu_text))

    # --- 5. what-ifs on DEQUEUE (EXPLAIN ANALYZE, rolled back; no library change) ----------
    out.append(_what_ifs(ctx, backlog=10_000 if plan.quick else 100_000, prof=prof))

    # --- 6. what the console's indexes cost the hot statements -----------------------------
    out.append(_console_index_cost(ctx, n=n, starts=500 if plan.quick else 2000, prof=prof))
    return "\n".join(out)


def _sessions(ctx) -> int:
    ctx.sql("SELECT pg_stat_force_next_flush()")
    time.sleep(0.05)
    return int(
        ctx.sql("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")[0][0]
    )


def _statements(ctx) -> list[dict]:
    rows = ctx.sql(STATEMENTS)
    return [{"calls": r[0], "total_ms": float(r[1]), "rows": r[2], "query": r[3]} for r in rows]


def _label(query: str) -> str:
    q = query.strip()
    names = {
        "jsonb_to_recordset": "COMPLETE_MANY (batched completion)",
        "WITH candidates AS MATERIALIZED": "DEQUEUE",
        "SET status = 'completed'": "COMPLETE",
        "SET status = $1, finished_at": "COMPLETE",
        "SET domain_mirrored_at": "MARK_MIRRORED",
        "INSERT INTO durable_jobs_job": "INSERT_JOB",
        "SELECT pg_notify": "NOTIFY",
        "set_config": "set_config (time zone / application_name / SET LOCAL)",
        "SET lease_expires_at": "HEARTBEAT",
    }
    for needle, name in names.items():
        if needle in q:
            return name
    if q.upper() in ("SELECT $1", "SELECT 1"):
        return "SELECT 1 (Django CONN_HEALTH_CHECKS)"
    return q[:70]


def _statements_table(stmts: list[dict], jobs: int) -> str:
    lines = [f"{'statement':58}  {'calls/job':>9}  {'exec ms/call':>12}  {'exec ms/job':>11}"]
    total_calls = 0.0
    total_ms = 0.0
    for s in stmts:
        per_job = s["calls"] / jobs
        if per_job < 0.01:
            continue
        total_calls += per_job
        total_ms += s["total_ms"] / jobs
        lines.append(
            f"{_label(s['query'])[:58]:58}  {per_job:9.2f}  {s['total_ms'] / s['calls']:12.3f}  "
            f"{s['total_ms'] / jobs:11.3f}"
        )
    lines.append(
        f"{'total (round trips per job)':58}  {total_calls:9.2f}  {'':12}  {total_ms:11.3f}"
    )
    return "\n".join(lines)


def _py_spy(ctx) -> Path | str:
    from benchmarks.peers import ensure_venv

    python, problem = ensure_venv("tools", ["py-spy==0.4.3"], log=ctx.logs / "venv-tools.log")
    if problem:
        return f"py-spy not available: {problem}"
    spy = python.parent / "py-spy"
    return spy if spy.exists() else "py-spy not available: the binary is missing after installation"


# Categories of a slot's wall time, by the first matching frame (outermost first).
_CATEGORIES = [
    (
        "idle: waiting for work (Event.wait in the slot loop)",
        ("Event.wait (threading.py)",),
        "_slot_wait",
    ),
    (
        "connection upkeep: health check (SELECT 1) / reconnect",
        (
            "keep_connection_healthy (durable_jobs/db.py)",
            "close_old_connections (django/db/__init__.py)",
            "close_if_health_check_failed",
            "BaseDatabaseWrapper.connect ",
            "BaseDatabaseWrapper.ensure_connection",
        ),
        None,
    ),
    ("DEQUEUE (store.dequeue)", ("dequeue (durable_jobs/store.py)",), None),
    ("batched completion (store.complete_many)", ("complete_many (durable_jobs/store.py)",), None),
    (
        "lease extension of a waiting claim (store.heartbeat)",
        ("heartbeat (durable_jobs/store.py)",),
        None,
    ),
    (
        "hand-back of unstarted claims (store.release_lease)",
        ("release_lease (durable_jobs/store.py)",),
        None,
    ),
    ("terminal txn: COMMIT", ("Atomic.__exit__ (django/db/transaction.py)",), "_finish"),
    (
        "terminal txn: COMPLETE (incl. the BEGIN psycopg sends first)",
        ("complete (durable_jobs/store.py)",),
        "_finish",
    ),
    ("terminal txn: MARK_MIRRORED", ("mark_mirrored (durable_jobs/store.py)",), "_finish"),
    (
        "terminal txn: other (atomic enter, signals, metrics)",
        ("_finish (durable_jobs/runtime/executor.py)",),
        None,
    ),
    (
        "slice bookkeeping: _report (log line, metrics)",
        ("_report (durable_jobs/runtime/executor.py)",),
        None,
    ),
    (
        "slice setup: Slice(), heartbeater track/untrack, signals",
        ("run_slice (durable_jobs/runtime/executor.py)",),
        None,
    ),
]


def _spy_breakdown(path: Path) -> dict:
    counts: collections.Counter = collections.Counter()
    waiting: collections.Counter = collections.Counter()
    total = 0
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        return {"error": str(error)}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        if not any(f.startswith("Worker._slot ") for f in frames):
            continue
        c = int(count)
        total += c
        category = "other"
        slot_index = next(i for i, f in enumerate(frames) if f.startswith("Worker._slot "))
        below = frames[slot_index + 1 :]
        if below and below[0].startswith("Event.wait (threading.py)"):
            category = _CATEGORIES[0][0]
        else:
            for name, needles, within in _CATEGORIES[1:]:
                if within and not any(within in f for f in below):
                    continue
                if any(any(f.startswith(n) or n in f for n in needles) for f in below):
                    category = name
                    break
        counts[category] += c
        if (
            frames[-1].startswith("Connection.wait (psycopg/connection.py)")
            or "wait_c" in frames[-1]
        ):
            waiting[category] += c
    return {"total_samples": total, "categories": dict(counts), "waiting_on_server": dict(waiting)}


def _breakdown_table(b: dict) -> str:
    if "error" in b or not b.get("total_samples"):
        return f"(no samples: {b.get('error', 'py-spy recorded nothing for the slot threads')})"
    idle_name = _CATEGORIES[0][0]
    idle = b["categories"].get(idle_name, 0)
    busy = b["total_samples"] - idle
    if busy <= 0:
        return "(the slot threads were idle in every sample)"
    lines = [
        f"slot threads were idle (no due job, or the burst's last poll interval) in "
        f"{100 * idle / b['total_samples']:.0f}% of samples; shares below are of the busy samples.",
        "",
        f"{'where a busy slot thread is':62}  {'share':>6}  {'of which in psycopg wait':>24}",
    ]
    for name, count in sorted(b["categories"].items(), key=lambda kv: -kv[1]):
        if name == idle_name:
            continue
        wait = b["waiting_on_server"].get(name, 0)
        lines.append(f"{name[:62]:62}  {100 * count / busy:5.1f}%  {100 * wait / busy:23.1f}%")
    waited = sum(v for k, v in b["waiting_on_server"].items() if k != idle_name)
    lines.append(
        f"{'all (psycopg Connection.wait = server round trip + GIL re-entry)':62}  100.0%  "
        f"{100 * waited / busy:23.1f}%"
    )
    return "\n".join(lines)


_GENERIC = (
    "Thread._bootstrap",
    "Thread.run ",
    "Worker._slot ",
    "run_slice ",
    "_run_handler",
    "_guarded ",
    "_run_handler.<locals>",
    "_finish ",
)


def _spy_cpu(path: Path, top: int = 22) -> str:
    """Inclusive on-CPU shares per function for the worker process (all threads)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        return f"(no samples: {error})"
    inclusive: collections.Counter = collections.Counter()
    threads: collections.Counter = collections.Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        total += c
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        role = (
            "slot"
            if any(f.startswith("Worker._slot ") for f in frames)
            else "heartbeat"
            if any(f.startswith("Heartbeater.") for f in frames)
            else "main thread / other"
        )
        threads[role] += c
        if role == "main thread / other":
            continue  # start-up imports, the main loop's joins
        for frame in set(frames):
            if not frame.startswith(_GENERIC):
                inclusive[frame] += c
    if not total:
        return "(no samples)"
    busy = total - threads["main thread / other"]
    out = [
        "GIL-holding samples by thread: "
        + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in threads.most_common()),
        "",
        f"{'function (inclusive; slot and heartbeat threads)':90}  {'share':>6}",
    ]
    for frame, count in inclusive.most_common(top):
        out.append(f"{frame[:90]:90}  {100 * count / max(busy, 1):5.1f}%")
    return "\n".join(out)


def _what_ifs(ctx, *, backlog: int, prof: dict) -> str:
    """EXPLAIN ANALYZE variants of DEQUEUE over a backlog of pending jobs (rolled back)."""
    durable_bench.reset()
    durable_bench.fill_pending_sql(ctx, backlog)
    queues = ["default"]
    params = store.claim_params(queues, "whatif", 60000, kinds=None)
    as_written = store.DEQUEUE_OPEN  # the default claim (DEQUEUE is the keyed one, flow control)
    single = as_written.replace(
        "queue_name = ANY(%(queues)s)", "queue_name = (%(queues)s::text[])[1]"
    )
    variants = [("DEQUEUE_OPEN as written (queue_name = ANY(...)), limit 1", as_written, params)]
    if single != as_written:
        variants.append(
            ("DEQUEUE with queue_name = <one queue> (equality), limit 1", single, params)
        )
        variants.append(
            (
                "DEQUEUE with equality, limit 4 (claim several rows per call)",
                single,
                params | {"limit": 4},
            )
        )
    lines = [
        f"### What-ifs: DEQUEUE variants over a backlog of {backlog:,} pending jobs "
        "(EXPLAIN ANALYZE, rolled back, median of 15)\n"
    ]
    table = [f"{'variant':64}  {'exec ms p50':>11}  plan"]
    plans = []
    results = {}
    for name, sql, p in variants:
        times = [durable_bench._explain_time(sql, p) for _ in range(15)]
        plan_text = durable_bench._explain_text(sql, p)
        top = next((ln.strip() for ln in plan_text.splitlines() if "Scan" in ln), "?")
        results[name] = durable_bench._pct(times, 50)
        table.append(f"{name[:64]:64}  {results[name]:11.3f}  {top[:70]}")
        plans.append(f"{name}:\n{plan_text}")
    prof["what_ifs"] = results
    lines.append(report.block("\n".join(table)))
    lines.append("\nPlans:\n")
    lines.append(report.block("\n\n".join(plans)))
    return "\n".join(lines)


# The operator console's newest-first indexes (models.CONSOLE_INDEXES and the tenant one
# beside them; issue #12's pages read them): until migration 0017 the only ones besides
# the primary key that every row version entered; now a claim's version enters none.
CONSOLE_NEWEST_FIRST = (
    "durable_jobs_recent",
    "durable_jobs_status_recent",
    "durable_jobs_kind_recent",
    "durable_jobs_queue_recent",
    "durable_jobs_tenant_recent",
)


def _console_index_cost(ctx, *, n: int, starts: int, prof: dict, rounds: int = 2) -> str:
    """The 1-slot no-op drain and start() in autocommit with the console's newest-first
    indexes as they were before migration 0017 (no predicate), as built (partial on
    ``NOT status = 'running'``), and without them, interleaved; the indexes are put back
    as they were whatever happens.

    A claim and a completion each change ``status``, so neither is a HOT update: each
    version of the row adds an entry to every index whose predicate it meets. Without a
    predicate the claim's version enters all five; as built it enters none of them.
    """
    definitions = [
        row[0]
        for row in ctx.sql(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexname = ANY(%s)",
            [TABLE, list(CONSOLE_NEWEST_FIRST)],
        )
    ]
    # As built each definition ends in its predicate (migration 0017); without it, every
    # row version enters the index, as before 0017.
    whole = [definition.split(" WHERE ", 1)[0] for definition in definitions]
    variants = ("whole", "as built", "without")
    figures: dict[str, dict[str, list[float]]] = {
        variant: {"drain": [], "server_us": [], "start": []} for variant in variants
    }
    try:
        for _ in range(rounds):
            for variant in variants:
                _drop(ctx)
                if variant == "whole":
                    _restore(ctx, whole)
                elif variant == "as built":
                    _restore(ctx, definitions)
                durable_bench.reset()
                durable_bench.fill_pending_sql(ctx, n)
                drained = durable_bench.throughput_prefilled(
                    ctx, n, processes=1, slots=1, tag=f"indexes-{variant}", timeout=600
                )
                figures[variant]["drain"].append(drained.get("per_second") or 0.0)
                server = drained.get("server_cpu_seconds")
                if server is not None:
                    figures[variant]["server_us"].append(1e6 * server / n)
                started = durable_bench.start_rate(starts, atomic=False)
                figures[variant]["start"].append(started["per_second"])
    finally:
        _drop(ctx)
        _restore(ctx, definitions)
    prof["console_indexes"] = figures
    lines = [
        f"### What the console's {len(definitions)} newest-first indexes cost "
        f"({', '.join(CONSOLE_NEWEST_FIRST)})\n",
        f"Interleaved, {rounds} rounds: a 1-slot burst of {n:,} no-op jobs, and {starts:,} "
        "start() calls in autocommit from this process; the indexes without a predicate "
        "(before migration 0017), as built (running rows kept out), and dropped.\n",
    ]
    table = [f"{'':36}  {'whole':>20}  {'as built':>20}  {'without':>20}  {'ratios (medians)':>16}"]
    for what, label in (
        ("drain", "no-op drain, 1 slot (jobs/s)"),
        ("server_us", "  server CPU per drained job (us)"),
        ("start", "start() in autocommit (/s)"),
    ):
        columns = [figures[variant][what] for variant in variants]
        if not all(columns) or not all(columns[0]):
            continue  # no server CPU figure on this platform
        base = statistics.median(columns[0])
        ratios = " / ".join(f"{statistics.median(column) / base:.2f}x" for column in columns[1:])
        table.append(
            f"{label:36}  "
            + "  ".join(f"{_each(column):>20}" for column in columns)
            + f"  {ratios:>16}"
        )
    lines.append(report.block("\n".join(table)))
    return "\n".join(lines)


def _drop(ctx) -> None:
    for name in CONSOLE_NEWEST_FIRST:
        ctx.sql(f"DROP INDEX IF EXISTS {name}")


def _restore(ctx, definitions: list[str]) -> None:
    for definition in definitions:
        ctx.sql(definition.replace("CREATE INDEX ", "CREATE INDEX IF NOT EXISTS ", 1))


def _each(values: list[float]) -> str:
    return ", ".join(f"{value:,.0f}" for value in values)


__all__ = ["run", "TABLE", "REPO", "procs"]
