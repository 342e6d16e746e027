"""The ``churn`` scenario: throughput while the worker's connections are cut (issue #27 item 4).

Short ``bench.sleep`` jobs (``job_seconds`` each) are pre-filled and drained by one
long-running ``manage.py durable_worker`` at 4 slots, twice:

* **undisturbed**: the whole backlog drained; jobs/s over the database-clock window from
  the first claim to the last completion;
* **churn**: a larger backlog, and once the first job has completed a killer thread here
  terminates ``kills`` of the worker's backends every second (``pg_terminate_backend``;
  the worker's connections are found by ``application_name``, which the run sets through
  ``PGAPPNAME``: its slots, handler processes, heartbeat, listener, reconciler, ... and
  never this process's own) for ``churn_seconds``, then stops; the rest of the backlog
  drains undisturbed.

Figures, all from the database clock and the job rows: jobs/s during the churn window and
its ratio to the undisturbed rate; the backlog left when the churn stopped, how long it
took to drain and at what rate (ratio to undisturbed); how many jobs were re-driven
(``redrives > 0``: a job that waited out its lease) or charged an interruption; every job
completed exactly once (``completed == n``, nothing failed); the WARNING lines of the
worker log, and the bookkeeping writes given up among them (a job left to its lease); the backends killed,
by role.
"""

from __future__ import annotations

import collections
import json
import random
import re
import threading
import time

from benchmarks import procs
from benchmarks.durable_bench import ANY_LIVE, REPO, TABLE, Ctx, reset

KIND = "bench.sleep"
APP = "bench-churn"

FILL = f"""
INSERT INTO {TABLE} (id, tenant_id, kind, status, created_at, updated_at, queue_name,
                     next_run_at, pending_since, input)
SELECT gen_random_uuid(), 'default', %(kind)s, 'pending', now(), now(), 'default',
       clock_timestamp(), now(), %(input)s::jsonb
  FROM generate_series(1, %(n)s)
"""

#: The worker's backends: the process's own connection and each thread's (``APP/role``).
WORKER_BACKENDS = """
SELECT pid, application_name FROM pg_stat_activity
 WHERE (application_name = %(app)s OR application_name LIKE %(like)s)
   AND pid <> pg_backend_pid()
"""


class Killer(threading.Thread):
    """Terminate ``kills`` random backends of the worker named ``app`` every second."""

    def __init__(self, dburl: str, app: str, *, kills: int, seed: int = 27) -> None:
        super().__init__(name="churn-killer", daemon=True)
        self.dburl, self.app, self.kills = dburl, app, kills
        self.stop = threading.Event()
        self.killed: collections.Counter[str] = collections.Counter()
        self.rng = random.Random(seed)
        self.started_at = self.ended_at = None
        self.ready = threading.Event()

    def run(self) -> None:
        import psycopg

        with psycopg.connect(
            self.dburl, autocommit=True, application_name="bench-churn-killer"
        ) as conn:
            self.started_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
            self.ready.set()
            next_round = time.monotonic()
            while not self.stop.is_set():
                rows = conn.execute(
                    WORKER_BACKENDS, {"app": self.app, "like": self.app + "/%"}
                ).fetchall()
                for pid, name in self.rng.sample(rows, min(self.kills, len(rows))):
                    if conn.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]:
                        role = name.split("/", 1)[1] if "/" in name else "main"
                        self.killed[re.sub(r"-\d+(\.\d+)?$", "-N", role)] += 1
                next_round += 1.0
                self.stop.wait(max(0.0, next_round - time.monotonic()))
            self.ended_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]


def _fill(ctx: Ctx, n: int, job_seconds: float) -> None:
    ctx.sql(FILL, {"kind": KIND, "n": n, "input": json.dumps({"s": job_seconds})})
    ctx.sql(f"VACUUM (ANALYZE) {TABLE}")


def _start_worker(ctx: Ctx, slots: int, tag: str) -> procs.Group:
    env = ctx.worker_env() | {"PGAPPNAME": APP}
    return procs.Group(
        [ctx.worker_cmd(slots, burst=False)],
        env=env,
        cwd=REPO,
        logs=[ctx.logs / f"durable-churn-{tag}.log"],
    )


