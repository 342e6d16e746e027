"""The ``schedules`` scenario: what 1,000 schedules cost an idle fleet, and firing them.

Two idle workers (one slot each) run twice for the same window: once with no schedule,
once with ``BENCH_SCHEDULES`` schedules declared in ``bench_app/durable.py`` (yearly
ticks, so none comes due by itself). The fleet's statements are counted as committed
transactions of the benchmark's database (``pg_stat_database.xact_commit`` deltas; every
statement a worker sends outside a transaction block is one, and pg_stat_statements is
not available on every server), and so are the statements that read the schedule table
(``pg_stat_user_tables`` scans): autovacuum's transactions count in the first figure, not
in the second. The difference is what the schedules cost. Then every
schedule is made due at once and the time until each tick's job exists is measured.

Backends flush their counters at most once a second (an idle one after up to 10 s), so a
window's count is right to within a few transactions per backend: the windows are long
enough that this stays small against the figures.
"""

from __future__ import annotations

import time

from benchmarks import procs
from benchmarks.durable_bench import REPO, TABLE, Ctx, reset

SCHEDULE_TABLE = "durable_jobs_schedule"


def _commits(ctx: Ctx) -> int:
    return ctx.sql("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")[
        0
    ][0]


def _schedule_reads(ctx: Ctx) -> int:
    """Scans of the schedule table so far (each statement that reads it counts one)."""
    return ctx.sql(
        "SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = %s",
        [SCHEDULE_TABLE],
    )[0][0]


def _idle_rate(ctx: Ctx, *, schedules: int, window: float, workers: int, tag: str) -> dict:
    """Committed transactions per second of ``workers`` idle workers over ``window`` s."""
    reset()
    env = ctx.worker_env() | {"BENCH_SCHEDULES": str(schedules)}
    group = procs.Group(
        [ctx.worker_cmd(1, burst=False) for _ in range(workers)],
        env=env,
        cwd=REPO,
        logs=[ctx.logs / f"durable-schedules-{tag}-{n}.log" for n in range(workers)],
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if not group.alive():
                return {"error": f"worker exited: {procs.tail(group.logs[0])}"}
            active = ctx.sql(f"SELECT count(*) FROM {SCHEDULE_TABLE} WHERE removed_at IS NULL")[0][
                0
            ]
            leader = ctx.sql(
                "SELECT count(*) FROM durable_jobs_leader WHERE name = 'scheduler' AND owner IS NOT NULL"
            )[0][0]
            if active == schedules and leader:
                break
            if time.monotonic() > deadline:
                return {"error": f"schedules not synced after 60 s ({active} of {schedules})"}
            time.sleep(0.2)
        time.sleep(5.0)  # past start-up: registration, first dequeues, the first leader turns
        before, reads, began = _commits(ctx), _schedule_reads(ctx), time.monotonic()
        time.sleep(window)
        after, took = _commits(ctx), time.monotonic() - began
        figures = {
            "per_second": (after - before - 2) / took,  # less the two reads of the counters
            "schedule_reads_per_second": (_schedule_reads(ctx) - reads) / took,
            "seconds": took,
            "workers": workers,
        }
        if schedules:
            figures |= _fire_all(ctx, schedules)
        return figures
    finally:
        group.stop()


def _fire_all(ctx: Ctx, schedules: int) -> dict:
    """Make every schedule due now; seconds until each tick's job exists, and transactions."""
    before = _commits(ctx)
    began = time.monotonic()
    ctx.sql(
        f"UPDATE {SCHEDULE_TABLE} SET next_tick_at = clock_timestamp(); "
        "SELECT pg_notify('durable_jobs', '!schedules')"
    )
    deadline = began + 120
    started = 0
    while time.monotonic() < deadline:
        started = ctx.sql(f"SELECT count(*) FROM {TABLE} WHERE created_by LIKE 'schedule:%%'")[0][0]
        if started >= schedules:
            break
        time.sleep(0.05)
    took = time.monotonic() - began
    return {
        "ticks_fired": started,
        "fire_seconds": took,
        "fire_per_second": started / took if took else None,
        "fire_transactions": _commits(ctx) - before,
    }


def run(ctx: Ctx, *, schedules: int, window: float, workers: int = 2) -> dict:
    """The idle fleet's rate without and with ``schedules`` schedules, and their firing."""
    none = _idle_rate(ctx, schedules=0, window=window, workers=workers, tag="none")
    many = _idle_rate(ctx, schedules=schedules, window=window, workers=workers, tag="many")
    if "error" in none or "error" in many:
        return {"error": none.get("error") or many.get("error")}
    return {
        "schedules": schedules,
        "workers": workers,
        "window_seconds": window,
        "idle_without": none["per_second"],
        "idle_with": many["per_second"],
        "schedules_cost_per_second": many["per_second"] - none["per_second"],
        "schedule_reads_without": none["schedule_reads_per_second"],
        "schedule_reads_with": many["schedule_reads_per_second"],
        **{
            k: many[k]
            for k in ("ticks_fired", "fire_seconds", "fire_per_second", "fire_transactions")
        },
    }
