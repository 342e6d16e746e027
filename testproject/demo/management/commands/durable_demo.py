"""``manage.py durable_demo``: start a few real jobs, run a real worker, kill it, watch them finish.

It starts a checkpointing multi-slice import, a job that fails transiently twice and
then succeeds, and a long import that is cancelled midway; runs
``manage.py durable_worker`` as a subprocess; draws a progress bar per job from the
job rows. Midway through the main import it kills the worker and its handler processes
with SIGKILL and starts a new worker, which takes the import over from its last
checkpoint once the dead worker's lease has run out. It ends with a summary table read
from the database and, for the import, the checkpoint it resumed from, how long the
recovery took and a count in SQL of its rows: each exactly once, or the demo fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q
from django.db.models.functions import Now

import durable_jobs as durable
from durable_jobs.management import preflight
from durable_jobs.models import Job
from testproject import database
from testproject.demo import processes
from testproject.demo.models import Effect, Report

ROOT = Path(__file__).resolve().parents[4]
BAR = 28
#: Rows per batch (one fenced write and checkpoint each) of the main import.
BATCH = 3
#: The workers' lease settings, unless the environment sets them: a killed worker's job
#: is taken over about LEASE_TTL + ORPHAN_GRACE (+ a reconciler pass) after the kill.
WORKER_LEASES = {
    "LEASE_TTL": "5",
    "HEARTBEAT_INTERVAL": "1",
    "ORPHAN_GRACE": "2",
    "RECONCILE_INTERVAL": "1",
}
FINISHED = ("completed", "failed", "cancelled")
#: The workers' settings module (never imported here: it is settings code), and the
#: environment variable through which it extends the settings the demo runs under.
WORKER_SETTINGS = "testproject.demo.worker_settings"
BASE_SETTINGS_ENV = "DURABLE_DEMO_BASE_SETTINGS"


def row_count(text: str) -> int:
    """``--rows``: enough for a checkpoint to resume from before the import ends."""
    try:
        rows = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if rows < 2 * BATCH:
        raise argparse.ArgumentTypeError(
            f"must be at least {2 * BATCH} (two batches of {BATCH}), so the worker can be "
            f"killed after a checkpoint and before the end, not {rows}"
        )
    return rows


@dataclasses.dataclass(slots=True)
class Crash:
    """What the demo saw of the main import when it killed the worker, and after."""

    rows: int  # the checkpoint committed before the kill (processed_count)
    total: int
    epoch: int  # the lease epoch at the kill: every later row was written under a higher one
    redrives: int
    held: bool  # the job held a lease at the kill (False: it was between two slices)
    lease_left: float | None  # seconds from the kill until that lease ran out
    children: int  # processes below the killed worker, killed with it
    at: float  # time.monotonic() of the kill
    redriven: float | None = None  # when the demo first saw the reconciler's re-drive
    resumed: float | None = None  # when the demo first saw a new lease (or the end)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Tally:
    """The import's Effect rows, counted in SQL."""

    total: int  # items the import was asked for: 0 .. total-1
    rows: int
    duplicated: int  # rows beyond the first for their item
    missing: int  # items in 0 .. total-1 without a row
    stray: int  # items outside 0 .. total-1
    before: int  # rows written under the lease the kill ended (or an earlier one)
    after: int
    resumed_from: int | None  # the first item written after the kill

    @property
    def problem(self) -> str | None:
        """The one-line reason the rows are wrong, or None when each item is there once."""
        if self.duplicated or self.missing or self.stray:
            return (
                f"the import's rows are wrong: {self.rows} rows for {self.total} items, "
                f"{self.duplicated} duplicated, {self.missing} missing, {self.stray} out of range"
            )
        return None


