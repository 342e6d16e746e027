"""Run real worker and reconciler processes against the test database.

Each process gets the test database's URL, ``testproject.settings_test`` (short leases)
and ``PGAPPNAME`` set to a name of the test's choosing, so a test can find exactly
that process's connections in ``pg_stat_activity`` and cut them.

Output goes to a log file in one directory per test run, deleted when the run exits;
``stop()`` keeps the text in memory so a failed test can still print it. Set
``DURABLE_JOBS_KEEP_LOGS=1`` to keep the directory (its path is printed at exit).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
_log_dir: Path | None = None


def log_dir() -> Path:
    """This run's directory of process logs, created on first use and removed at exit."""
    global _log_dir
    if _log_dir is None:
        _log_dir = Path(tempfile.mkdtemp(prefix="durable_jobs-logs-"))
        atexit.register(_remove_log_dir, _log_dir)
    return _log_dir


def _remove_log_dir(path: Path) -> None:
    if os.environ.get("DURABLE_JOBS_KEEP_LOGS"):
        print(f"process logs kept in {path}", file=sys.stderr)
        return
    shutil.rmtree(path, ignore_errors=True)


class Process:
    def __init__(
        self, args: list[str], *, db_url: str, app_name: str, env: dict[str, str] | None = None
    ) -> None:
        self.app_name = app_name
        descriptor, name = tempfile.mkstemp(prefix=f"{app_name}-", suffix=".log", dir=log_dir())
        self.log_path = Path(name)
        self._text: str | None = None  # the output, once stop() has deleted the file
        full_env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "DJANGO_SETTINGS_MODULE": "testproject.settings_test",
            "PGAPPNAME": app_name,
            "DURABLE_JOBS_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self._log = os.fdopen(descriptor, "w")  # closed by stop()
        self.popen = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, signum: int) -> None:
        """Signal the worker; SIGSTOP and SIGCONT reach its handler processes too.

        A stall that freezes a worker (a VM pause, swap, a debugger) freezes the children
        running its handlers with it; stopping the parent alone would leave them writing
        under a lease nobody renews, which is a different (and also fenced) scenario.
        """
        if signum in (signal.SIGSTOP, signal.SIGCONT):
            for pid in descendants(self.pid):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
        self.popen.send_signal(signum)

    def children(self) -> list[int]:
        """The worker's handler processes (process execution), by pid."""
        return descendants(self.pid)

    def wait(self, timeout: float = 30) -> int:
        return self.popen.wait(timeout=timeout)

    def output(self) -> str:
        if self._text is not None:
            return self._text
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> None:
        """End the process if it is still running (SIGCONT first, in case it was stopped).

        The log file is read into memory and deleted: ``output()`` still answers.
        """
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.kill()
            self.popen.wait(timeout=10)
        if self._text is None:
            self._text = self.output()
            self._log.close()
            if not os.environ.get("DURABLE_JOBS_KEEP_LOGS"):
                self.log_path.unlink(missing_ok=True)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (read from /proc), nearest first."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the ppid follows the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, frontier = [], [pid]
    while frontier:
        children = [child for parent in frontier for child in parents.get(parent, [])]
        found.extend(children)
        frontier = children
    return found


def worker(
    db_url: str,
    *args: str,
    app_name: str = "durable-test-worker",
    env: dict[str, str] | None = None,
) -> Process:
    return Process(["durable_worker", "-v", "1", *args], db_url=db_url, app_name=app_name, env=env)


def wait_until(
    predicate, *, timeout: float = 30, interval: float = 0.1, message: str = "condition"
):
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def backends_of(app_name: str) -> list[int]:
    """Backends of a process (``app_name``) or of one of its threads (``app_name/role``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE application_name = %s OR application_name LIKE %s",
            [app_name, app_name + "/%"],
        )
        return [row[0] for row in cursor.fetchall()]


def terminate_backends(app_name: str, *, query_like: str | None = None, like: bool = False) -> int:
    """``pg_terminate_backend`` every connection of ``app_name`` and of its threads
    (``app_name/role``).

    ``like=True`` reads ``app_name`` as a LIKE pattern instead.
    """
    if like:
        sql = (
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name LIKE %s"
        )
        params: list = [app_name]
    else:
        sql = (
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE (application_name = %s OR application_name LIKE %s)"
        )
        params = [app_name, app_name + "/%"]
    if query_like:
        sql += " AND query LIKE %s"
        params.append(query_like)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]
