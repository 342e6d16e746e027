"""Bookkeeping of long slices and of many leases (issue #27 item 6, second half).

**Long slices.** One long-running default worker (``durable_worker --concurrency 2``, no
other flag) runs jobs of ``bench.slice1`` / ``bench.slice5`` / ``bench.slice20`` (slice
budgets of 1, 5 and 20 s; ``benchmarks/bench_app/durable.py``): each slice sleeps in
batches of 1 s, saves a checkpoint after every batch and returns ``YIELD`` when
``should_yield()`` says so, the loop the docs recommend; a job's last slice completes it.
``pg_stat_statements`` (the server is started with it preloaded when this scenario is
named) is reset once the worker is warm, and read when every job has completed: each
statement is named by the ``store`` constant it came from and counted by kind (claim,
heartbeat, checkpoint, yield, completion, transaction control, the worker's own upkeep),
with its WAL bytes, per slice and per slice-second.

**Many leases.** A slot holds a database connection, so 10,000 slots are out of reach of
this machine; what 10,000 running leases cost the server is the heartbeat, and the
heartbeat of one worker is one thread (``runtime.heartbeat.Heartbeater``) that renews all
of its worker's leases. So this process claims 10,000 jobs through ``store.dequeue`` for
20 owners (500 each, as 20 workers holding 500 long jobs would) and runs 20 real
``Heartbeater`` threads, each on its own connection, over ``HeldLease`` holders with the
default ``HEARTBEAT_INTERVAL``, for two intervals: once with each worker's leases
claimed together (their beats fall due together) and once with them tracked one by one
across an interval (as long jobs claimed at random moments are). Reported: heartbeat
statements/s, leases renewed/s (the statement's rows), the server's CPU over the window
(``/proc`` of the postmaster and its backends), and that every lease was renewed.
"""

from __future__ import annotations

import re
import time
import uuid

import durable_jobs as durable
from benchmarks import procs, report
from benchmarks.durable_bench import REPO, TABLE, Ctx, _warm_up, fill_pending_sql, reset
from durable_jobs import conf, store
from durable_jobs.runtime.heartbeat import COALESCE, Heartbeater, HeldLease
from durable_jobs.states import Lease

#: Marks this module's own queries (inside the statement: a leading comment is not kept).
PROBE = "/* bookkeeping-probe */"

#: The store statements by what they do for a slice; anything else is the worker's upkeep.
ROLES = {
    "DEQUEUE_OPEN": "claim",
    "DEQUEUE": "claim",
    "CLAIM": "claim",
    "HAS_KEYED_WORK": "claim",  # a slot's look for flow-keyed work beside its claim
    "RELEASE_LEASE": "claim",  # a claim of a slot's batch handed back unrun
    "set_config": "transaction",  # mostly the first statement of a fenced transaction
    "HEARTBEAT_LEASES": "heartbeat",
    "ASSERT_LEASE": "checkpoint",
    "WRITE_CHECKPOINT": "checkpoint",
    "HEARTBEAT": "checkpoint",  # the fence's lease extension at the end of fenced()
    "YIELD_SLICE": "yield",
    "COMPLETE": "completion",
    "COMPLETE_MANY": "completion",
    "COMPLETE_LEAF": "completion",
    "INSERT_JOBS": "start",  # the benchmark's own start_many and its NOTIFY
    "pg_notify": "start",
}
ORDER = [
    "claim",
    "heartbeat",
    "checkpoint",
    "yield",
    "completion",
    "transaction",
    "upkeep",
    "start",
]