def tally(job_id, total: int, epoch: int) -> Tally:
    """Count ``job_id``'s Effect rows in one SQL statement (``epoch``: the lease killed)."""
    in_range = Q(item__gte=0, item__lt=total)
    counts = Effect.objects.filter(job_id=job_id).aggregate(
        rows=Count("id"),
        items=Count("item", distinct=True),
        in_range=Count("item", distinct=True, filter=in_range),
        before=Count("id", filter=Q(epoch__lte=epoch)),
        resumed_from=Min("item", filter=Q(epoch__gt=epoch)),
    )
    return Tally(
        total=total,
        rows=counts["rows"],
        duplicated=counts["rows"] - counts["items"],
        missing=total - counts["in_range"],
        stray=counts["items"] - counts["in_range"],
        before=counts["before"],
        after=counts["rows"] - counts["before"],
        resumed_from=counts["resumed_from"],
    )


def worker_environment() -> tuple[dict[str, str], dict[str, float]]:
    """The environment of the demo's workers, and the lease settings it gives them."""
    env = {
        **os.environ,
        "DURABLE_JOBS_SLICE_BUDGET": "1.0",
        "DJANGO_SETTINGS_MODULE": WORKER_SETTINGS,
        BASE_SETTINGS_ENV: settings.SETTINGS_MODULE,
    }
    leases = {}
    for name, default in WORKER_LEASES.items():
        raw = env.setdefault(f"DURABLE_JOBS_{name}", default)
        try:
            leases[name] = float(raw)
        except ValueError:
            raise CommandError(
                f"DURABLE_JOBS_{name} must be a number of seconds, not {raw!r}"
            ) from None
    return env, leases


def start_worker(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
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
        env=env,
        stdin=subprocess.DEVNULL,
    )


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


def describe(job: Job, dead_owners: frozenset[str] = frozenset()) -> str:
    if job.status == "running" and job.lease_owner in dead_owners:
        return "orphaned (its worker was killed)"
    if job.status == "running" and job.lease_owner is None and job.error_code:
        return f"retrying ({job.error_code})"
    if job.status == "failed":
        return f"failed: {job.error_code}"
    if job.cancel_requested_at and job.status in ("pending", "running"):
        return f"{job.status}, cancel requested"
    return job.status


