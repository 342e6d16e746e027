"""A pinned horizon (issue #27 item 8): a steady load while one session holds a transaction
with an assigned XID open, so vacuum can remove no row version the load leaves behind.

One long-running 4-slot worker drains no-op jobs that a producer here starts at a fixed
rate (``start_many`` of 25 at a time, each its own transaction). The run has three phases:
undisturbed, pinned (another session ran ``BEGIN; SELECT txid_current();`` and sits idle in
that transaction), and after the pin ends. Every sample interval it records, from the
database: jobs completed in the interval, the start-to-claim latency of the jobs claimed
in it (p50 / p99), the server's execution time of the default claim statement
(``DEQUEUE_OPEN``, limit 1, EXPLAIN ANALYZE rolled back), the job table's dead tuples,
and the table's and its indexes' sizes.
"""

from __future__ import annotations

import statistics
import threading
import time

import psycopg

import durable_jobs as durable
from benchmarks import procs
from benchmarks.durable_bench import KIND, REPO, TABLE, Ctx, _warm_up, reset
from durable_jobs import store


def _claim_ms(ctx: Ctx) -> float | None:
    """The default claim's server execution time now (limit 1), rolled back."""
    with psycopg.connect(ctx.dburl) as conn:
        rows = conn.execute(
            "EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON) " + store.DEQUEUE_OPEN,
            {
                "queues": ["default"],
                "owner": "horizon-probe",
                "ttl_ms": 60_000,
                "limit": 1,
                "kinds": None,
                "flow": "{}",
            },
        ).fetchall()
        conn.rollback()
    for (line,) in rows:
        if line.startswith("Execution Time:"):
            return float(line.split()[2])
    return None


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
    dead, table_bytes, index_bytes = ctx.sql(
        f"""SELECT n_dead_tup, pg_table_size('{TABLE}'), pg_indexes_size('{TABLE}')
              FROM pg_stat_user_tables WHERE relname = '{TABLE}'"""
    )[0]
    return {
        "phase": phase,
        "completed": int(done),
        "latency_p50_ms": None if p50 is None else float(p50) * 1000,
        "latency_p99_ms": None if p99 is None else float(p99) * 1000,
        "claim_server_ms": _claim_ms(ctx),
        "dead_tuples": int(dead),
        "table_mib": table_bytes / 2**20,
        "indexes_mib": index_bytes / 2**20,
    }


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
    stop = threading.Event()
    started = [0]

    def produce() -> None:
        from django.db import connection

        began = time.monotonic()
        try:
            while not stop.is_set():
                due = int((time.monotonic() - began) * rate)
                while started[0] < due and not stop.is_set():
                    durable.start_many([{"kind": KIND} for _ in range(25)])
                    started[0] += 25
                stop.wait(0.01)
        finally:
            connection.close()

    samples: list[dict] = []
    pin = None
    try:
        problem = _warm_up(ctx, group, notify=True)
        if problem:
            return {"error": problem}
        producer = threading.Thread(target=produce, daemon=True)
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
        stop.set()
        producer.join(30)
    finally:
        stop.set()
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
                "latency_p99_ms_max": max(r["latency_p99_ms"] or 0 for r in rows),
                "dead_tuples_max": max(r["dead_tuples"] for r in rows),
                "indexes_mib_max": max(r["indexes_mib"] for r in rows),
            }
    return {"rate": rate, "interval": interval, "samples": samples, "phases": by_phase}


def table(result: dict) -> str:
    lines = [
        f"{'t (s)':>6}  {'phase':7}  {'jobs/s':>7}  {'p50 / p99 ms':>15}  {'claim ms':>8}  "
        f"{'dead tuples':>11}  {'table / indexes MiB':>20}"
    ]
    for s in result.get("samples", []):
        latency = (
            "-"
            if s["latency_p50_ms"] is None
            else f"{s['latency_p50_ms']:.1f} / {s['latency_p99_ms']:.1f}"
        )
        lines.append(
            f"{s['t']:6.0f}  {s['phase']:7}  {s['completed'] / result['interval']:7,.0f}  "
            f"{latency:>15}  {s['claim_server_ms'] or 0:8.3f}  {s['dead_tuples']:11,}  "
            f"{s['table_mib']:9.1f} / {s['indexes_mib']:8.1f}"
        )
    return "\n".join(lines)
