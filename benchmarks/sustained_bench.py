"""Sustained throughput (issue #27 item 5): a steady run at 80 % of the fleet's peak, long
enough for the job table's dead tuples, autovacuum and index growth to show.

One warmed-up fleet of default workers (``durable_worker`` with no flags: one slot,
process execution; four processes by default) first drains a backlog of no-op jobs put
in at once: the peak, jobs/s from its first claim to its last completion (or the peak is
given). The table is emptied and a producer then starts no-op jobs at ``share`` of that
peak (``start_many`` of 25 at a time) for ``seconds``. Every ``interval`` the run samples,
from the database: the backlog (live jobs by status, from the live-kind index), the
default claim's server planning and execution times (EXPLAIN ANALYZE, rolled back, on one
warm session), the job table's live and dead tuples, autovacuum runs and whether a vacuum
is under way, the table's and its indexes' sizes, and what else takes the machine (the
load average, the server's and the fleet's CPU, checkpoints, WAL written). After the
fleet has stopped, one pass over the table counts the completions of every second and of
every sample, and the start-to-claim latency of the jobs claimed in each sample, by the
database clock.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

import psycopg

from benchmarks import procs, steady_load
from benchmarks.durable_bench import (
    ANY_LIVE,
    KIND,
    REPO,
    TABLE,
    Ctx,
    _fleet_cpu,
    _settled,
    _warm_up,
    fill_pending_sql,
    reset,
)
from durable_jobs import conf
from durable_jobs.states import LIVE_STATUSES

#: Seconds in the sliding window whose worst completions/s the report gives.
WINDOW = 10


@contextlib.contextmanager
def naptime(ctx: Ctx, seconds: float | None) -> Iterator[None]:
    """Run with the server's ``autovacuum_naptime`` at ``seconds`` (a reload, no restart),
    then back to its default: only on the benchmark's own embedded server."""
    if seconds is None:
        yield
        return
    if not ctx.server.embedded:
        raise ValueError("--sustained-naptime changes a server setting: embedded server only")
    with ctx.server.connect() as conn:
        conn.execute(f"ALTER SYSTEM SET autovacuum_naptime = '{float(seconds):g}s'")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with ctx.server.connect() as conn:
            conn.execute("ALTER SYSTEM RESET autovacuum_naptime")
            conn.execute("SELECT pg_reload_conf()")


def run(
    ctx: Ctx,
    *,
    seconds: float,
    peak: float | None = None,
    backlog: int = 20_000,
    share: float = 0.8,
    processes: int = 4,
    interval: float = 5.0,
) -> dict:
    reset()
    cmds = [ctx.worker_cmd(1, burst=False) for _ in range(processes)]
    logs = [ctx.logs / f"durable-sustained-{i}.log" for i in range(processes)]
    group = procs.Group(cmds, env=ctx.worker_env(), cwd=REPO, logs=logs)
    producer = None
    try:
        problem = _warm_up(ctx, group, notify=True)
        if problem:
            return {"error": problem}
        _settled(group)
        measured = None if peak else _drain_peak(ctx, backlog)
        peak = peak or measured
        if not peak:
            return {"error": "the peak drain did not finish"}
        reset()
        print(f"    peak {peak:,.0f} jobs/s; producer at {share * peak:,.0f}/s for {seconds:g} s")
        producer = steady_load.Producer(share * peak)
        began = time.time()
        producer.start()
        samples, probes = _steady(
            ctx, producer, _fleet_cpu(group), seconds=seconds, interval=interval
        )
        ended = time.time()
        producer.stop()
    finally:
        if producer is not None:
            producer.stop()
        group.stop()
    return (
        summarise(
            ctx,
            samples,
            began=began,
            ended=ended,
            started=producer.started,
            rate=share * peak,
            interval=interval,
        )
        | {
            "peak": peak,
            "peak_measured": measured,
            "backlog": backlog if measured else None,
            "share": share,
            "processes": processes,
            "seconds": seconds,
        }
        | probes
    )


def _drain_peak(ctx: Ctx, backlog: int, timeout: float = 300.0) -> float | None:
    """Put ``backlog`` due no-op jobs in at once before the idle fleet; its jobs/s from
    the first claim to the last completion, or None if it has not drained in ``timeout``."""
    reset()
    fill_pending_sql(ctx, backlog)
    ctx.sql("SELECT pg_notify(%s, %s)", [conf.get().NOTIFY_CHANNEL, conf.get().DEFAULT_QUEUE])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not ctx.sql(ANY_LIVE)[0][0]:  # stops at the first live row, unlike a count
            done, window = ctx.sql(
                f"""SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))
                      FROM {TABLE}"""
            )[0]
            return done / float(window) if window else None
        time.sleep(0.2)
    return None