class Command(BaseCommand):
    help = (
        "Run the durable_jobs demo: real jobs, a real worker killed mid-import and a new "
        "one resuming from the checkpoint, live progress, a summary."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--rows",
            type=row_count,
            default=60,
            help=f"rows in the main import (default 60, at least {2 * BATCH})",
        )
        parser.add_argument(
            "--timeout", type=float, default=120, help="give up after this many seconds"
        )

    def handle(self, *args, rows: int, timeout: float, **options) -> None:
        problem = preflight.unreachable()
        if problem is not None:
            raise CommandError(problem)
        env, self.leases = worker_environment()
        call_command("migrate", verbosity=0)
        self.stdout.write(self.style.MIGRATE_HEADING("durable_jobs demo"))
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            version = cursor.fetchone()[0].split()[0]
        self.stdout.write(f"database: {database.describe(connection.settings_dict, version)}\n")

        labels, main = self._start_jobs(rows)
        workers = [start_worker(env)]
        began = time.monotonic()
        try:
            crash, finished = self._watch(labels, main, began, timeout, workers, env)
        except processes.KillFailed as error:
            raise CommandError(str(error)) from None
        finally:
            for worker in workers:
                processes.stop(worker)
        self._summary(labels, time.monotonic() - began)
        problems = [None if finished else f"the jobs did not finish within {timeout:g}s"]
        problems += self._resume_summary(labels[main], main, crash)
        command = manage_py()
        self.stdout.write(f"Next: {command} durable_jobs stats   |   {command} durable_jobs list")
        found = [problem for problem in problems if problem]
        if found:
            raise CommandError(found[0])

    def _start_jobs(self, rows: int) -> tuple[dict, object]:
        with transaction.atomic():
            report = Report.objects.create(name="demo import")
            main = durable.start(
                "demo.import",
                subject=report,
                input={"rows": rows, "batch": BATCH, "delay": 0.15},
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
        labels = {
            main.id: "import (checkpoints, many slices)",
            flaky.id: "flaky (fails twice, then works)",
            doomed.id: "import (cancelled midway)",
            small.id: "small import",
        }
        return labels, main.id

    def _watch(
        self, labels: dict, main, began: float, timeout: float, workers: list, env: dict
    ) -> tuple[Crash | None, bool]:
        """Draw the board until every job has finished (True) or ``timeout`` (False);
        kill the worker once, midway through the main import, and start another."""
        tty = self.stdout.isatty()
        doomed = next(job_id for job_id, label in labels.items() if "cancelled" in label)
        cancelled = False
        crash: Crash | None = None
        dead_owners: frozenset[str] = frozenset()
        self._drawn = 0
        last_plain = 0.0
        while True:
            jobs = {job.id: job for job in Job.objects.filter(id__in=list(labels))}
            if not cancelled and jobs[doomed].processed_count >= 40:
                durable.cancel(doomed, by="demo operator")
                cancelled = True
            if crash is None and self._killable(jobs[main]):
                crash, dead_owners = self._kill_and_restart(main, labels, workers, env)
                continue
            if crash is not None and crash.resumed is None:
                self._follow_recovery(crash, jobs[main])
            lines = [
                f"{labels[job_id]:<36} {bar(jobs[job_id])} {describe(jobs[job_id], dead_owners)}"
                for job_id in labels
            ]
            if tty:
                if self._drawn:
                    self.stdout.write(f"\x1b[{self._drawn}F", ending="")
                for line in lines:
                    self.stdout.write("\x1b[2K" + line)
                self._drawn = len(lines)
            finished = all(job.status in FINISHED for job in jobs.values())
            if not tty and (finished or time.monotonic() - last_plain > 1.0):
                # Without a terminal, a board every second, and the final one exactly once.
                self.stdout.write(f"-- {time.monotonic() - began:5.1f}s")
                for line in lines:
                    self.stdout.write("   " + line)
                last_plain = time.monotonic()
            if finished or time.monotonic() - began > timeout:
                return crash, finished
            if workers[-1].poll() is not None:
                raise CommandError(
                    f"the worker exited on its own (code {workers[-1].returncode}); "
                    "its log is above"
                )
            # Quick looks until the kill: a short import leaves a narrow window for it.
            time.sleep(0.05 if crash is None else 0.2)

    @staticmethod
    def _killable(job: Job) -> bool:
        """A slice of the import is running and has committed a third of it, not all."""
        return (
            job.status == "running"
            and job.lease_owner is not None
            and job.total_count is not None
            and max(1, job.total_count // 3) <= job.processed_count < job.total_count
        )

    def _say(self, message: str) -> None:
        """One line of news above the board: on a terminal, the board is drawn again below."""
        if self._drawn:
            self.stdout.write(f"\x1b[{self._drawn}F\x1b[J", ending="")
            self._drawn = 0
        self.stdout.write(message)

    def _kill_and_restart(
        self, main, labels: dict, workers: list, env: dict
    ) -> tuple[Crash, frozenset[str]]:
        """SIGKILL the worker and everything below it; start a new worker."""
        children = processes.kill_tree(workers[-1])
        at = time.monotonic()
        job = self._settled(main)
        left = (
            Job.objects.filter(id=main)
            .annotate(
                left=ExpressionWrapper(F("lease_expires_at") - Now(), output_field=DurationField())
            )
            .values_list("left", flat=True)
            .get()
        )
        crash = Crash(
            rows=job.processed_count,
            total=job.total_count or 0,
            epoch=job.lease_epoch,
            redrives=job.redrives,
            held=job.lease_owner is not None,
            lease_left=left.total_seconds() if isinstance(left, timedelta) else None,
            children=children,
            at=at,
        )
        dead_owners = frozenset(
            owner
            for owner in Job.objects.filter(id__in=list(labels)).values_list(
                "lease_owner", flat=True
            )
            if owner
        )
        workers.append(start_worker(env))
        self._say(
            f"demo: killed the worker (SIGKILL) at row {crash.rows} of {crash.total}, "
            f"and the {children} processes under it; started a new worker, which takes the "
            "import over once the dead worker's lease has run out"
        )
        return crash, dead_owners

    @staticmethod
    def _settled(main) -> Job:
        """The import's row as the killed worker left it.

        A fenced write holds the job row locked until it commits or, its client gone,
        PostgreSQL rolls it back; a COMMIT already sent may still land after the kill.
        Reading the row FOR UPDATE waits for that, so the checkpoint read is final.
        """
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '10s'")
            return Job.objects.select_for_update().get(id=main)

    def _follow_recovery(self, crash: Crash, job: Job) -> None:
        now = time.monotonic()
        if crash.redriven is None and job.redrives > crash.redrives:
            crash.redriven = now
        if (job.lease_owner is not None and job.lease_epoch > crash.epoch) or (
            job.status in FINISHED
        ):
            crash.resumed = now
            self._say(
                f"demo: the new worker took the import over {now - crash.at:.1f}s after the "
                f"kill, at its checkpoint (row {job.processed_count} of {crash.total})"
            )

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

    def _resume_summary(self, label: str, main, crash: Crash | None) -> list[str | None]:
        """The import's crash and resume, from its rows; the reasons it is not right."""
        job = Job.objects.get(id=main)
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(f"Killed mid-import: {label}"))
        if crash is None:
            self.stdout.write("- the import ended before the demo could kill its worker")
            return ["the import ended before the demo could kill its worker (try more --rows)"]
        counted = tally(main, crash.total, crash.epoch)
        self.stdout.write(
            f"- killed the worker (SIGKILL) at row {crash.rows} of {crash.total}, "
            f"and the {crash.children} processes under it"
        )
        resumed = "-" if counted.resumed_from is None else str(counted.resumed_from)
        self.stdout.write(
            f"- resumed from checkpoint {resumed}: {counted.before} rows were committed "
            f"before the kill, {counted.after} written by the new worker"
        )
        self.stdout.write(f"- {self._recovery(crash)}")
        if counted.problem is None:
            self.stdout.write(
                f"- {counted.rows} rows for {counted.total} items, each exactly once "
                "(counted in SQL): no duplicates, none missing"
            )
        else:
            self.stdout.write(f"- {counted.problem}")
        return [
            None if job.status == "completed" else f"the import ended {job.status}, not completed",
            counted.problem,
        ]

    def _recovery(self, crash: Crash) -> str:
        """How the new worker came to hold the job, in words."""
        if crash.resumed is None:
            return "not recovered: the new worker never took the import over"
        took = f"recovered in {crash.resumed - crash.at:.1f}s"
        if not crash.held:
            return f"{took}: it was between two slices, holding no lease, so it was claimed at once"
        lease = self.leases["LEASE_TTL"]
        grace = self.leases["ORPHAN_GRACE"]
        ran_out = (
            "" if crash.lease_left is None else f" {max(0.0, crash.lease_left):.1f}s after the kill"
        )
        if crash.redriven is None:  # re-driven and claimed between two looks
            redrive = "the reconciler re-drove the job and the new worker claimed it"
        else:
            redrive = (
                f"the reconciler re-drove the job {crash.redriven - crash.at:.1f}s after the kill, "
                f"and the new worker claimed it {crash.resumed - crash.redriven:.1f}s later "
                "(the re-drive's retry backoff)"
            )
        return (
            f"{took}: the dead worker's lease ran out{ran_out} (LEASE_TTL {lease:g}s); "
            f"past the orphan grace (ORPHAN_GRACE {grace:g}s) {redrive}"
        )
