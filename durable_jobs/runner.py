"""Process execution, the worker's side: a slot's child process, and how a slice ends there.

A thread running a handler cannot be stopped from outside; a process can. So with
``EXECUTION = "process"`` (the default) each worker slot keeps one child process
(``durable_jobs.child``) that runs its handlers, and the slot thread supervises it:

* the child runs the handler and answers how it ended (a ``Ran``); the slot records it,
  so leases, heartbeats and every bookkeeping write stay in the worker;
* cancel, a lost lease and shutdown are passed on as messages, so ``should_yield()`` in
  the handler sees them; a handler that does not honour a cancel or a lost lease within
  ``CANCEL_GRACE``, or a shutdown within ``SHUTDOWN_GRACE``, is killed;
* at the kind's time limit the child is killed at once and the slice charged a
  ``time_limit`` failure;
* a child that dies on its own (a crash, the OOM killer, ``os._exit``) is an abrupt
  interruption, charged to the job's re-drive budget like a crashed worker.

Kills take the child's whole process group (it is started in a session of its own), so
a grandchild the handler spawned dies with it; a killed child's transaction, and so any
row lock it held, ends with its connection. The next slice gets a fresh child.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from durable_jobs import conf
from durable_jobs.child import encode_row
from durable_jobs.context import Slice
from durable_jobs.executor import ENDS, Ran, time_limit_failure

log = logging.getLogger("durable_jobs.worker")

#: How long a new child may take to set Django up before the slot gives up on it.
BOOT_TIMEOUT = 120.0
#: How often the slot looks at its child and the slice's flags while a slice runs.
POLL = 0.05


class ChildFailed(Exception):
    """The child process could not be started, or died before it said it was ready."""


class ChildRunner:
    """One slot's child process, started on first use and replaced after a kill or a death."""

    def __init__(self, *, role: str, stopping: threading.Event, using: str = DEFAULT_DB_ALIAS) -> None:
        self.role = role  # e.g. "durable-child-3", used in the child's application_name
        self.stopping = stopping
        self.using = using
        self._proc: subprocess.Popen | None = None
        self._commands = None
        self._results_fd: int | None = None
        self._buffer = b""

    # --- lifecycle ---
    def ensure_started(self) -> None:
        """Start the child if there is none alive, and wait until it is ready."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self.close()
        command_r, command_w = os.pipe()
        result_r, result_w = os.pipe()
        app = os.environ.get("PGAPPNAME", "durable_jobs")
        env = {
            **os.environ,
            "PGAPPNAME": f"{app}/{self.role}"[:63],
            # The worker may have been started with --pythonpath or from another folder.
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            # The handler's log lines at the worker's level (-v).
            "DURABLE_JOBS_CHILD_LOG_LEVEL": logging.getLevelName(logging.getLogger("durable_jobs").getEffectiveLevel()),
        }
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "durable_jobs.child", str(command_r), str(result_w)],
                pass_fds=(command_r, result_w), start_new_session=True, stdin=subprocess.DEVNULL, env=env,
            )
        finally:
            os.close(command_r)
            os.close(result_w)
        self._commands = os.fdopen(command_w, "w", buffering=1)
        self._results_fd = result_r
        self._buffer = b""
        # The database exactly as this worker reaches it (a test run renames it, a
        # project may route the worker to another alias): the child must not guess.
        database = connections[self.using].settings_dict
        self._send({"op": "database", "alias": self.using,
                    "settings": {key: database.get(key) for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT")}})
        ready = self._receive(timeout=BOOT_TIMEOUT)
        if ready is None or ready.get("op") != "ready":
            code = self._proc.poll()
            self.kill()
            raise ChildFailed(f"the handler process did not start (exit code {code}); see the worker's stderr")
        log.debug("%s: child process %d ready", self.role, self._proc.pid)

    def kill(self) -> None:
        """Kill the child's whole process group and reap it."""
        proc = self._proc
        if proc is None:
            return
        try:
            # The group even when the child itself is gone: a grandchild may live on.
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not refused
            log.error("%s: child %d did not die after SIGKILL", self.role, proc.pid)
        self._close_pipes()
        self._proc = None

    def close(self) -> None:
        """Let an idle child leave (end of file on its commands), killing it if it lingers."""
        proc = self._proc
        if proc is None:
            return
        self._close_pipes()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # --- one slice ---
    def run(self, context: Slice, *, on_slow: Callable[[], None] | None = None, slow_after: float = 0.0) -> Ran:
        """Run ``context``'s slice in the child; return how it ended. Never raises for the handler.

        ``on_slow`` is called once, on this thread, when the slice has run ``slow_after``
        seconds (the slot hands back the claims waiting behind it).
        """
        try:
            self.ensure_started()
        except (ChildFailed, OSError) as error:
            return Ran(end="interrupted", message=f"interrupted: {error}")
        lease = context.lease
        job_id = str(context.id)
        if not self._send({"op": "run", "job_id": job_id, "owner": lease.owner, "epoch": lease.epoch,
                           "ttl_ms": lease.ttl_ms, "row": encode_row(context.job)}):
            return self._died()
        settings = conf.get()
        began = time.monotonic()
        told: set[str] = set()
        stop_seen: float | None = None
        lost_seen: float | None = None
        while True:
            answer = self._receive(timeout=POLL)
            if answer is not None:
                return _ran_of(answer)
            if self._proc is None or self._proc.poll() is not None or self._results_fd is None:
                return self._died()  # dead, or it closed its answers: it cannot answer this slice
            now = time.monotonic()
            if on_slow is not None and now - began > slow_after:
                on_slow()
                on_slow = None
            if context.past_time_limit(now):
                self.kill()
                return Ran(end="time_limit", message=time_limit_failure(context).message)
            if context.cancel_observed:
                if "cancel" not in told:
                    told.add("cancel")
                    self._send({"op": "cancel", "job_id": job_id, "epoch": lease.epoch})
                elif now - (context.cancel_seen_at or now) > settings.CANCEL_GRACE:
                    log.warning("[%s %s] handler ignored the cancel request for %.0fs: killed", context.kind,
                                context.id, settings.CANCEL_GRACE)
                    self.kill()
                    return Ran(end="cancel")
            if context.lease_lost:
                if "lease_lost" not in told:
                    told.add("lease_lost")
                    lost_seen = now
                    self._send({"op": "lease_lost", "job_id": job_id, "epoch": lease.epoch})
                elif now - lost_seen > settings.CANCEL_GRACE:
                    self.kill()
                    return Ran(end="lease_lost")
            if self.stopping.is_set():
                if "stop" not in told:
                    told.add("stop")
                    stop_seen = now
                    self._send({"op": "stop"})
                elif now - stop_seen > settings.SHUTDOWN_GRACE:
                    log.warning("[%s %s] handler did not yield within the shutdown grace: killed", context.kind,
                                context.id)
                    self.kill()
                    return Ran(end="yield", interrupted=True)

    def _died(self) -> Ran:
        code = None
        if self._proc is not None:
            try:
                code = self._proc.wait(timeout=2)  # its answers closed first: let the exit land
            except subprocess.TimeoutExpired:
                pass  # alive but deaf (it closed its answer pipe): killed below all the same
        self.kill()
        how = "no exit status" if code is None else f"signal {-code}" if code < 0 else f"exit code {code}"
        return Ran(end="interrupted", message=f"interrupted: the process running the handler died ({how})")

    # --- the pipes ---
    def _send(self, message: dict[str, Any]) -> bool:
        try:
            self._commands.write(json.dumps(message, separators=(",", ":")) + "\n")
            self._commands.flush()
            return True
        except (BrokenPipeError, ValueError, OSError, AttributeError):
            return False

    def _receive(self, *, timeout: float) -> dict[str, Any] | None:
        """One answer from the child, or None when none arrives within ``timeout``."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            if self._results_fd is None:
                return None
            remaining = deadline - time.monotonic()
            if remaining < 0:
                return None
            readable, _, _ = select.select([self._results_fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(self._results_fd, 1 << 16)
            if not chunk:  # the child closed its end: it is dying or dead
                os.close(self._results_fd)
                self._results_fd = None
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _close_pipes(self) -> None:
        if self._commands is not None:
            try:
                self._commands.close()
            except OSError:
                pass
            self._commands = None
        if self._results_fd is not None:
            os.close(self._results_fd)
            self._results_fd = None


def _ran_of(answer: dict[str, Any]) -> Ran:
    fields = {key: answer.get(key) for key in ("end", "result_json", "error_class", "code", "message")}
    if fields["end"] not in ENDS:
        return Ran(end="failed", error_class="transient", code="child_error",
                   message=f"the handler process answered {str(fields['end'])[:100]!r}")
    return Ran(interrupted=bool(answer.get("interrupted")), **fields)
