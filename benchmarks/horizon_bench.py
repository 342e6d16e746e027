"""A pinned horizon (issue #27 item 8): a steady load while one session holds a transaction
with an assigned XID open, so vacuum can remove no row version the load leaves behind.

One long-running 4-slot worker drains no-op jobs that a producer here starts at a fixed
rate (``start_many`` of 25 at a time, each its own transaction). The run has three phases:
undisturbed, pinned (another session ran ``BEGIN; SELECT txid_current();`` and sits idle in
that transaction), and after the pin ends. Every sample interval it records, from the
database: jobs completed in the interval, the start-to-claim latency of the jobs claimed
in it (p50 / p99), the server's execution time of the default claim statement
(``DEQUEUE_OPEN``, limit 1, EXPLAIN ANALYZE rolled back) as a worker runs it between
sweeps (its scan starting at a floor, ``runtime.claim_floors``) and as a sweep (from the
queue's start), the job table's dead tuples, the table's and its indexes' sizes, and the
three statements that took the server the most time in the interval (pg_stat_statements
is preloaded for this scenario).
"""

from __future__ import annotations

import statistics
import time

import psycopg

from benchmarks import bookkeeping_bench, procs, steady_load
from benchmarks.durable_bench import REPO, TABLE, Ctx, _warm_up, reset


def _sample(ctx: Ctx, since: float, phase: str) -> dict:
    done, p50, p99 = ctx.sql(
        f"""SELECT count(*) FILTER (WHERE finished_at >= to_timestamp(%(since)s)),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
                       FILTER (WHERE started_at >= to_timestamp(%(since)s)),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
                       FILTER (WHERE started_at >= to_timestamp(%(since)s))
              FROM {TABLE}""",
        {"since": since},
    )[0]
    stats = steady_load.table_stats(ctx)
    busiest = _busiest(ctx)
    return {
        "busiest": busiest,
        "phase": phase,
        "completed": int(done),
        "latency_p50_ms": None if p50 is None else float(p50) * 1000,
        "latency_p99_ms": None if p99 is None else float(p99) * 1000,
        "claim_server_ms": steady_load.claim_ms(ctx, floored=True),
        "sweep_server_ms": steady_load.claim_ms(ctx),
        "dead_tuples": stats["dead_tuples"],
        "table_mib": stats["table_mib"],
        "indexes_mib": stats["indexes_mib"],
    }


def _busiest(ctx: Ctx) -> list[tuple[str, int, float]]:
    """The three statements that took the server the most execution time since the last
    sample (name, calls, ms), read from pg_stat_statements and reset; [] without it."""
    if not ctx.server.pg_stat_statements:
        return []
    by_name: dict[str, list[float]] = {}
    for stmt in bookkeeping_bench.statements(ctx):
        calls_and_ms = by_name.setdefault(stmt["name"], [0, 0.0])
        calls_and_ms[0] += stmt["calls"]
        calls_and_ms[1] += stmt["exec_ms"]
    ctx.sql("SELECT pg_stat_statements_reset()")
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:3]
    return [(name, int(calls), ms) for name, (calls, ms) in ranked]


def run(
    ctx: Ctx,
    *,
    rate: float,
    before: float,
    pinned: float,
    after: float,
    interval: float = 5.0,
    slots: int = 4,
) -> dict:
    reset()
    cmd = ctx.worker_cmd(slots, burst=False)
    group = procs.Group([cmd], env=ctx.worker_env(), cwd=REPO, logs=[ctx.logs / "horizon.log"])
    producer = steady_load.Producer(rate)
    samples: list[dict] = []
    pin = None
    try:
        problem = _warm_up(ctx, group, notify=True)
        if problem:
            return {"error": problem}
        _busiest(ctx)  # the warm-up's statements are not the run's
        producer.start()
        began = time.monotonic()
        plan = [("before", before), ("pinned", pinned), ("after", after)]
        for phase, seconds in plan:
            if phase == "pinned":
                pin = psycopg.connect(ctx.dburl)
                pin.execute("SELECT txid_current()")  # an assigned XID, left open
            if phase == "after" and pin is not None:
                pin.rollback()
                pin.close()
                pin = None
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                since = time.time()
                time.sleep(interval)
                samples.append(_sample(ctx, since, phase) | {"t": time.monotonic() - began})
    finally:
        producer.stop()
        if pin is not None:
            pin.close()
        group.stop()
    by_phase = {}
    for phase in ("before", "pinned", "after"):
        rows = [s for s in samples if s["phase"] == phase]
        if rows:
            by_phase[phase] = {
                "jobs_per_second": statistics.median(r["completed"] for r in rows) / interval,
                "claim_server_ms_max": max(r["claim_server_ms"] or 0 for r in rows),
                "sweep_server_ms_max": max(r["sweep_server_ms"] or 0 for r in rows),
                "latency_p99_ms_max": max(r["latency_p99_ms"] or 0 for r in rows),
                "dead_tuples_max": max(r["dead_tuples"] for r in rows),
                "indexes_mib_max": max(r["indexes_mib"] for r in rows),
            }
    return {"rate": rate, "interval": interval, "samples": samples, "phases": by_phase}


def table(result: dict) -> str:
    """The samples, one line each."""
    interval = result.get("interval", 1.0)
    return steady_load.render(
        result.get("samples", []),
        [
            ("t (s)", 6, lambda s: f"{s['t']:.0f}"),
            ("phase", 7, lambda s: s["phase"]),
            ("jobs/s", 7, lambda s: f"{s['completed'] / interval:,.0f}"),
            ("p50 / p99 ms", 15, steady_load.latency_cell),
            ("claim ms", 8, lambda s: f"{s['claim_server_ms'] or 0:.3f}"),
            ("sweep ms", 8, lambda s: f"{s.get('sweep_server_ms') or 0:.3f}"),
            ("dead tuples", 11, lambda s: f"{s['dead_tuples']:,}"),
            ("table / indexes MiB", 20, lambda s: f"{s['table_mib']:.1f} / {s['indexes_mib']:.1f}"),
            ("busiest statements: calls, server ms", 40, _busiest_cell),
        ],
    )


def _busiest_cell(sample: dict) -> str:
    return "; ".join(
        f"{name} {calls:,}, {ms:,.0f}" for name, calls, ms in sample.get("busiest") or []
    )
