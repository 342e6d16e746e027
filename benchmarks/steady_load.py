"""What the long steady-load scenarios share (``horizon_bench``, ``sustained_bench``): a
producer at a fixed rate, the default claim's server time, and the job table's vacuum and
size figures from the statistics views.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg

import durable_jobs as durable
from benchmarks.durable_bench import KIND, TABLE, Ctx
from durable_jobs import store

#: Jobs per ``start_many`` call (each its own transaction) while the producer keeps up.
BATCH = 25
#: The most it starts in one call while it catches up.
CATCH_UP = 500


class Producer:
    """A thread that starts no-op jobs at ``rate`` per second, ``BATCH`` per transaction
    (up to ``CATCH_UP`` while behind schedule), on its own Django connection, until
    ``stop()``; ``started`` counts them."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.started = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        from django.db import connection

        began = time.monotonic()
        try:
            while not self._stop.is_set():
                due = int((time.monotonic() - began) * self.rate)
                # Behind schedule (the machine is busy), it catches up in larger batches, so
                # the rate offered over the run stays the one asked for while it can.
                while self.started < due and not self._stop.is_set():
                    n = min(max(due - self.started, BATCH), CATCH_UP)
                    durable.start_many([{"kind": KIND} for _ in range(n)])
                    self.started += n
                self._stop.wait(0.01)
        finally:
            connection.close()


#: The default claim's parameters for the probes below: one job of the default queue.
_CLAIM_PARAMS = store.claim_params(["default"], "steady-load-probe", 60_000, kinds=None)


def floored_claim_params(conn: psycopg.Connection) -> dict:
    """``_CLAIM_PARAMS`` with a floor where a worker's would be while its queue keeps up:
    the database's clock two seconds ago, so the default level's scan starts
    ``store.FLOOR_MARGIN_MS`` before that (``runtime.claim_floors``)."""
    (at,) = conn.execute("SELECT clock_timestamp() - interval '2 seconds'").fetchone()
    return store.claim_params(
        ["default"], "steady-load-probe", 60_000, kinds=None, floors=[("default", 0, at)]
    )


def claim_plan(
    ctx: Ctx,
    options: str = "ANALYZE, TIMING OFF, SUMMARY ON",
    conn: psycopg.Connection | None = None,
    *,
    floored: bool = False,
) -> list[str]:
    """EXPLAIN the default claim (limit 1) as it runs now, rolled back: the plan's lines.
    On ``conn`` if given (a warm session, as a worker's), else on a fresh connection.
    ``floored``: as a worker's claim between its sweeps (``floored_claim_params``); else
    as a sweep, reading the queue from its start."""
    if conn is None:
        with psycopg.connect(ctx.dburl) as fresh:
            return claim_plan(ctx, options, fresh, floored=floored)
    params = floored_claim_params(conn) if floored else _CLAIM_PARAMS
    rows = conn.execute(f"EXPLAIN ({options}) " + store.DEQUEUE_OPEN, params).fetchall()
    conn.rollback()
    return [line for (line,) in rows]


def claim_times(
    ctx: Ctx, conn: psycopg.Connection | None = None, *, floored: bool = False
) -> dict[str, float | None]:
    """The default claim's server planning and execution times now (ms; limit 1), rolled
    back. A worker's claim is planned every time unless prepared statements are switched
    on, so the planning is part of what each claim costs; measure it on a warm ``conn``
    (a fresh session's first plan also loads the catalog caches)."""
    times: dict[str, float | None] = {"planning": None, "execution": None}
    for line in claim_plan(ctx, conn=conn, floored=floored):
        for key in times:
            if line.startswith(f"{key.title()} Time:"):
                times[key] = float(line.split()[2])
    return times


def claim_ms(ctx: Ctx, *, floored: bool = False) -> float | None:
    """The default claim's server execution time now (limit 1), rolled back."""
    return claim_times(ctx, floored=floored)["execution"]


def table_stats(ctx: Ctx) -> dict:
    """The job table's live and dead tuples, autovacuum runs so far and the last one's time
    (epoch seconds), the sizes of the table and of its indexes (MiB), and the phase of a
    vacuum of the table under way now (None when there is none)."""
    row = ctx.sql(
        f"""SELECT n_live_tup, n_dead_tup, autovacuum_count, extract(epoch FROM last_autovacuum),
                   autoanalyze_count, pg_table_size('{TABLE}'), pg_indexes_size('{TABLE}'),
                   (SELECT phase FROM pg_stat_progress_vacuum WHERE relid = '{TABLE}'::regclass)
              FROM pg_stat_user_tables WHERE relname = '{TABLE}'"""
    )[0]
    live, dead, vacuums, last_vacuum, analyzes, table_bytes, index_bytes, vacuuming = row
    return {
        "live_tuples": int(live),
        "dead_tuples": int(dead),
        "autovacuums": int(vacuums),
        "last_autovacuum": None if last_vacuum is None else float(last_vacuum),
        "autoanalyzes": int(analyzes),
        "table_mib": table_bytes / 2**20,
        "indexes_mib": index_bytes / 2**20,
        "vacuum_phase": vacuuming,
    }


def index_sizes(ctx: Ctx) -> dict[str, float]:
    """Each index of the job table and its size (MiB), largest first."""
    rows = ctx.sql(
        f"""SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes
             WHERE relname = '{TABLE}' ORDER BY 2 DESC"""
    )
    return {name: size / 2**20 for name, size in rows}


#: A column of a table of samples: its heading, its width, and its cell from a sample.
Column = tuple[str, int, Callable[[dict], str]]


def render(samples: list[dict], columns: list[Column]) -> str:
    """A table of samples, one line each, every cell right-aligned to its column's width."""
    lines = ["  ".join(f"{head:>{width}}" for head, width, _ in columns)]
    for sample in samples:
        lines.append("  ".join(f"{cell(sample):>{width}}" for _, width, cell in columns))
    return "\n".join(lines)


def latency_cell(sample: dict) -> str:
    """A sample's start-to-claim latency, p50 / p99 ms, for the tables of samples."""
    if sample["latency_p50_ms"] is None:
        return "-"
    return f"{sample['latency_p50_ms']:.1f} / {sample['latency_p99_ms']:.1f}"