STATEMENTS = f"""
SELECT {PROBE} calls, rows, wal_bytes, total_exec_time, query
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def _normal(sql: str) -> str:
    """A statement's text with every parameter and literal folded to ``?`` and spaces
    collapsed, so ``store``'s ``%(name)s`` and pg_stat_statements' ``$1`` compare equal."""
    sql = re.sub(
        r"%\(\w+\)s|\$\d+|'(?:[^']|'')*'|\b\d+\b|\b(?:null|true|false)\b", "?", sql, flags=re.I
    )
    return re.sub(r"\s+", " ", sql).strip().lower()


def _store_statements() -> dict[str, str]:
    from durable_jobs import db

    named = {
        _normal(value): name
        for module in (store, db)
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str) and len(value) > 30
    }
    named[_normal("SELECT pg_notify(%(channel)s, %(payload)s)")] = "pg_notify"
    # The fence's idle timeout, the lock timeout and a handler process's connection check
    # differ only in their literals, which pg_stat_statements folds into one entry.
    named[_normal(db.SET_LOCAL_IDLE_TIMEOUT)] = "set_config"
    return named


def _name(query: str, known: dict[str, str]) -> str:
    text = _normal(query)
    if text in known:
        return known[text]
    best, best_len = "", 0
    for candidate, name in known.items():
        common = len(_common_prefix(text, candidate))
        if common > best_len:
            best, best_len = name, common
    if best_len >= 60:
        return best
    return text.split(" ")[0].upper() if _is_control(text) else text[:60]


def _common_prefix(a: str, b: str) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return a[:i]
    return a[: min(len(a), len(b))]


def _is_control(text: str) -> bool:
    return text.split(" ")[0] in {
        "begin",
        "commit",
        "rollback",
        "set",
        "reset",
        "savepoint",
        "release",
    }


def statements(ctx: Ctx) -> list[dict]:
    """pg_stat_statements of the benchmark database since the last reset, each named and
    given a role; this module's own probes and the extension's reads left out."""
    known = _store_statements()
    out = []
    for calls, rows, wal, exec_ms, query in ctx.sql(STATEMENTS):
        if PROBE in query or "pg_stat_statements" in query:
            continue
        name = _name(query, known)
        role = ROLES.get(name) or ("transaction" if _is_control(_normal(query)) else "upkeep")
        out.append(
            {
                "name": name,
                "role": role,
                "calls": calls,
                "rows": rows,
                "wal_bytes": int(wal),
                "exec_ms": float(exec_ms),
            }
        )
    return out


def _by_role(stmts: list[dict]) -> dict[str, dict]:
    roles = {role: {"calls": 0, "rows": 0, "wal_bytes": 0} for role in ORDER}
    for s in stmts:
        for key in ("calls", "rows", "wal_bytes"):
            roles[s["role"]][key] += s[key]
    return roles


# ---------------------------------------------------------------------------------------
# long slices
# ---------------------------------------------------------------------------------------


def slices(ctx: Ctx, *, lengths: list[int], jobs: int, per_job: int, slots: int) -> dict:
    """Jobs of ``per_job`` slices of each length, run by one warm default worker."""
    reset()
    cmd = ctx.worker_cmd(slots, burst=False)
    log = ctx.logs / "bookkeeping-slices.log"
    group = procs.Group([cmd], env=ctx.worker_env(), cwd=REPO, logs=[log])
    out: dict = {"slots": slots, "jobs": jobs, "per_job": per_job, "lengths": {}}
    try:
        problem = _warm_up(ctx, group, notify=True)
        if problem:
            return {"error": problem}
        for length in lengths:
            out["lengths"][length] = _slice_run(ctx, group, length, jobs=jobs, per_job=per_job)
    finally:
        group.stop()
    return out


def _slice_run(ctx: Ctx, group: procs.Group, length: int, *, jobs: int, per_job: int) -> dict:
    kind = f"bench.slice{length}"
    ctx.sql("SELECT pg_stat_statements_reset()")
    began = time.monotonic()
    ids = durable.start_many(
        [{"kind": kind, "input": {"batch": 1.0, "slices": per_job}} for _ in range(jobs)]
    )
    deadline = began + per_job * length * 3 + 60
    while True:
        # jobs done, slices yielded, batches checkpointed (the handler counts them)
        done, yields, batches = ctx.sql(
            f"""SELECT {PROBE} count(*) FILTER (WHERE status = 'completed'),
                               coalesce(sum(continuation_seq), 0),
                               coalesce(sum((checkpoint->>'batches')::int), 0)
                  FROM {TABLE} WHERE kind = %s""",
            [kind],
        )[0]
        if done >= jobs:
            break
        if time.monotonic() > deadline or not group.alive():
            return {"error": f"{done} of {jobs} {kind} jobs completed: {procs.tail(group.logs[0])}"}
        time.sleep(0.2)
    window = time.monotonic() - began
    stmts = statements(ctx)
    return {
        "kind": kind,
        "window_seconds": window,
        "slices": jobs * per_job,
        "yields": int(yields),
        "batches": int(batches),
        "statements": stmts,
        "roles": _by_role(stmts),
        "ids": [str(i) for i in ids],
    }


# ---------------------------------------------------------------------------------------
# many leases
# ---------------------------------------------------------------------------------------


def leases(
    ctx: Ctx,
    *,
    n: int,
    owners: int,
    interval: float | None,
    windows: int = 2,
    arrangements: list[tuple[str, bool, float]] | None = None,
) -> dict:
    """``n`` claimed leases over ``owners`` real Heartbeaters: aligned, staggered, and
    staggered with the beats' coalescing off (``coalesce=0``: the heartbeat before it).
    ``interval``: the holders' heartbeat interval (default: ``HEARTBEAT_INTERVAL``)."""
    interval = interval or conf.get().HEARTBEAT_INTERVAL
    out: dict = {"leases": n, "owners": owners, "interval": interval, "arrangements": {}}
    for name, staggered, coalesce in arrangements or ARRANGEMENTS:
        out["arrangements"][name] = _lease_run(
            ctx,
            n=n,
            owners=owners,
            interval=interval,
            staggered=staggered,
            coalesce=coalesce,
            seconds=windows * interval,
        )
    return out


