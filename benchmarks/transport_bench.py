"""The ``transports`` scenario: each transport against the database transport.

For the database, RabbitMQ and Redis Streams in turn, at 4, 16 and 64 slots spread over
several worker processes (``POINTS``): ``n`` no-op jobs started through ``durable.start``
(so a broker queue's jobs are published after commit, as in production) are drained by
``durable_worker --burst``; the rate is completions over the database-clock window (first
claim to last finish). Then ``m`` single starts, ``gap`` apart, to an idle fleet: the
start-to-claim latency (``started_at - created_at``, database clock) percentiles. The
PostgreSQL load per job is the benchmark database's ``xact_commit`` delta over the drain
(every statement the workers and the starts committed) and the server's CPU seconds.

The workers read the transport from ``BENCH_TRANSPORT`` (``benchmarks/settings_bench.py``);
each run uses its own ``BENCH_BROKER_PREFIX`` so no run sees another's messages. A broker
that does not answer on loopback is reported, and its runs skipped.
"""

from __future__ import annotations

import socket
import time
import uuid

import django.conf

import durable_jobs as durable
from benchmarks import procs
from benchmarks.durable_bench import KIND, REPO, TABLE, Ctx, fill, reset, throughput_prefilled

TRANSPORTS = ("database", "rabbitmq", "redis")
PORTS = {"rabbitmq": 5672, "redis": 6379}
URLS = {"rabbitmq": "amqp://guest:guest@127.0.0.1:5672/%2F", "redis": "redis://127.0.0.1:6379/0"}
#: (processes, slots per process): 4, 16 and 64 slots in all.
POINTS = ((2, 2), (4, 4), (4, 16))


def _answers(transport: str) -> bool:
    if transport == "database":
        return True
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", PORTS[transport])) == 0


def _configure(transport: str, prefix: str) -> dict:
    """This process's settings (the starts publish) and the workers' environment."""
    base = dict(django.conf.settings.DURABLE_JOBS)
    base.pop("TRANSPORT", None)
    if transport != "database":
        base |= {
            "TRANSPORT": transport,
            "QUEUES": ["default"],
            "BROKER_URLS": URLS,
            "BROKER_PREFIX": prefix,
        }
    django.conf.settings.DURABLE_JOBS = base
    return {"BENCH_TRANSPORT": transport, "BENCH_BROKER_PREFIX": prefix}


def _commits(ctx: Ctx) -> int:
    time.sleep(0.6)  # backends flush their counters at most once a second
    row = ctx.sql("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
    return int(row[0][0])


def drain(ctx: Ctx, transport: str, n: int, *, processes: int, slots: int, timeout: float) -> dict:
    reset()
    env = _configure(transport, f"bench.{uuid.uuid4().hex[:8]}")
    before = _commits(ctx)
    began = time.perf_counter()
    fill(n, batch=200)
    start_seconds = time.perf_counter() - began
    out = throughput_prefilled(
        ctx,
        n,
        processes=processes,
        slots=slots,
        tag=f"transport-{transport}-{processes}x{slots}",
        timeout=timeout,
        execution="thread",
        extra_env=env,
    )
    after = _commits(ctx)
    return out | {
        "transport": transport,
        "start_seconds": start_seconds,
        "commits_per_job": (after - before) / n,
        "server_cpu_ms_per_job": None
        if out["server_cpu_seconds"] is None
        else out["server_cpu_seconds"] * 1000 / n,
    }


def latency(ctx: Ctx, transport: str, m: int, *, processes: int, slots: int, gap: float) -> dict:
    reset()
    env = ctx.worker_env() | _configure(transport, f"bench.{uuid.uuid4().hex[:8]}")
    tag = f"transport-latency-{transport}"
    cmds = [ctx.worker_cmd(slots, burst=False, execution="thread") for _ in range(processes)]
    logs = [ctx.logs / f"{tag}-{i}.log" for i in range(processes)]
    group = procs.Group(cmds, env=env, cwd=REPO, logs=logs)
    try:
        time.sleep(3.0)  # the fleet connects and goes idle
        for _ in range(m):
            durable.start(KIND)
            time.sleep(gap)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = ctx.sql(f"SELECT count(*) FROM {TABLE} WHERE status = 'completed'")[0][0]
            if done >= m:
                break
            time.sleep(0.1)
    finally:
        group.stop()
    p50, p90, p99, done = ctx.sql(
        f"""SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
                   percentile_cont(0.9) WITHIN GROUP (ORDER BY ms),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), count(*)
              FROM (SELECT extract(epoch FROM started_at - created_at) * 1000 AS ms
                      FROM {TABLE} WHERE kind = %s AND started_at IS NOT NULL) AS s""",
        [KIND],
    )[0]
    return {
        "transport": transport,
        "m": m,
        "claimed": done,
        "p50_ms": p50,
        "p90_ms": p90,
        "p99_ms": p99,
    }


def run(ctx: Ctx, *, n: int, m: int, timeout: float, quick: bool) -> dict:
    """Every transport at every point; brokers that do not answer are reported and skipped."""
    found: dict = {"drains": [], "latency": [], "skipped": []}
    points = POINTS[:2] if quick else POINTS
    original = django.conf.settings.DURABLE_JOBS
    try:
        for transport in TRANSPORTS:
            if not _answers(transport):
                found["skipped"].append(transport)
                continue
            for processes, slots in points:
                print(f"    {transport} {processes}x{slots}", flush=True)
                found["drains"].append(
                    drain(ctx, transport, n, processes=processes, slots=slots, timeout=timeout)
                )
            found["latency"].append(latency(ctx, transport, m, processes=2, slots=2, gap=0.03))
    finally:
        django.conf.settings.DURABLE_JOBS = original
        reset()
    return found
