"""Process execution, the worker's side: a slot's child process, and how a slice ends there.

A thread running a handler cannot be stopped from outside; a process can. So with
``EXECUTION = "process"`` (the default) each worker slot keeps one child process
(``durable_jobs.runtime.child``) that runs its handlers, and the slot thread supervises it:

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

import collections
import dataclasses
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from django.db import DEFAULT_DB_ALIAS, connections

from durable_jobs import conf, faults
from durable_jobs.runtime import zygote
from durable_jobs.runtime.child_runs import ID_POSITION, encode_row
from durable_jobs.runtime.control import SliceControl
from durable_jobs.runtime.invoke import Ran, time_limit_failure
from durable_jobs.states import Lease, SliceEnd

log = logging.getLogger("durable_jobs.worker")

#: One compact encoder for every message: ``json.dumps`` with ``separators`` builds a new
#: encoder per call.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode

#: How long a new child may take to set Django up before the slot gives up on it.
BOOT_TIMEOUT = 120.0
#: How often the slot looks at its child and the slice's flags while a slice runs.
POLL = 0.05
#: How long the slot waits for the child to say which queued runs it took back. Its
#: mailbox thread answers at once, whatever the handler is doing.
WITHDRAW_TIMEOUT = 5.0


class ChildFailed(Exception):
    """The child process could not be started, or died before it said it was ready."""


class ChildRunner:
    """One slot's child process, started on first use and replaced after a kill or a death."""

    def __init__(
        self, *, role: str, stopping: threading.Event, using: str = DEFAULT_DB_ALIAS
    ) -> None:
        self.role = role  # e.g. "durable-child-3", used in the child's application_name
        self.stopping = stopping
        self.using = using
        self._proc: subprocess.Popen | zygote.ForkedChild | None = None
        self._commands: TextIO | None = None
        self._results_fd: int | None = None
        self._buffer = b""
        self._inflight = _InFlight()  # sent, not yet collected
        self._seq = 0
        self._withdrawals = 0  # withdraw (or stop) messages not answered yet
        # Runs up to this sequence number were forgotten by a kill: an answer the child
        # wrote for one of them before it died may still be read, and is dropped.
        self._forgotten_through = 0
        self._ready: dict[str, Any] | None = None

    # --- lifecycle ---
    def ensure_started(self) -> None:
        """Start the child if there is none alive, and wait until it is ready."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self.close()
        command_r, command_w = os.pipe()
        result_r, result_w = os.pipe()
        app = os.environ.get("PGAPPNAME", "durable_jobs")
        own_env = {
            "PGAPPNAME": f"{app}/{self.role}"[:63],
            # The handler's log lines at the worker's level (-v).
            "DURABLE_JOBS_CHILD_LOG_LEVEL": logging.getLevelName(
                logging.getLogger("durable_jobs").getEffectiveLevel()
            ),
        }
        try:
            self._proc = self._start_child(own_env, command_r, result_w)
        finally:
            os.close(command_r)
            os.close(result_w)
        self._commands = os.fdopen(command_w, "w", buffering=1)
        self._results_fd = result_r
        self._buffer = b""
        self._inflight.clear()
        self._withdrawals = 0
        self._ready = None
        # The database exactly as this worker reaches it (a test run renames it, a
        # project may route the worker to another alias): the child must not guess.
        database = connections[self.using].settings_dict
        self._send(
            {
                "op": "database",
                "alias": self.using,
                "settings": {
                    key: database.get(key) for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT")
                },
            }
        )
        ready = self._receive(timeout=BOOT_TIMEOUT)
        if ready is None or ready.get("op") != "ready":
            code = self._proc.poll()
            self.kill()
            raise ChildFailed(
                f"the handler process did not start (exit code {code}); see the worker's stderr"
            )
        log.debug("%s: child process %d ready", self.role, self._proc.pid)

    def _start_child(
        self, own_env: dict[str, str], command_r: int, result_w: int
    ) -> subprocess.Popen[bytes] | zygote.ForkedChild:
        """Fork the child from the zygote; start it from scratch if there is none to be had."""
        if conf.get().START_METHOD == "forkserver":
            try:
                return zygote.shared().fork(own_env, (command_r, result_w))
            except zygote.ZygoteFailed as error:
                log.log(
                    logging.WARNING if error.first else logging.DEBUG,
                    "%s: starting handler processes from scratch: %s",
                    self.role,
                    error,
                )
        env = {
            **os.environ,
            # The worker may have been started with --pythonpath or from another folder.
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            **own_env,
        }
        return subprocess.Popen(
            [sys.executable, "-m", "durable_jobs.runtime.child", str(command_r), str(result_w)],
            pass_fds=(command_r, result_w),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            env=env,
        )

    def kill(self) -> None:
        """Kill the child's whole process group, reap it and close the pipes (slot thread only)."""
        if self._proc is None:
            return
        self.kill_process()
        self._close_pipes()
        self._proc = None

    def kill_process(self) -> None:
        """Kill the child's whole process group and reap it, and forget what it had queued.

        This is the part of ``kill`` another thread may call (the worker's main thread at
        a hard stop). The pipes and the handle stay as they are: the slot's thread may be
        reading them at this moment. It reads what the child had written, then the end of
        file, records the death as usual and closes them itself. Closing a descriptor
        under another thread's read would make that read fail, or worse, read whatever
        file was opened next under its number.
        """
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
        self._forget_queue()
        self._withdrawals = 0

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

    # --- runs queued in the child ---
    def holds(self, job_id: Any) -> bool:
        """True while a run of ``job_id`` was sent to the child and neither answered nor withdrawn."""
        return self._inflight.holds(job_id)

    def holds_any(self) -> bool:
        return bool(self._inflight)

    def forget(self) -> None:
        """Drop every run this runner still tracks (after ``kill``: none of them runs any more)."""
        self._inflight.clear()

    def send_ahead(self, claims: list[tuple[Any, Lease]]) -> bool:
        """Queue the runs of ``claims`` (job, lease) in the child, in order, in one write.

        The child starts each as soon as the one before it ends, so a batch of quick
        slices costs it one wake-up instead of one per slice. Each is still supervised on
        its own by ``run`` (its time limit counts from the moment it started), and what it
        has not started can be taken back (``take_back``). False when the child could not
        take them (nothing is queued then).
        """
        try:
            self.ensure_started()
        except (ChildFailed, OSError):
            return False
        return self._queue(claims)

    def take_back(self, *, timeout: float = WITHDRAW_TIMEOUT) -> None:
        """Withdraw every queued run the child has not started, and wait for its answer.

        Afterwards ``holds`` is true only of the run the child had already started (at
        most one: it runs them in order), which ``run`` supervises and records as usual.
        A child that does not answer within ``timeout`` keeps its queue: those runs still
        run, one after the other, each exactly once.
        """
        if len(self._inflight) == 0:
            return
        if not self._send({"op": "withdraw"}):
            self._forget_queue()
            return
        self._withdrawals += 1
        deadline = time.monotonic() + timeout
        while self._withdrawals and time.monotonic() < deadline:
            if not self._pump(timeout=POLL) and (
                self._proc is None or self._proc.poll() is not None or self._results_fd is None
            ):
                self._died()  # the run it had started is charged by ``run``; the rest never began
                return

    def _queue(self, claims: list[tuple[Any, Lease]]) -> bool:
        lines = []
        now = time.monotonic()
        for job, lease in claims:
            self._seq += 1
            # The first run of an idle child starts now; a queued one when the one before it ends.
            self._inflight.append(
                _Sent(
                    seq=self._seq,
                    job_id=job.id,
                    epoch=lease.epoch,
                    started_at=None if self._inflight else now,
                )
            )
            row = encode_row(job)
            lines.append(
                _ENCODE(
                    {
                        "op": "run",
                        "seq": self._seq,
                        "job_id": row[ID_POSITION],  # made text once, by encode_row
                        "owner": lease.owner,
                        "epoch": lease.epoch,
                        "ttl_ms": lease.ttl_ms,
                        "row": row,
                    }
                )
            )
        if self._write("\n".join(lines) + "\n"):
            return True
        self._forget_queue()
        return False

    def _forget_queue(self) -> None:
        """The child is gone: what it answered stands, the run it had started is charged
        by ``run`` (as a death), and what still waited behind that never started."""
        # From a copy: ``kill_process`` runs this on another thread than the slot's, which
        # may take an answered run off the queue meanwhile.
        started = next((sent for sent in self._inflight.snapshot() if sent.answer is None), None)
        if started is not None:
            started.dead = True
        self._inflight.keep(lambda sent: sent.answer is not None or sent is started)
        self._forgotten_through = self._seq

    # --- one slice ---
    def run(
        self,
        control: SliceControl,
        *,
        on_slow: Callable[[], None] | None = None,
        slow_after: float = 0.0,
    ) -> Ran:
        """Run ``control``'s slice in the child; return how it ended. Never raises for the handler.

        The slice may already be queued there (``send_ahead``); otherwise it is sent now.
        ``on_slow`` is called once, on this thread, when the slice has run ``slow_after``
        seconds (the slot hands back the claims waiting behind it).
        """
        key = control.id
        if not self.holds(key):
            if (
                self._inflight
            ):  # runs are answered in order: an older one still open is a bug of ours
                raise RuntimeError(
                    f"{self.role}: a run was sent ahead of {key} and never collected"
                )
            try:
                self.ensure_started()
            except (ChildFailed, OSError) as error:
                return Ran(end=SliceEnd.INTERRUPTED, message=f"interrupted: {error}")
            if not self._queue([(control.row, control.lease)]):
                self._inflight.clear()
                return self._died()
        sent = self._inflight.first()
        if sent.job_id != key:
            raise RuntimeError(f"{self.role}: {key} is queued behind a run not collected")
        try:
            return self._supervise(control, sent, on_slow, slow_after)
        finally:
            if self._inflight and self._inflight.first() is sent:
                self._inflight.popleft()

    def _supervise(
        self,
        control: SliceControl,
        sent: _Sent,
        on_slow: Callable[[], None] | None,
        slow_after: float,
    ) -> Ran:
        if sent.dead:
            return self._died()
        job_id, lease = sent.job_id, control.lease
        settings = conf.get()
        began = time.monotonic()
        told: set[str] = set()
        stop_seen: float | None = None
        lost_seen: float | None = None
        while True:
            if sent.answer is not None:
                return Ran.from_dict(sent.answer)
            if not self._inflight.holds_run(sent):
                # The child withdrew it before starting it: a withdrawal it answered late
                # (after ``take_back`` gave up waiting), or one that reached it between the
                # end of the run before and the start of this one. Never started, it is
                # handed back uncharged, as every withdrawn claim is; waiting for its
                # answer would wait forever.
                return Ran(
                    end=SliceEnd.WITHDRAWN,
                    message="taken back from the handler process before it started",
                )
            if sent.started_at is not None:
                # The time limit counts from when the child started it (it may have waited
                # in the queue, or run while this thread recorded the slice before it).
                control.time_limit_at = min(
                    control.time_limit_at, sent.started_at + control.handler.time_limit_seconds()
                )
            if self._pump(timeout=POLL) and sent.answer is not None:
                continue
            if self._proc is None or self._proc.poll() is not None or self._results_fd is None:
                return self._died()  # dead, or it closed its answers: it cannot answer this slice
            now = time.monotonic()
            if on_slow is not None and now - began > slow_after:
                on_slow()
                on_slow = None
                continue  # taking the queue back may have read this slice's answer
            if control.past_time_limit(now):
                self.kill()
                return Ran(end=SliceEnd.TIME_LIMIT, message=time_limit_failure(control).message)
            if control.cancel_observed:
                if "cancel" not in told:
                    told.add("cancel")
                    self._send({"op": "cancel", "job_id": str(job_id), "epoch": lease.epoch})
                elif now - (control.cancel_seen_at or now) > settings.CANCEL_GRACE:
                    log.warning(
                        "[%s %s] handler ignored the cancel request for %.0fs: killed",
                        control.kind,
                        control.id,
                        settings.CANCEL_GRACE,
                    )
                    self.kill()
                    return Ran(end=SliceEnd.CANCEL)
            if control.lease_lost:
                if "lease_lost" not in told:
                    told.add("lease_lost")
                    lost_seen = now
                    self._send({"op": "lease_lost", "job_id": str(job_id), "epoch": lease.epoch})
                elif lost_seen is not None and now - lost_seen > settings.CANCEL_GRACE:
                    self.kill()
                    return Ran(end=SliceEnd.LEASE_LOST)
            if self.stopping.is_set():
                if "stop" not in told:
                    told.add("stop")
                    stop_seen = now
                    self._send({"op": "stop"})  # the child also withdraws what it has queued
                    self._withdrawals += 1
                elif stop_seen is not None and now - stop_seen > settings.SHUTDOWN_GRACE:
                    log.warning(
                        "[%s %s] handler did not yield within the shutdown grace: killed",
                        control.kind,
                        control.id,
                    )
                    self.kill()
                    return Ran(end=SliceEnd.YIELD, interrupted=True)

    def _died(self) -> Ran:
        code = None
        if self._proc is not None:
            try:
                code = self._proc.wait(timeout=2)  # its answers closed first: let the exit land
            except subprocess.TimeoutExpired:
                pass  # alive but deaf (it closed its answer pipe): killed below all the same
        self.kill()
        how = (
            "no exit status"
            if code is None
            else f"signal {-code}"
            if code < 0
            else f"exit code {code}"
        )
        return Ran(
            end=SliceEnd.INTERRUPTED,
            message=f"interrupted: the process running the handler died ({how})",
        )

    # --- the pipes ---
    def _send(self, message: dict[str, Any]) -> bool:
        return self._write(_ENCODE(message) + "\n")

    def _write(self, text: str) -> bool:
        commands = self._commands
        if commands is None:  # ``kill`` or ``close`` closed the pipes: the child is gone
            return False
        try:
            commands.write(text)
            commands.flush()
            return True
        except (BrokenPipeError, ValueError, OSError):  # the child died: its end is closed
            return False

    def _pump(self, *, timeout: float) -> bool:
        """Read what the child has answered (waiting up to ``timeout``) and file it; False if nothing came."""
        results = self._results_fd
        if results is None:
            return False
        if b"\n" not in self._buffer:
            readable, _, _ = select.select([results], [], [], timeout)
            if not readable:
                return False
            faults.point("answers_readable")
            chunk = os.read(results, 1 << 16)
            if not chunk:  # the child closed its end: it is dying or dead
                os.close(results)
                self._results_fd = None
                return False
            self._buffer += chunk
        lines = self._buffer.split(b"\n")
        self._buffer = lines.pop()
        for line in lines:
            self._file(json.loads(line))
        return True

    def _file(self, answer: dict[str, Any]) -> None:
        op = answer.get("op")
        if op == "ran":
            waiting = (sent for sent in self._inflight if sent.answer is None)
            sent = next(waiting, None)
            if sent is None or sent.seq != answer.get("seq"):
                if (answer.get("seq") or 0) <= self._forgotten_through:
                    return  # a run a kill forgot, answered before the child died: nobody waits
                raise ChildFailed(f"{self.role}: answer for run {answer.get('seq')} out of order")
            sent.answer = answer
            following = next(waiting, None)
            if following is not None:  # the next queued run started as this one ended
                following.started_at = float(answer.get("at") or time.monotonic())
        elif op == "withdrawn":
            withdrawn = set(answer.get("seqs") or ())
            self._inflight.keep(lambda sent: sent.seq not in withdrawn or sent.answer is not None)
            self._withdrawals = max(0, self._withdrawals - 1)
        elif op == "ready":
            self._ready = answer

    def _receive(self, *, timeout: float) -> dict[str, Any] | None:
        """The child's ``ready``, or None when it does not say it within ``timeout``."""
        deadline = time.monotonic() + timeout
        while self._ready is None:
            remaining = deadline - time.monotonic()
            if remaining < 0 or (
                not self._pump(timeout=min(remaining, 1.0)) and self._results_fd is None
            ):
                return None
        ready, self._ready = self._ready, None
        return ready

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