#: (name, leases tracked one by one across an interval, the Heartbeater's coalesce share)
ARRANGEMENTS = [
    ("aligned", False, COALESCE),
    ("staggered", True, COALESCE),
    ("staggered, coalescing off", True, 0.0),
]


def _claim(n: int, owners: int, interval: float) -> list[list[HeldLease]]:
    ttl_ms = conf.ms(conf.get().LEASE_TTL)
    held: list[list[HeldLease]] = []
    for i in range(owners):
        owner = f"bookkeeping-{i}:{uuid.uuid4().hex[:6]}"
        claimed = store.dequeue(["default"], owner, ttl_ms, kinds=None, limit=n // owners)
        held.append(
            [
                HeldLease(
                    job,
                    Lease(
                        job_id=job.id, owner=job.lease_owner, epoch=job.lease_epoch, ttl_ms=ttl_ms
                    ),
                    interval,
                )
                for job in claimed
            ]
        )
    return held


def _lease_run(
    ctx: Ctx,
    *,
    n: int,
    owners: int,
    interval: float,
    staggered: bool,
    coalesce: float,
    seconds: float,
) -> dict:
    reset()
    fill_pending_sql(ctx, n)
    held = _claim(n, owners, interval)
    claimed = sum(len(h) for h in held)
    beaters = [Heartbeater(coalesce=coalesce) for _ in held]
    for beater in beaters:
        beater.start()
    try:
        if staggered:
            # Track the leases one by one across an interval, round robin over the owners, so
            # each worker's beats fall due at as many moments as it holds leases.
            order = [
                (b, h)
                for i in range(max(map(len, held)))
                for b, hs in zip(beaters, held, strict=True)
                for h in hs[i : i + 1]
            ]
            began = time.monotonic()
            for k, (beater, holder) in enumerate(order):
                pause = began + interval * k / len(order) - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                beater.track(holder)
        else:
            for beater, hs in zip(beaters, held, strict=True):
                for holder in hs:
                    beater.track(holder)
        time.sleep(interval * 0.5)  # past the first beats of the leases tracked last
        ctx.sql("SELECT pg_stat_statements_reset()")
        since = ctx.sql(f"SELECT {PROBE} extract(epoch FROM clock_timestamp())")[0][0]
        cpu0 = procs.server_cpu_by_process(ctx.server.postmaster_pid())
        began = time.monotonic()
        time.sleep(seconds)
        cpu1 = procs.server_cpu_by_process(ctx.server.postmaster_pid())
        elapsed = time.monotonic() - began
        stmts = statements(ctx)
    finally:
        for beater in beaters:
            beater.stop()
    renewed, lost, live = ctx.sql(
        f"""SELECT {PROBE} count(*) FILTER (WHERE heartbeat_at >= to_timestamp(%(since)s)),
                           count(*) FILTER (WHERE status <> 'running'),
                           count(*) FILTER (WHERE lease_expires_at > clock_timestamp())
              FROM {TABLE}""",
        {"since": float(since)},
    )[0]
    beats = [s for s in stmts if s["role"] == "heartbeat"]
    calls = sum(s["calls"] for s in beats)
    rows = sum(s["rows"] for s in beats)
    split = (
        None
        if cpu0 is None or cpu1 is None
        else {k: cpu1.get(k, 0.0) - cpu0.get(k, 0.0) for k in cpu1.keys() | cpu0.keys()}
    )
    cpu = None if split is None else sum(split.values())
    return {
        "claimed": claimed,
        "seconds": elapsed,
        "statements": calls,
        "statements_per_second": calls / elapsed,
        "rows_per_second": rows / elapsed,
        "leases_per_statement": rows / calls if calls else None,
        "wal_bytes_per_lease": sum(s["wal_bytes"] for s in beats) / rows if rows else None,
        "other_statements": sum(s["calls"] for s in stmts) - calls,
        "server_cpu_seconds": cpu,
        "server_cpu_by_process": split,
        "heartbeat_exec_ms": sum(s["exec_ms"] for s in beats),
        "server_cpu_share": None if cpu is None else cpu / elapsed,
        # server CPU ms per second of wall time for every 1,000 leases held
        "server_cpu_ms_per_s_per_1000": None
        if cpu is None
        else 1000 * cpu / elapsed / (claimed / 1000),
        "renewed_in_window": int(renewed),
        "not_running": int(lost),
        "live_leases": int(live),
    }


# ---------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------


def slices_table(result: dict) -> str:
    """Per slice: checkpoints (fenced transactions) and heartbeats, which grow with the
    slice's length, and the rest (claim, yield or completion, their transactions)."""
    if "error" in result:
        return "error: " + result["error"]
    head = ["slice", "slices", "checkpoints", "heartbeat", "checkpoint stmts"]
    head += ["claim", "yield", "completion", "rest", "all", "per slice-s", "WAL B", "upkeep/s"]
    rows = [head]
    for length, r in result["lengths"].items():
        if "error" in r:
            rows.append([f"{length} s", "error: " + r["error"][:60]])
            continue
        n = r["slices"]
        per = per_slice(r)
        roles = r["roles"]
        wal = sum(v["wal_bytes"] for k, v in roles.items() if k not in ("upkeep", "start"))
        rows.append(
            [f"{length} s", str(n), f"{per['fences']:.1f}", f"{per['heartbeat']:.2f}"]
            + [f"{per['checkpoint']:.1f}"]
            + [f"{roles[role]['calls'] / n:.2f}" for role in ("claim", "yield", "completion")]
            + [f"{per['fixed']:.1f}", f"{per['all']:.1f}", f"{per['all'] / length:.2f}"]
            + [report.num(wal / n), f"{per['upkeep_per_second']:.2f}"]
        )
    return _grid(rows)


def statements_table(result: dict) -> str:
    """Every statement of each slice length, named, per slice."""
    out = []
    for length, r in result.get("lengths", {}).items():
        if "error" in r:
            continue
        n = r["slices"]
        rows = [["statement", "role", "calls", "per slice", "rows", "WAL bytes"]]
        for s in sorted(r["statements"], key=lambda s: (ORDER.index(s["role"]), -s["calls"])):
            rows.append(
                [
                    s["name"],
                    s["role"],
                    str(s["calls"]),
                    f"{s['calls'] / n:.2f}",
                    str(s["rows"]),
                    str(s["wal_bytes"]),
                ]
            )
        out.append(f"{length} s slices ({n} slices, {r['window_seconds']:.1f} s):\n" + _grid(rows))
    return "\n\n".join(out)


def leases_table(result: dict) -> str:
    rows = [
        [
            "arrangement",
            "leases",
            "hb stmts/s",
            "leases/stmt",
            "renewed/s",
            "WAL B/lease",
            "server CPU",
            "CPU ms/s per 1k leases",
            "backends / walwriter / other",
            "hb exec ms/s",
            "renewed / live",
        ]
    ]
    for name, r in result["arrangements"].items():
        rows.append(
            [
                name,
                f"{r['claimed']:,}",
                f"{r['statements_per_second']:.1f}",
                "-" if r["leases_per_statement"] is None else f"{r['leases_per_statement']:.1f}",
                f"{r['rows_per_second']:,.0f}",
                "-" if r["wal_bytes_per_lease"] is None else f"{r['wal_bytes_per_lease']:.0f}",
                "-" if r["server_cpu_share"] is None else f"{r['server_cpu_share']:.1%}",
                "-"
                if r["server_cpu_ms_per_s_per_1000"] is None
                else f"{r['server_cpu_ms_per_s_per_1000']:.2f}",
                _cpu_split(r),
                f"{r['heartbeat_exec_ms'] / r['seconds']:.1f}",
                f"{r['renewed_in_window']:,} / {r['live_leases']:,}",
            ]
        )
    return _grid(rows)


def _cpu_split(r: dict) -> str:
    """The window's server CPU share by process: client backends, the WAL writer, the rest
    (checkpointer, autovacuum, the postmaster)."""
    split = r.get("server_cpu_by_process")
    if not split:
        return "-"
    backends = split.get("backends", 0.0)
    walwriter = split.get("walwriter", 0.0)
    rest = sum(split.values()) - backends - walwriter
    return " / ".join(f"{v / r['seconds']:.1%}" for v in (backends, walwriter, rest))


def _grid(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) for r in rows)


def per_slice(r: dict) -> dict[str, float]:
    """Statements per slice: heartbeats, the handler's checkpoints (with their fences'
    transaction statements), and the rest: what the worker spends on a slice whatever
    its length."""
    n = r["slices"]
    calls = {role: r["roles"][role]["calls"] for role in ORDER}
    fences = sum(s["calls"] for s in r["statements"] if s["name"] == "ASSERT_LEASE")
    # A save_checkpoint() outside fenced() is its own fenced transaction: BEGIN, the idle
    # timeout (set_config), the lease's re-assertion, the write, the lease's extension,
    # COMMIT.
    checkpoint = calls["checkpoint"] + 3 * fences
    slice_total = sum(calls.values()) - calls["upkeep"] - calls["start"]
    return {
        "heartbeat": calls["heartbeat"] / n,
        "checkpoint": checkpoint / n,
        "fences": fences / n,
        "fixed": (slice_total - calls["heartbeat"] - checkpoint) / n,
        "all": slice_total / n,
        "upkeep_per_second": calls["upkeep"] / r["window_seconds"],
    }