def _steady(
    ctx: Ctx,
    producer: steady_load.Producer,
    fleet_cpu: Callable[[], float],
    *,
    seconds: float,
    interval: float,
) -> tuple[list[dict], dict]:
    """Sample every ``interval`` while the producer runs for ``seconds``; the claim's plan
    (EXPLAIN ANALYZE, BUFFERS) and each index's size after the first sample and at the end."""
    samples: list[dict] = []
    probes = {}
    began = time.monotonic()
    ticks = max(1, round(seconds / interval))
    with psycopg.connect(ctx.dburl) as probe:
        steady_load.claim_times(ctx, probe)  # warm the session's catalog caches
        for tick in range(1, ticks + 1):
            time.sleep(max(0.0, began + tick * interval - time.monotonic()))
            at = time.time()
            sample = _sample(ctx, probe) | {"fleet_cpu": fleet_cpu()}
            samples.append(sample | {"t": time.monotonic() - began, "at": at})
            if tick == 1 or tick == ticks:
                at_end = "end" if tick == ticks else "start"
                probes[f"claim_plan_{at_end}"] = "\n".join(
                    steady_load.claim_plan(ctx, "ANALYZE, BUFFERS", probe)
                )
                probes[f"index_sizes_{at_end}"] = steady_load.index_sizes(ctx)
    return samples, probes


def _sample(ctx: Ctx, probe: psycopg.Connection) -> dict:
    live = dict(
        ctx.sql(
            f"""SELECT status, count(*) FROM {TABLE}
                 WHERE kind = %s AND status = ANY(%s) GROUP BY status""",
            [KIND, list(LIVE_STATUSES)],
        )
    )
    claim = steady_load.claim_times(ctx, probe)
    return (
        steady_load.table_stats(ctx)
        | _server_activity(ctx, probe)
        | {
            "pending": int(live.get("pending", 0)),
            "running": int(live.get("running", 0)),
            "claim_server_ms": claim["execution"],
            "claim_planning_ms": claim["planning"],
        }
    )


def _server_activity(ctx: Ctx, probe: psycopg.Connection) -> dict:
    """What else takes the machine: its load average, the server's CPU so far, checkpoints
    and WAL written so far (None where the server has no such view)."""
    figures: dict = {
        "load": os.getloadavg()[0],
        "server_cpu": procs.server_cpu_seconds(ctx.server.postmaster_pid()),
        "checkpoints": None,
        "wal_mib": None,
    }
    try:
        figures["checkpoints"] = probe.execute(
            "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
        ).fetchone()[0]
        figures["wal_mib"] = (
            float(probe.execute("SELECT wal_bytes FROM pg_stat_wal").fetchone()[0]) / 2**20
        )
    except psycopg.Error:  # before PostgreSQL 17 (pg_stat_checkpointer) or 14 (pg_stat_wal)
        pass
    probe.rollback()
    return figures


