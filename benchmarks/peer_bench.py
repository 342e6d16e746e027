"""The peers' scenarios, measured by the runner in SQL on the peers' own tables.

The peer processes (in their own virtual environments) only produce load: pre-fill, the
single-start client, the spaced-start client, the workers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg

from benchmarks import procs
from benchmarks.peers import HERE, Peer


def _sql(peer: Peer, query: str, params=None):
    with psycopg.connect(peer.url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else None


# Per peer: how to empty it, count it, and read its clocks.
RESET = {
    "pgqueuer": "TRUNCATE pgqueuer, pgqueuer_log RESTART IDENTITY",
    "procrastinate": "TRUNCATE procrastinate_events, procrastinate_periodic_defers, "
    "procrastinate_jobs, "
    "procrastinate_workers RESTART IDENTITY CASCADE",
    "tasks_db": "TRUNCATE django_tasks_database_dbtaskresult",
}
# completed, rows, window from first start to last finish (seconds)
THROUGHPUT = {
    # pgqueuer deletes a finished job and logs each status change in pgqueuer_log.
    "pgqueuer": """
        SELECT (SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'),
               (SELECT count(*) FROM pgqueuer_log WHERE status = 'queued'),
               extract(epoch FROM
                   (SELECT max(created) FROM pgqueuer_log WHERE status = 'successful')
                 - (SELECT min(created) FROM pgqueuer_log WHERE status = 'picked'))""",
    "procrastinate": """
        SELECT (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),
               (SELECT count(*) FROM procrastinate_jobs),
               extract(epoch FROM
                   (SELECT max(at) FROM procrastinate_events WHERE type = 'succeeded')
                 - (SELECT min(at) FROM procrastinate_events WHERE type = 'started'))""",
    "tasks_db": """
        SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), count(*),
               extract(epoch FROM max(finished_at) - min(started_at))
          FROM django_tasks_database_dbtaskresult""",
}
# (id, latency seconds) of every job: start - enqueue
LATENCIES = {
    "pgqueuer": """
        SELECT q.job_id, extract(epoch FROM p.created - q.created), s.job_id IS NOT NULL
          FROM pgqueuer_log q
          LEFT JOIN pgqueuer_log p ON p.job_id = q.job_id AND p.status = 'picked'
          LEFT JOIN pgqueuer_log s ON s.job_id = q.job_id AND s.status = 'successful'
         WHERE q.status = 'queued'""",
    "procrastinate": """
        SELECT j.id, extract(epoch FROM s.at - d.at), j.status = 'succeeded'
          FROM procrastinate_jobs j
          LEFT JOIN procrastinate_events d ON d.job_id = j.id AND d.type = 'deferred'
          LEFT JOIN procrastinate_events s ON s.job_id = j.id AND s.type = 'started'""",
    "tasks_db": """
        SELECT id, extract(epoch FROM started_at - enqueued_at), status = 'SUCCESSFUL'
          FROM django_tasks_database_dbtaskresult""",
}
UNFINISHED = {
    "pgqueuer": "SELECT count(*) FROM pgqueuer",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
    "tasks_db": "SELECT count(*) FROM django_tasks_database_dbtaskresult "
    "WHERE status <> 'SUCCESSFUL'",
}


def reset(peer: Peer) -> None:
    _sql(peer, RESET[peer.spec.key])


def _worker_cmds(
    peer: Peer,
    *,
    processes: int,
    slots: int,
    burst: bool,
    notify: bool,
    poll_interval: float,
    batch_size: int | None = None,
) -> list[list[str]]:
    """Each peer's own worker command with its defaults; ``slots`` only where the peer has
    a concurrency setting that means what ours does."""
    if peer.spec.key == "pgqueuer":
        # Its own worker command with its defaults whatever ``slots`` is (batch of 10, no
        # concurrency limit, dequeue timeout 30 s, always LISTENs, logs at INFO): pgqueuer has
        # no slot count (an entrypoint concurrency_limit of 1 runs 9-34 jobs/s here: it dequeues
        # again only after a status-buffer flush and a minimum poll interval). ``batch_size``
        # is the tuned configuration, shown only in a row of its own that says so
        # (--max-concurrent-tasks refuses anything below twice the batch size).
        # `--mode drain` exits once the queue is empty.
        args = (
            ["run", "pgqueuer_peer:create"]
            + (["--batch-size", str(batch_size)] if batch_size else [])
            + (["--mode", "drain"] if burst else [])
        )
        return [peer.tool("pgq", *args) for _ in range(processes)]
    if peer.spec.key == "procrastinate":
        args = ["worker", "--concurrency", str(slots), "--poll-interval", repr(poll_interval)]
        if burst:
            args.append("--one-shot")
        if not notify:
            args.append("--no-listen")
        return [peer.cmd(*args) for _ in range(processes)]
    # django-tasks-db runs one task at a time per process (no in-process concurrency):
    # K slots in one process become K processes; P processes stay P processes of one slot.
    args = ["worker", "--interval", repr(poll_interval)]
    if burst:
        args.append("--batch")
    return [peer.cmd(*args) for _ in range(processes if processes > 1 else slots)]


def start_rate(peer: Peer, n: int, *, env: dict, logs: Path) -> dict:
    reset(peer)
    log = logs / f"{peer.spec.key}-start-rate.log"
    result = procs.run(
        peer.cmd("start-rate", "--n", str(n)), env=peer.env(env), cwd=HERE, log=log, timeout=600
    )
    if result.exit_code != 0:
        return {"error": f"exit {result.exit_code}: {procs.tail(log, 2)}"}
    lines = [line for line in Path(log).read_text().splitlines() if line.startswith("{")]
    data = json.loads(lines[-1])
    rows = _sql(peer, THROUGHPUT[peer.spec.key])[0][1]
    return {
        "n": n,
        "seconds": data["seconds"],
        "per_second": n / data["seconds"],
        "rows": rows,
        "verified": rows == n + 1,
    }


def throughput(
    peer: Peer,
    n: int,
    *,
    processes: int,
    slots: int,
    env: dict,
    logs: Path,
    tag: str,
    timeout: float,
    server_pid: int | None = None,
    batch_size: int | None = None,
) -> dict:
    reset(peer)
    began = time.perf_counter()
    fill = procs.run(
        peer.cmd("fill", "--n", str(n)),
        env=peer.env(env),
        cwd=HERE,
        log=logs / f"{peer.spec.key}-fill-{tag}.log",
        timeout=600,
    )
    if fill.exit_code != 0:
        return {"error": f"fill failed: {procs.tail(fill.log, 2)}"}
    fill_seconds = time.perf_counter() - began
    cmds = _worker_cmds(
        peer,
        processes=processes,
        slots=slots,
        burst=True,
        notify=True,
        poll_interval=1.0,
        batch_size=batch_size,
    )
    group_logs = [logs / f"{peer.spec.key}-{tag}-{i}.log" for i in range(len(cmds))]
    cpu0 = procs.server_cpu_seconds(server_pid)
    results = procs.Group(cmds, env=peer.env(env), cwd=HERE, logs=group_logs).wait(timeout)
    cpu1 = procs.server_cpu_seconds(server_pid)
    completed, total, window = _sql(peer, THROUGHPUT[peer.spec.key])[0]
    return procs.drain_figures(
        results,
        n=n,
        completed=completed,
        rows=total,
        window=window,
        server_cpu=(cpu0, cpu1),
        logs=group_logs,
    ) | {
        "processes": len(cmds),
        "slots_per_process": {"procrastinate": slots, "tasks_db": 1}.get(peer.spec.key),
        "fill_seconds": fill_seconds,
        "batch_size": batch_size,
    }


def latency(
    peer: Peer,
    m: int,
    *,
    notify: bool,
    poll_interval: float,
    slots: int,
    gap: float,
    env: dict,
    logs: Path,
    tag: str,
) -> dict:
    reset(peer)
    cmds = _worker_cmds(
        peer, processes=1, slots=slots, burst=False, notify=notify, poll_interval=poll_interval
    )
    group_logs = [logs / f"{peer.spec.key}-latency-{tag}-{i}.log" for i in range(len(cmds))]
    group = procs.Group(cmds, env=peer.env(env), cwd=HERE, logs=group_logs)
    try:
        warm = procs.run(
            peer.cmd("latency", "--n", "3", "--gap", "0.05"),
            env=peer.env(env),
            cwd=HERE,
            log=logs / f"{peer.spec.key}-latency-{tag}-warm.log",
            timeout=120,
        )
        if warm.exit_code != 0:
            return {"error": f"warm-up client failed: {procs.tail(warm.log, 2)}"}
        if not _wait_done(peer, group, timeout=60, notify=notify):
            return {"error": f"worker not ready after 60 s: {procs.tail(group_logs[0], 2)}"}
        warm_ids = [r[0] for r in _sql(peer, LATENCIES[peer.spec.key])]
        client = procs.run(
            peer.cmd("latency", "--n", str(m), "--gap", repr(gap)),
            env=peer.env(env),
            cwd=HERE,
            log=logs / f"{peer.spec.key}-latency-{tag}-client.log",
            timeout=600,
        )
        if client.exit_code != 0:
            return {"error": f"client failed: {procs.tail(client.log, 2)}"}
        _wait_done(peer, group, timeout=max(30.0, poll_interval * 5), notify=False)
    finally:
        results = group.stop()
    rows = [r for r in _sql(peer, LATENCIES[peer.spec.key]) if r[0] not in set(warm_ids)]
    values = sorted(float(r[1]) for r in rows if r[1] is not None)
    completed = sum(1 for r in rows if r[2])
    return {
        "m": m,
        "rows": len(rows),
        "completed": completed,
        "p50_ms": _pct(values, 50) * 1000 if values else None,
        "p99_ms": _pct(values, 99) * 1000 if values else None,
        "max_ms": values[-1] * 1000 if values else None,
        "verified": len(rows) == m and completed == m,
        "max_rss_mib": max(r.max_rss_kib for r in results) / 1024,
        "processes": len(cmds),
    }


def _wait_done(peer: Peer, group: procs.Group, *, timeout: float, notify: bool) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group.alive():
            return False
        left = _sql(peer, UNFINISHED[peer.spec.key])[0][0]
        # pgqueuer LISTENs on the connection it also queries on: pg_stat_activity shows its last
        # statement, not the LISTEN; its warm-up jobs completing is the readiness signal.
        listening = (
            (not notify)
            or peer.spec.key == "pgqueuer"
            or _sql(
                peer,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query ILIKE 'LISTEN %%'",
            )[0][0]
            > 0
        )
        if left == 0 and listening:
            return True
        time.sleep(0.1)
    return False


def _pct(values: list[float], pct: float) -> float:
    k = (len(values) - 1) * pct / 100
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)
