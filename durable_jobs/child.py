"""The child process of process execution: runs handlers, one slice at a time, for one slot.

Started by ``durable_jobs.runner.ChildRunner`` as ``python -m durable_jobs.child CMD_FD RESULT_FD``
in a session (process group) of its own, with the worker's settings module in its
environment. It reads one JSON line per message from CMD_FD and writes one per answer
to RESULT_FD; the handler's own stdout and stderr stay the worker's.

Messages in: ``run`` (the claimed row and the lease it was claimed under), and, about
the slice running now, ``cancel``, ``lease_lost`` and ``stop`` (the worker is shutting
down). Answers out: ``ready`` once Django is set up, then one ``Ran`` per ``run``.

The child holds no lease of its own: the worker keeps the lease alive, records the
outcome, and kills this process group at the time limit, on a cancel or a shutdown past
its grace. What the child writes goes through ``fenced()`` on its own connection, under
the same owner and epoch fence as any holder's write, so a child that outlives its lease
lands nothing. When the worker dies the command pipe reaches end of file and the child
exits at once: it never runs on unsupervised.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import queue
import signal
import sys
import threading
import uuid
from typing import Any

log = logging.getLogger("durable_jobs.child")


class Mailbox:
    """Messages from the worker: ``run`` requests queued, slice flags applied as they arrive."""

    def __init__(self, stream) -> None:
        self.runs: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._current = None  # (job id, Slice) of the slice running now
        self._early: dict[tuple[str, int], set[str]] = {}  # flags for a slice not started yet
        self._stream = stream

    def read_forever(self) -> None:
        for line in self._stream:
            message = json.loads(line)
            op = message["op"]
            if op == "run":
                self.runs.put(message)
            elif op == "stop":
                self.stopping.set()
            else:
                self._flag((message["job_id"], message["epoch"]), op)
        # End of file: the worker is gone (or asked us to leave). Nobody supervises the
        # handler any more, so neither it nor anything it started may run on: this
        # process leads its own process group.
        os.killpg(0, signal.SIGKILL)

    def _flag(self, delivery: tuple[str, int], op: str) -> None:
        # Keyed by job and epoch: a flag that arrives after its slice ended must not
        # reach the next slice of the same job.
        with self._lock:
            current = self._current
            if current is not None and current[0] == delivery:
                _apply(current[1], op)
            else:
                self._early.setdefault(delivery, set()).add(op)

    def begin(self, delivery: tuple[str, int], context) -> None:
        with self._lock:
            self._current = (delivery, context)
            for op in self._early.pop(delivery, ()):
                _apply(context, op)

    def end(self) -> None:
        with self._lock:
            self._current = None


def _apply(context, op: str) -> None:
    if op == "cancel":
        context.observe_cancel()
    elif op == "lease_lost":
        context.mark_lease_lost()


def encode_row(job) -> dict[str, Any]:
    """The claimed row as JSON-ready values, so the child need not read it again."""
    values = {}
    for name in _row_typers()[0]:
        value = getattr(job, name)
        if value is None:
            continue  # most columns of a claimed row are NULL: absent means NULL
        if isinstance(value, (datetime.datetime, uuid.UUID)):
            value = value.isoformat() if isinstance(value, datetime.datetime) else str(value)
        values[name] = value
    return values


def decode_row(values: dict[str, Any], using: str):
    """The row ``encode_row`` sent, as a ``Job`` again (timestamps and ids typed back)."""
    from durable_jobs.models import Job

    names, typers = _row_typers()
    typed = []
    for name, typer in zip(names, typers):
        value = values.get(name)
        typed.append(value if typer is None or value is None else typer(value))
    return Job.from_db(using, names, typed)


_TYPERS: tuple[list[str], list[Any]] | None = None


def _row_typers() -> tuple[list[str], list[Any]]:
    """Per column, how its JSON value becomes the Python value again (None: as it is).

    ``datetime.fromisoformat`` reads back exactly what ``isoformat()`` wrote (offset
    included), and at a fraction of ``DateTimeField.to_python``'s cost: the row crosses
    the pipe once per slice (issue #14).
    """
    global _TYPERS
    if _TYPERS is None:
        from django.db import models

        from durable_jobs.models import Job

        fields = Job._meta.concrete_fields
        _TYPERS = ([field.attname for field in fields],
                   [datetime.datetime.fromisoformat if isinstance(field, models.DateTimeField)
                    else uuid.UUID if isinstance(field, models.UUIDField) else None for field in fields])
    return _TYPERS


def run_one(message: dict[str, Any], mailbox: Mailbox, using: str) -> dict[str, Any]:
    """Run the slice ``message`` names and return its ``Ran`` as a dict."""
    from durable_jobs import executor, registry
    from durable_jobs.context import Slice
    from durable_jobs.states import Lease
    from durable_jobs.worker import keep_connection_healthy

    keep_connection_healthy(using)
    lease = Lease(job_id=message["job_id"], owner=message["owner"], epoch=message["epoch"], ttl_ms=message["ttl_ms"])
    # The row as the worker's claim returned it: the claim is the authority, and every
    # write the handler makes is fenced on this lease anyway.
    job = decode_row(message["row"], using)
    handler = registry.get(job.kind) or executor._unregistered(job.kind)
    context = Slice(job, handler, lease, stopping=mailbox.stopping, using=using)
    mailbox.begin((message["job_id"], message["epoch"]), context)
    try:
        return executor.invoke(context, using=using).as_dict()
    finally:
        mailbox.end()


#: How soon the server ends a killed child's query (and frees its row locks).
CLIENT_CHECK_MS = 1000


def _watch_for_a_dead_client(sender, connection, **kwargs) -> None:
    """Every connection of a handler process: the server ends its query once the process is killed."""
    from durable_jobs import store

    try:
        store.check_client_connection(CLIENT_CHECK_MS, using=connection.alias)
    except Exception:  # noqa: BLE001 - an old server without the setting: the kill still ends idle sessions
        log.debug("client_connection_check_interval not available", exc_info=True)


def main(argv: list[str]) -> None:
    command_fd, result_fd = int(argv[1]), int(argv[2])
    import django

    django.setup()
    from django.db import InterfaceError, OperationalError, connections
    from django.db.backends.signals import connection_created

    from durable_jobs import logsetup

    logsetup.configure(None)  # the worker's console handler, when the project configured none
    logging.getLogger("durable_jobs").setLevel(os.environ.get("DURABLE_JOBS_CHILD_LOG_LEVEL", "INFO"))

    results = os.fdopen(result_fd, "w", buffering=1)
    commands = os.fdopen(command_fd, "r")
    # First word from the worker: the database as it reaches it.
    database = json.loads(commands.readline() or "null")
    if not database or database.get("op") != "database":
        sys.exit("durable_jobs.child: expected the worker's database first")
    using = database["alias"]
    connections[using].settings_dict.update(database["settings"])
    connection_created.connect(_watch_for_a_dead_client, dispatch_uid="durable_jobs.child.watch")
    mailbox = Mailbox(commands)
    threading.Thread(target=mailbox.read_forever, name="durable-child-mailbox", daemon=True).start()

    def answer(payload: dict[str, Any]) -> None:
        results.write(json.dumps(payload, separators=(",", ":")) + "\n")
        results.flush()

    answer({"op": "ready", "pid": os.getpid()})
    while True:
        message = mailbox.runs.get()
        try:
            ran = run_one(message, mailbox, using)
        except (OperationalError, InterfaceError) as error:
            # Loading the job failed on a dead connection: infrastructure, not the work.
            connections[using].close()
            ran = {"end": "interrupted", "message": f"interrupted: database connection lost ({type(error).__name__})"}
        except Exception as error:  # noqa: BLE001 - report it; the worker records a failed slice
            log.exception("child: slice bookkeeping failed")
            ran = {"end": "failed", "error_class": "transient", "code": "child_error",
                   "message": f"{type(error).__name__}: {error}"[:2000]}
        answer({"op": "ran", **ran})


if __name__ == "__main__":
    main(sys.argv)