def summarise(
    ctx: Ctx,
    samples: list[dict],
    *,
    began: float,
    ended: float,
    started: int,
    rate: float,
    interval: float,
) -> dict:
    """Completions per second and per sample from the table (the fleet has stopped), and
    the figures the report compares: first against last minute, the worst window."""
    per_second = dict(
        ctx.sql(
            f"""SELECT floor(extract(epoch FROM finished_at) - %(began)s)::int, count(*)
                  FROM {TABLE}
                 WHERE finished_at >= to_timestamp(%(began)s)
                   AND finished_at < to_timestamp(%(ended)s)
                 GROUP BY 1""",
            {"began": began, "ended": ended},
        )
    )
    _per_sample(ctx, samples, began=began, per_second=per_second)
    duration = ended - began
    full = int(duration)
    counts = [per_second.get(s, 0) for s in range(full)]
    # "A minute": the issue's; a run shorter than three minutes compares its thirds.
    edge = min(60, full // 3) or 1
    first = sum(counts[:edge]) / edge
    last = sum(counts[-edge:]) / edge
    windows = [sum(counts[i : i + WINDOW]) / WINDOW for i in range(max(0, full - WINDOW + 1))]
    worst = min(windows) if windows else None
    dead = [s["dead_tuples"] for s in samples]
    # A sample's vacuum phase is the one under way as it ended: its interval's completions
    # set beside the others' say what a vacuum costs the fleet.
    vacuuming = [s["completed_per_second"] for s in samples if s["vacuum_phase"]]
    quiet = [s["completed_per_second"] for s in samples if not s["vacuum_phase"]]
    return {
        "offered_per_second": started / duration,
        "rate": rate,
        "duration": duration,
        "interval": interval,
        "edge_seconds": edge,
        "first_per_second": first,
        "last_per_second": last,
        "ratio": last / first if first else None,
        "worst_window_per_second": worst,
        "worst_window_share": None if worst is None else worst / (started / duration),
        "worst_window_at": None if worst is None else windows.index(worst),
        "dead_tuples_max": max(dead) if dead else None,
        "autovacuums": _delta(samples, "autovacuums"),
        "checkpoints": _delta(samples, "checkpoints"),
        "vacuum_samples": len(vacuuming),
        "per_second_vacuuming": sum(vacuuming) / len(vacuuming) if vacuuming else None,
        "per_second_otherwise": sum(quiet) / len(quiet) if quiet else None,
        "samples": samples,
        "per_second": counts,
    }


def _per_sample(ctx: Ctx, samples: list[dict], *, began: float, per_second: dict) -> None:
    """Give each sample the completions/s and the start-to-claim latency (p50 / p99, ms) of
    the jobs finished and claimed since the sample before it."""
    bounds = [began] + [s["at"] for s in samples]
    latency = {
        int(bucket): (p50, p99)
        for bucket, p50, p99 in ctx.sql(
            f"""SELECT width_bucket(extract(epoch FROM started_at)::float8, %(bounds)s),
                       percentile_cont(0.5) WITHIN GROUP
                           (ORDER BY extract(epoch FROM started_at - created_at)),
                       percentile_cont(0.99) WITHIN GROUP
                           (ORDER BY extract(epoch FROM started_at - created_at))
                  FROM {TABLE} WHERE started_at >= to_timestamp(%(began)s)
                 GROUP BY 1""",
            {"bounds": bounds, "began": began},
        )
    }
    done = {
        int(bucket): n
        for bucket, n in ctx.sql(
            f"""SELECT width_bucket(extract(epoch FROM finished_at)::float8, %(bounds)s), count(*)
                  FROM {TABLE} WHERE finished_at >= to_timestamp(%(began)s) GROUP BY 1""",
            {"bounds": bounds, "began": began},
        )
    }
    previous: dict = {}
    for i, sample in enumerate(samples, start=1):
        seconds = bounds[i] - bounds[i - 1]
        for key, rate in [
            ("server_cpu", "server_cores"),
            ("fleet_cpu", "fleet_cores"),
            ("wal_mib", "wal_mib_per_second"),
        ]:
            had, has = previous.get(key), sample.get(key)
            sample[rate] = None if had is None or has is None else (has - had) / seconds
        previous = sample
        p50, p99 = latency.get(i, (None, None))
        sample["completed_per_second"] = done.get(i, 0) / (bounds[i] - bounds[i - 1])
        sample["latency_p50_ms"] = None if p50 is None else float(p50) * 1000
        sample["latency_p99_ms"] = None if p99 is None else float(p99) * 1000


def table(result: dict) -> str:
    """The samples, one line each."""
    return steady_load.render(
        result.get("samples", []),
        [
            ("t (s)", 6, lambda s: f"{s['t']:.0f}"),
            ("jobs/s", 7, lambda s: f"{s['completed_per_second']:,.0f}"),
            ("backlog", 8, lambda s: f"{s['pending'] + s['running']:,}"),
            ("p50 / p99 ms", 15, steady_load.latency_cell),
            ("claim plan / run ms", 19, _claim_cell),
            ("live", 9, lambda s: f"{s['live_tuples']:,}"),
            ("dead", 9, lambda s: f"{s['dead_tuples']:,}"),
            ("table / indexes MiB", 19, lambda s: f"{s['table_mib']:.1f} / {s['indexes_mib']:.1f}"),
            ("autovac", 7, lambda s: str(s["autovacuums"])),
            ("ckpt", 4, lambda s: "-" if s["checkpoints"] is None else str(s["checkpoints"])),
            ("WAL MiB/s", 9, lambda s: _figure(s["wal_mib_per_second"], ".1f")),
            ("server / fleet cores", 20, _cores_cell),
            ("load", 5, lambda s: f"{s['load']:.1f}"),
            ("vacuum now", 22, lambda s: s["vacuum_phase"] or "-"),
        ],
    )


def _claim_cell(sample: dict) -> str:
    return f"{sample['claim_planning_ms'] or 0:.1f} / {sample['claim_server_ms'] or 0:.2f}"


def _figure(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _cores_cell(sample: dict) -> str:
    return f"{_figure(sample['server_cores'], '.2f')} / {_figure(sample['fleet_cores'], '.2f')}"


def _delta(samples: list[dict], key: str) -> int | None:
    """How much a counter grew from the first sample to the last."""
    if not samples or samples[0][key] is None or samples[-1][key] is None:
        return None
    return samples[-1][key] - samples[0][key]
