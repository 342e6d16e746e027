"""``manage.py durable_demo``: start a few real jobs, run a real worker, watch them finish.

It starts a checkpointing multi-slice import, a job that fails transiently twice and
then succeeds, and a long import that is cancelled midway; runs
``manage.py durable_worker`` as a subprocess; draws a progress bar per job from the
job rows; and ends with a summary table read from the database.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

import durable_jobs as durable
from durable_jobs.management import preflight
from durable_jobs.models import Job
from testproject import database
from testproject.demo.models import Effect, Report

ROOT = Path(__file__).resolve().parents[4]
BAR = 28


def bar(job: Job) -> str:
    if job.total_count:
        done = int(BAR * min(1.0, job.processed_count / job.total_count))
        return (
            "["
            + "#" * done
            + "." * (BAR - done)
            + f"] {job.processed_count:>3}/{job.total_count:<3}"
        )
    filled = {"completed": BAR, "failed": 0, "cancelled": 0}.get(job.status, 0)
    return "[" + "#" * filled + "." * (BAR - filled) + "]        "


def manage_py() -> str:
    """``manage.py`` as the reader should type it: this interpreter, paths as short as they go.

    The README runs the demo as ``.venv/bin/python manage.py ...`` without activating the
    venv, so a bare ``python`` would be another interpreter (or none).
    """
    cwd = Path.cwd()
    script = _relative(ROOT / "manage.py", cwd)
    interpreter = _relative(
        Path(os.path.abspath(sys.executable)), cwd
    )  # abspath: keep the venv's symlink
    if os.sep not in interpreter:
        interpreter = "." + os.sep + interpreter  # a bare name would be looked up on PATH
    on_path = shutil.which(Path(sys.executable).name)
    if on_path and os.path.abspath(on_path) == os.path.abspath(sys.executable):
        interpreter = Path(sys.executable).name
    return f"{interpreter} {script}"


def _relative(path: Path, cwd: Path) -> str:
    relative = os.path.relpath(path, cwd)
    return str(path) if relative.startswith("..") else relative


def describe(job: Job) -> str:
    if job.status == "running" and job.lease_owner is None:
        return f"retrying ({job.error_code})"
    if job.status == "failed":
        return f"failed: {job.error_code}"
    if job.cancel_requested_at and job.status in ("pending", "running"):
        return f"{job.status}, cancel requested"
    return job.status


class Command(BaseCommand):
    help = "Run the durable_jobs demo: real jobs, a real worker, live progress, a summary."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--rows", type=int, default=60, help="rows in the main import (default 60)"
        )
        parser.add_argument(
            "--timeout", type=float, default=120, help="give up after this many seconds"
        )

    def handle(self, *args, rows: int, timeout: float, **options) -> None:
        problem = preflight.unreachable()
        if problem is not None:
            raise CommandError(problem)
        call_command("migrate", verbosity=0)
        self.stdout.write(self.style.MIGRATE_HEADING("durable_jobs demo"))
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            version = cursor.fetchone()[0].split()[0]
        self.stdout.write(f"database: {database.describe(connection.settings_dict, version)}\n")

        labels = self._start_jobs(rows)
        worker = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "durable_worker",
                "--concurrency",
                "3",
                "--reconcile",
                "-v",
                "0",
            ],
            cwd=ROOT,
            env={**os.environ, "DURABLE_JOBS_SLICE_BUDGET": "1.0"},
            stdin=subprocess.DEVNULL,
        )
        began = time.monotonic()
        try:
            self._watch(labels, began, timeout)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()
        self._summary(labels, time.monotonic() - began)

    def _start_jobs(self, rows: int) -> dict:
        with transaction.atomic():
            report = Report.objects.create(name="demo import")
            main = durable.start(
                "demo.import",
                subject=report,
                input={"rows": rows, "batch": 3, "delay": 0.15},
                total_count=rows,
                created_by="demo",
            )
            flaky = durable.start("demo.flaky", input={"failures": 2}, created_by="demo")
            doomed_report = Report.objects.create(name="demo import to cancel")
            doomed = durable.start(
                "demo.import",
                subject=doomed_report,
                input={"rows": 200, "batch": 2, "delay": 0.08},
                total_count=200,
                created_by="demo",
            )
            small = durable.start(
                "demo.import",
                input={"rows": 12, "batch": 4, "delay": 0.2},
                total_count=12,
                created_by="demo",
            )
        return {
            main.id: "import (checkpoints, many slices)",
            flaky.id: "flaky (fails twice, then works)",
            doomed.id: "import (cancelled midway)",
            small.id: "small import",
        }

    def _watch(self, labels: dict, began: float, timeout: float) -> None:
        tty = self.stdout.isatty()
        doomed = next(job_id for job_id, label in labels.items() if "cancelled" in label)
        cancelled = False
        drawn = 0
        last_plain = 0.0
        while True:
            jobs = {job.id: job for job in Job.objects.filter(id__in=list(labels))}
            if not cancelled and jobs[doomed].processed_count >= 40:
                durable.cancel(doomed, by="demo operator")
                cancelled = True
            lines = [
                f"{labels[job_id]:<36} {bar(jobs[job_id])} {describe(jobs[job_id])}"
                for job_id in labels
            ]
            if tty:
                if drawn:
                    self.stdout.write(f"\x1b[{drawn}F", ending="")
                for line in lines:
                    self.stdout.write("\x1b[2K" + line)
                drawn = len(lines)
            finished = all(
                job.status in ("completed", "failed", "cancelled") for job in jobs.values()
            )
            if not tty and (finished or time.monotonic() - last_plain > 1.0):
                # Without a terminal, a board every second, and the final one exactly once.
                self.stdout.write(f"-- {time.monotonic() - began:5.1f}s")
                for line in lines:
                    self.stdout.write("   " + line)
                last_plain = time.monotonic()
            if finished:
                return
            if time.monotonic() - began > timeout:
                self.stderr.write("demo: timed out waiting for the jobs")
                return
            time.sleep(0.2)

    def _summary(self, labels: dict, elapsed: float) -> None:
        self.stdout.write("")
        header = f"{'job':<36} {'status':<10} {'slices':>6} {'retries':>7} {'progress':>9} {'effects':>7}  result"
        self.stdout.write(self.style.MIGRATE_HEADING(header))
        for job_id, label in labels.items():
            job = Job.objects.get(id=job_id)
            progress = f"{job.processed_count}/{job.total_count}" if job.total_count else "-"
            effects = Effect.objects.filter(job_id=job_id).count()
            retries = "yes" if job.kind == "demo.flaky" and job.result else "-"
            if job.kind == "demo.flaky" and job.result:
                retries = str(job.result["attempts"] - 1)
            result = job.result if job.result is not None else (job.error_code or "")
            self.stdout.write(
                f"{label:<36} {job.status:<10} {job.continuation_seq + 1:>6} {retries:>7} {progress:>9} "
                f"{effects:>7}  {result}"
            )
        statuses = [Job.objects.get(id=job_id).status for job_id in labels]
        effects = Effect.objects.filter(job_id__in=list(labels))
        duplicates = effects.count() - effects.values("job_id", "item").distinct().count()
        self.stdout.write(
            f"\n{statuses.count('completed')} completed, {statuses.count('cancelled')} cancelled, "
            f"{statuses.count('failed')} failed in {elapsed:.1f}s; "
            f"{effects.count()} effect rows written, {duplicates} duplicated."
        )
        command = manage_py()
        self.stdout.write(f"Next: {command} durable_jobs stats   |   {command} durable_jobs list")