@dataclasses.dataclass(eq=False, slots=True, kw_only=True)
class _Sent:
    """A run sent to the child and not yet answered or withdrawn."""

    seq: int
    job_id: Any  # the job's id as the slot holds it (a UUID: hashed, never formatted, per lookup)
    epoch: int
    started_at: float | None  # monotonic; None while it waits behind another run
    answer: dict[str, Any] | None = None  # how it ended, once the child said so
    dead: bool = False  # the child died with it started: ``run`` charges it


class _InFlight:
    """The runs sent to the child and not collected yet, in the order sent, with their job
    ids counted: ``holds`` is asked several times per slice, and walking a batch of 64
    queued runs each time cost about 3 % of a slot's time on no-op jobs (issue #27)."""

    __slots__ = ("_ids", "_runs")

    def __init__(self) -> None:
        self._runs: collections.deque[_Sent] = collections.deque()
        self._ids: collections.Counter[Any] = collections.Counter()

    def __iter__(self) -> Iterator[_Sent]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)

    def snapshot(self) -> list[_Sent]:
        """The runs as a list, copied in one step (list() of a deque runs no Python code,
        so no other thread changes it halfway; iterating ``self`` is not that safe)."""
        return list(self._runs)

    def first(self) -> _Sent:
        return self._runs[0]

    def holds(self, job_id: Any) -> bool:
        return job_id in self._ids

    def holds_run(self, sent: _Sent) -> bool:
        return sent.job_id in self._ids and any(other is sent for other in self._runs)

    def append(self, sent: _Sent) -> None:
        self._runs.append(sent)
        self._ids[sent.job_id] += 1

    def popleft(self) -> _Sent:
        sent = self._runs.popleft()
        self._drop(sent.job_id)
        return sent

    def clear(self) -> None:
        self._runs.clear()
        self._ids.clear()

    def keep(self, wanted: Callable[[_Sent], bool]) -> None:
        """Keep only the runs ``wanted`` says yes to, in their order."""
        # From a copy: the kill of another thread may run this while the slot's own
        # thread takes a run off the deque (iterating it then would raise).
        kept = [sent for sent in self.snapshot() if wanted(sent)]
        self._runs = collections.deque(kept)
        self._ids = collections.Counter(sent.job_id for sent in kept)

    def _drop(self, job_id: Any) -> None:
        left = self._ids[job_id] - 1
        if left > 0:
            self._ids[job_id] = left
        else:
            del self._ids[job_id]
