"""A preloaded process that the worker forks its handler processes from.

A handler process started from scratch imports Django and the project and runs
``django.setup()`` before it can take its first run: about 0.4 s of CPU here, once per
slot when a worker starts (64 slots: half a minute of CPU on a deploy) and again for
every child killed at a time limit or a cancel. The zygote pays that once: the worker
starts it with the first handler process it needs, it sets Django up, and from then on
each handler process is a ``fork()`` of it, ready in milliseconds with the project's
code already imported.

The worker's side is ``Zygote``: it hands the two pipe ends a child talks over (see
``durable_jobs.runtime.child``) to the zygote with ``SCM_RIGHTS``, and gets back a
``ForkedChild``, which stands in for a ``subprocess.Popen``: the child is the zygote's,
so the worker watches it through a pidfd and asks the zygote for its exit status.

The zygote is single-threaded (``fork()`` copies only the calling thread, so a lock
held by another thread would stay held for ever in the child), holds no database
connection (``django.setup()`` opens none), runs in a session of its own, and exits at
end of file on its socket: when the worker goes, so does it. If it cannot be started or
dies, ``ChildRunner`` starts handler processes the slow way, from scratch.

Measured (the mechanism trial, docs/performance.rst): with ``START_METHOD = "spawn"``,
1 ms slices drain at 0.74 (4 slots) and 0.59 (16 slots) of the zygote's rate, 20 ms at
0.71 and 500 ms at 0.85 at 16 slots, and the worker spends 2-5.5x the CPU per job
wherever it runs several handler processes.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

log = logging.getLogger("durable_jobs.worker")

#: How long the zygote may take to set Django up before the worker gives up on it.
BOOT_TIMEOUT = 120.0
#: How long one request (a fork, an exit status) may take to be answered.
REQUEST_TIMEOUT = 10.0
#: The exit status of a child whose status nobody could collect (the zygote went first).
UNKNOWN_EXIT = 255
_MESSAGE = 65536


class ZygoteFailed(Exception):
    """The zygote could not be started, or stopped answering.

    ``first`` is True the first time a given reason is raised, so the caller can warn
    once and not on every handler process it then starts from scratch.
    """

    def __init__(self, message: str, *, first: bool = True) -> None:
        super().__init__(message)
        self.first = first


class ForkedChild:
    """A handler process forked by the zygote, with the part of ``Popen`` the runner uses."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._zygote = zygote
        # The slot's thread and the main thread (ChildRunner.kill_process at a hard stop)
        # may both wait for the same child.
        self._lock = threading.Lock()
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # it died at once and the zygote has reaped it already
            self._pidfd = None
            self._collect()

    def poll(self) -> int | None:
        """None while the child runs; its exit status once it has ended."""
        if self.returncode is None and self._ended(0):
            self._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._ended(timeout):
                assert timeout is not None  # without a timeout, _ended waits for the end
                raise subprocess.TimeoutExpired(f"handler process {self.pid}", timeout)
            self._collect()
        assert self.returncode is not None  # _collect always sets it
        return self.returncode

    def _ended(self, timeout: float | None) -> bool:
        pidfd = self._pidfd
        if pidfd is None:
            return True
        try:
            return bool(select.select([pidfd], [], [], timeout)[0])
        except (OSError, ValueError):  # closed meanwhile by another thread's _collect
            return True

    def _collect(self) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            try:
                code = self._zygote.exit_status(self.pid)
            except ZygoteFailed:
                code = None
            self.returncode = UNKNOWN_EXIT if code is None else code
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None


