"""The child process of process execution: runs handlers, one slice at a time, for one slot.

Forked by the worker's zygote (``durable_jobs.runtime.zygote``) with Django already set up, or
started by ``durable_jobs.runtime.runner.ChildRunner`` as ``python -m durable_jobs.runtime.child CMD_FD
RESULT_FD`` when there is no zygote; either way in a session (process group) of its own,
with the worker's settings module in its environment. It reads one JSON line per message
from CMD_FD and writes one per answer to RESULT_FD; the handler's own stdout and stderr
stay the worker's.

Messages in: ``run`` (a claimed row, the lease it was claimed under and a sequence
number; several may queue up, and run one after the other in the order sent), about a
slice, ``cancel`` and ``lease_lost``, and ``withdraw`` (take back every queued run not
started yet) and ``stop`` (the worker is shutting down: withdraw too). Answers out:
``ready`` once Django is set up, one ``ran`` per started run (with the moment it ended,
which is when the next queued run started), and ``withdrawn`` naming the runs taken back.

The child holds no lease of its own: the worker keeps the lease alive, records the
outcome, and kills this process group at the time limit, on a cancel or a shutdown past
its grace. What the child writes goes through ``fenced()`` on its own connection, under
the same owner and epoch fence as any holder's write, so a child that outlives its lease
lands nothing. When the worker dies the command pipe reaches end of file and the child
exits at once: it never runs on unsupervised.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from durable_jobs.states import SliceEnd

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from durable_jobs.runtime.control import SliceControl

log = logging.getLogger("durable_jobs.child")

#: One compact encoder for every answer: ``json.dumps`` with ``separators`` builds a new
#: encoder per call, a third of what encoding a ``ran`` answer costs.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


class Mailbox:
    """Messages from the worker, read on a thread of their own while a handler runs.

    ``run`` requests queue up in order (the worker may send the next claims of its batch
    while a slice runs, so the child goes from one to the next without waiting for the
    worker); slice flags (``cancel``, ``lease_lost``) are applied as they arrive.
    ``withdraw``, and ``stop``, take back every run not started yet and answer which
    (``withdrawn``): a run is either started or withdrawn, decided under one lock, so
    the worker never hands back a claim this process is running, nor runs one twice.
    """

    def __init__(self, stream: Iterable[str], results_fd: int) -> None:
        self.runs: collections.deque[dict[str, Any]] = collections.deque()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        # (delivery, SliceControl) of the slice running now
        self._current: tuple[tuple[str, int], SliceControl] | None = None
        self._early: dict[tuple[str, int], set[str]] = {}  # flags for a slice not started yet
        self._stream = stream
        self._results_fd = results_fd

    def read_forever(self) -> None:
        for line in self._stream:
            message = json.loads(line)
            op = message["op"]
            if op == "run":
                with self._lock:
                    self.runs.append(message)
                    self._arrived.notify()
            elif op == "withdraw":
                self._withdraw()
            elif op == "stop":
                self.stopping.set()
                self._withdraw()  # shutting down: nothing queued starts any more
            else:
                self._flag((message["job_id"], message["epoch"]), op)
        # End of file: the worker is gone (or asked us to leave). Nobody supervises the
        # handler any more, so neither it nor anything it started may run on: this
        # process leads its own process group.
        os.killpg(0, signal.SIGKILL)

    def take(self) -> dict[str, Any]:
        """The next run, in the order sent; blocks while there is none."""
        with self._lock:
            while not self.runs:
                self._arrived.wait()
            return self.runs.popleft()

    def answer(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self._write(payload)

    def _withdraw(self) -> None:
        with self._lock:
            taken = list(self.runs)
            self.runs.clear()
            for message in taken:
                self._early.pop((message["job_id"], message["epoch"]), None)
            self._write({"op": "withdrawn", "seqs": [message["seq"] for message in taken]})

    def _write(self, payload: dict[str, Any]) -> None:
        # Under the lock: answers from both threads stay whole and in the order decided.
        data = (_ENCODE(payload) + "\n").encode()
        while data:
            data = data[os.write(self._results_fd, data) :]

    def _flag(self, delivery: tuple[str, int], op: str) -> None:
        # Keyed by job and epoch: a flag that arrives after its slice ended must not
        # reach the next slice of the same job.
        with self._lock:
            current = self._current
            if current is not None and current[0] == delivery:
                _apply(current[1], op)
            else:
                self._early.setdefault(delivery, set()).add(op)

    def begin(self, delivery: tuple[str, int], control: SliceControl) -> None:
        with self._lock:
            self._current = (delivery, control)
            for op in self._early.pop(delivery, ()):
                _apply(control, op)

    def end(self) -> None:
        with self._lock:
            self._current = None


def _apply(control: SliceControl, op: str) -> None:
    if op == "cancel":
        control.observe_cancel()
    elif op == "lease_lost":
        control.mark_lease_lost()


#: How soon the server ends a killed child's query (and frees its row locks).
CLIENT_CHECK_MS = 1000


def _watch_for_a_dead_client(
    sender: object, connection: BaseDatabaseWrapper, **kwargs: object
) -> None:
    """Every connection of a handler process: the server ends its query once the process is killed."""
    from durable_jobs import db

    try:
        db.check_client_connection(CLIENT_CHECK_MS, using=connection.alias)
    except Exception:
        log.debug("client_connection_check_interval not available", exc_info=True)


def main(argv: list[str]) -> None:
    prepare()
    serve(int(argv[1]), int(argv[2]))


def prepare() -> None:
    """Set Django up: what every handler process needs first, and all the zygote does."""
    import django

    django.setup()
    from durable_jobs import logsetup

    logsetup.configure(None)  # the worker's console handler, when the project configured none
    # What a run imports, imported now: once in the zygote for every child it forks, and
    # in a spawned child before it says it is ready, not during its first slice.
    from durable_jobs import registry, states, store  # noqa: F401
    from durable_jobs.runtime import child_runs, context, control, executor, invoke  # noqa: F401


def serve(command_fd: int, result_fd: int) -> None:
    """Take runs from the worker on ``command_fd`` and answer on ``result_fd``, until it goes."""
    from django.db import InterfaceError, OperationalError, connections
    from django.db.backends.signals import connection_created

    from durable_jobs.runtime.child_runs import run_one

    logging.getLogger("durable_jobs").setLevel(
        os.environ.get("DURABLE_JOBS_CHILD_LOG_LEVEL", "INFO")
    )

    commands = os.fdopen(command_fd, "r")
    # First word from the worker: the database as it reaches it.
    database = json.loads(commands.readline() or "null")
    if not database or database.get("op") != "database":
        sys.exit("durable_jobs.runtime.child: expected the worker's database first")
    using = database["alias"]
    connections[using].settings_dict.update(database["settings"])
    connection_created.connect(
        _watch_for_a_dead_client, dispatch_uid="durable_jobs.runtime.child.watch"
    )
    mailbox = Mailbox(commands, result_fd)
    threading.Thread(target=mailbox.read_forever, name="durable-child-mailbox", daemon=True).start()

    mailbox.answer({"op": "ready", "pid": os.getpid()})
    while True:
        message = mailbox.take()
        began = time.monotonic()
        try:
            ran = run_one(message, mailbox, using)
        except (OperationalError, InterfaceError) as error:
            # Loading the job failed on a dead connection: infrastructure, not the work.
            connections[using].close()
            ran = {
                "end": SliceEnd.INTERRUPTED.value,
                "message": f"interrupted: database connection lost ({type(error).__name__})",
            }
        except Exception as error:
            log.exception("child: slice bookkeeping failed")
            ran = {
                "end": SliceEnd.FAILED.value,
                "error_class": "transient",
                "code": "child_error",
                "message": f"{type(error).__name__}: {error}"[:2000],
            }
        # "at": when this slice ended, which is when the next queued run starts (the
        # worker's time limit for that one counts from here; CLOCK_MONOTONIC is the host's).
        # "began": when it was taken up here, so the worker can tell how long the run took
        # from how long it waited to hear (a saturated machine delays both processes).
        mailbox.answer(
            {"op": "ran", "seq": message.get("seq"), "began": began, "at": time.monotonic(), **ran}
        )


if __name__ == "__main__":
    main(sys.argv)