def _wait(ctx: Ctx, group: procs.Group, predicate_sql: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group.alive():
            raise RuntimeError(f"worker exited: {procs.tail(group.logs[0])}")
        if ctx.sql(predicate_sql)[0][0]:
            return True
        time.sleep(0.1)
    return False


# Each stops at the first row it finds (``ANY_LIVE``): a count of the table, every 0.1 s,
# was server CPU taken from the fleet being measured. A job that failed ends the wait
# too, and the figures count it.
ALL_DONE = f"SELECT NOT ({ANY_LIVE})"
ANY_DONE = f"SELECT EXISTS (SELECT FROM {TABLE} WHERE status = 'completed')"


def _log_figures(path) -> dict:
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = text.splitlines()
    warnings = [line for line in lines if " WARNING " in line]
    kinds: collections.Counter[str] = collections.Counter()
    for line in warnings:
        message = line.split(" WARNING ", 1)[1]
        message = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<id>", message)
        message = re.sub(r"\d+", "N", message)
        kinds[message[:90]] += 1
    return {
        "warnings": len(warnings),
        "errors": sum(1 for line in lines if " ERROR " in line),
        # "bookkeeping write failed twice; ..." before issue #27, "... failed N times (...); ..."
        # since: a finished job left to wait out its lease.
        "failed_twice": text.count("the reconciler will re-drive it"),
        "top_warnings": kinds.most_common(6),
    }


def _rows(ctx: Ctx) -> dict:
    completed, failed, total, redriven, interrupted, window = ctx.sql(
        f"""SELECT count(*) FILTER (WHERE status = 'completed'),
                   count(*) FILTER (WHERE status = 'failed'), count(*),
                   count(*) FILTER (WHERE redrives > 0),
                   count(*) FILTER (WHERE interruptions > 0),
                   extract(epoch FROM max(finished_at) - min(started_at))
              FROM {TABLE} WHERE kind = %s""",
        [KIND],
    )[0]
    return {
        "completed": completed,
        "failed": failed,
        "rows": total,
        "redriven": redriven,
        "interrupted": interrupted,
        "window": float(window or 0),
    }


def undisturbed(ctx: Ctx, n: int, *, slots: int, job_seconds: float, timeout: float) -> dict:
    reset()
    _fill(ctx, n, job_seconds)
    group = _start_worker(ctx, slots, "undisturbed")
    try:
        drained = _wait(ctx, group, ALL_DONE, timeout)
    finally:
        group.stop()
    rows = _rows(ctx)
    return rows | {
        "n": n,
        "drained": drained,
        "per_second": rows["completed"] / rows["window"] if rows["window"] else None,
        "log": _log_figures(group.logs[0]),
    }


def churned(
    ctx: Ctx,
    n: int,
    *,
    slots: int,
    job_seconds: float,
    churn_seconds: float,
    kills: int,
    timeout: float,
) -> dict:
    reset()
    _fill(ctx, n, job_seconds)
    group = _start_worker(ctx, slots, "churn")
    killer = Killer(ctx.dburl, APP, kills=kills)
    try:
        if not _wait(ctx, group, ANY_DONE, 60):
            raise RuntimeError("the worker completed nothing in 60 s")
        killer.start()
        killer.ready.wait(10)
        time.sleep(churn_seconds)
        killer.stop.set()
        killer.join(10)
        drained = _wait(ctx, group, ALL_DONE, timeout)
    finally:
        killer.stop.set()
        group.stop()
    t0, t1 = killer.started_at, killer.ended_at
    during, before_end, drain_seconds, tail_seconds = ctx.sql(
        f"""SELECT count(*) FILTER (WHERE finished_at BETWEEN %(t0)s AND %(t1)s),
                   count(*) FILTER (WHERE finished_at <= %(t1)s),
                   extract(epoch FROM max(finished_at) - %(t1)s),
                   extract(epoch FROM max(finished_at)
                           - percentile_disc(0.99) WITHIN GROUP (ORDER BY finished_at))
              FROM {TABLE} WHERE kind = %(kind)s AND status = 'completed'""",
        {"t0": t0, "t1": t1, "kind": KIND},
    )[0]
    window = (t1 - t0).total_seconds()
    backlog = n - before_end
    drain_seconds = float(drain_seconds or 0)
    return _rows(ctx) | {
        "n": n,
        "drained": drained,
        "churn_seconds": window,
        "per_second": during / window if window else None,
        "backlog_at_churn_end": backlog,
        "drain_seconds": drain_seconds,
        "drain_per_second": backlog / drain_seconds if drain_seconds > 0 else None,
        "last_1pct_seconds": float(tail_seconds or 0),
        "killed": dict(killer.killed),
        "kills": sum(killer.killed.values()),
        "log": _log_figures(group.logs[0]),
    }


def run(
    ctx: Ctx,
    *,
    n: int = 6000,
    slots: int = 4,
    job_seconds: float = 0.003,
    churn_seconds: float = 20.0,
    after_seconds: float = 8.0,
    kills: int = 2,
    timeout: float = 180.0,
) -> dict:
    """Undisturbed, then churned: see the module docstring. The churned backlog is sized
    from the undisturbed rate, so some ``after_seconds`` of work is left when the churn
    stops (whatever the machine's speed)."""
    calm = undisturbed(ctx, n, slots=slots, job_seconds=job_seconds, timeout=timeout)
    rate = calm["per_second"] or 0.0
    n_churn = max(n, int(rate * (churn_seconds + after_seconds)))
    churn = churned(
        ctx,
        n_churn,
        slots=slots,
        job_seconds=job_seconds,
        churn_seconds=churn_seconds,
        kills=kills,
        timeout=timeout,
    )
    ratio = churn["per_second"] / rate if rate and churn["per_second"] else None
    drain_ratio = churn["drain_per_second"] / rate if rate and churn["drain_per_second"] else None
    return {
        "slots": slots,
        "job_seconds": job_seconds,
        "kills_per_second": kills,
        "undisturbed": calm,
        "churn": churn,
        "ratio": ratio,
        "drain_ratio": drain_ratio,
        "exactly_once": churn["completed"] == churn["n"] == churn["rows"]
        and churn["failed"] == 0
        and calm["completed"] == n,
    }