class Zygote:
    """The worker's handle on its zygote; one per worker process, shared by its slots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one request at a time on the socket
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._unusable: str | None = None  # why it could not start: not tried again

    def fork(self, env: dict[str, str], fds: tuple[int, int]) -> ForkedChild:
        """A new handler process with ``env`` set and ``fds`` (its command and result pipe ends).

        Starts the zygote on first use, or again if it died. Raises ``ZygoteFailed``
        when it cannot; the caller then starts the child from scratch.
        """
        with self._lock:
            if self._unusable is not None:
                raise ZygoteFailed(self._unusable, first=False)
            if self._proc is None or self._proc.poll() is not None:
                # Not started yet, or died since (the OOM killer, say): start it (again).
                try:
                    self._start()
                except ZygoteFailed as error:
                    self._unusable = str(error)
                    raise
            answer = self._ask({"op": "fork", "env": env}, fds)
        return ForkedChild(self, int(answer["pid"]))

    def exit_status(self, pid: int) -> int | None:
        """The exit status of a child that has ended (``-N`` for signal N), collected once."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                return None
            return self._ask({"op": "reap", "pid": pid}).get("code")

    def close(self) -> None:
        """End the zygote (end of file on its socket); its children are not touched."""
        with self._lock:
            self._stop()

    def _start(self) -> None:
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            # A session of its own: a Ctrl-C at the worker's terminal is the worker's to
            # handle, and the zygote must outlive it long enough to be told.
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "durable_jobs.runtime.zygote", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except OSError as error:
            ours.close()
            raise ZygoteFailed(f"cannot start the zygote: {error}") from error
        finally:
            theirs.close()
        self._sock = ours
        try:
            self._receive(BOOT_TIMEOUT)  # "ready", or an error it refused to start for
        except ZygoteFailed:
            self._stop()
            raise
        log.debug("zygote %d ready", self._proc.pid)

    def _ask(self, message: dict[str, Any], fds: tuple[int, ...] = ()) -> dict[str, Any]:
        assert self._sock is not None, "asked before _start"  # set and cleared with _proc
        try:
            socket.send_fds(self._sock, [json.dumps(message).encode()], list(fds))
        except OSError as error:
            self._stop()
            raise ZygoteFailed(f"the zygote is gone: {error}") from error
        return self._receive(REQUEST_TIMEOUT)

    def _receive(self, timeout: float) -> dict[str, Any]:
        sock = self._sock
        assert sock is not None, "received before _start"  # set and cleared with _proc
        if not select.select([sock], [], [], timeout)[0]:
            self._stop()
            raise ZygoteFailed(f"the zygote did not answer within {timeout:.0f}s")
        data = sock.recv(_MESSAGE)
        if not data:
            self._stop()
            raise ZygoteFailed("the zygote is gone")
        answer = json.loads(data)
        if "error" in answer:
            raise ZygoteFailed(answer["error"])
        return answer

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


_shared: Zygote | None = None
_shared_lock = threading.Lock()


def shared() -> Zygote:
    """This process's zygote (created on first use; started on the first fork)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Zygote()
        return _shared


def close_shared() -> None:
    """End this process's zygote, if it has one (at worker exit)."""
    with _shared_lock:
        if _shared is not None:
            _shared.close()


# --- the zygote's side ---


def _serve(sock: socket.socket) -> None:
    ended: dict[int, int] = {}  # children reaped before anyone asked for their status
    while True:
        data, fds, _flags, _addr = socket.recv_fds(sock, _MESSAGE, 2)
        if not data:
            return  # end of file: the worker is gone
        message = json.loads(data)
        if message["op"] == "fork":
            try:
                pid = os.fork()
            except OSError as error:
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps({"error": f"fork failed: {error}"}).encode())
                continue
            if pid == 0:
                _become_child(sock, message["env"], fds)  # never returns
            for fd in fds:
                os.close(
                    fd
                )  # the child's now; a copy kept here would hide its death from the worker
            sock.send(json.dumps({"pid": pid}).encode())
        elif message["op"] == "reap":
            pid = int(message["pid"])
            code = ended.pop(pid, None)
            if code is None:
                try:
                    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                except ChildProcessError:
                    code = None
            sock.send(json.dumps({"code": code}).encode())
        # Children whose status is never asked for (their worker-side handle was dropped)
        # must not pile up as zombies.
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            ended[pid] = os.waitstatus_to_exitcode(status)


def _become_child(sock: socket.socket, env: dict[str, str], fds: list[int]) -> None:
    from durable_jobs.runtime import child

    code = 0
    try:
        sock.close()
        os.setsid()  # its own process group, which the worker kills as a whole
        # The signal handling of a freshly started interpreter, not the zygote's.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        os.environ.update(env)
        child.serve(fds[0], fds[1])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        logging.getLogger("durable_jobs.child").exception("handler process failed")
        code = 1
    finally:
        os._exit(code)


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[1]))
    # The worker ends it (end of file); signals meant for the worker's terminal are not ours.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from durable_jobs import faults
    from durable_jobs.runtime import child

    child.prepare()
    from django.db import connections

    # A project's ready() may have queried: a connection forked into every child would be
    # one socket shared by many processes, so none is kept.
    connections.close_all()
    faults.point("zygote_ready")
    others = [
        thread.name for thread in threading.enumerate() if thread is not threading.main_thread()
    ]
    if others:
        # fork() copies only this thread: the children would miss these, and any lock one
        # of them holds would stay held for ever.
        sock.send(
            json.dumps(
                {
                    "error": f"threads are running once Django is set up ({', '.join(others)}), "
                    "and a fork would leave them behind; set "
                    "DURABLE_JOBS['START_METHOD'] = 'spawn'"
                }
            ).encode()
        )
        return
    sock.send(json.dumps({"op": "ready", "pid": os.getpid()}).encode())
    _serve(sock)


if __name__ == "__main__":
    main(sys.argv)
