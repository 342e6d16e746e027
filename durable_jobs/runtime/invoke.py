"""Call a slice's handler and say how it ended: ``invoke`` returns a ``Ran``, writes nothing.

This is the half of a slice that runs where the handler runs: on the slot thread in
thread execution, in the handler process in process execution (which sends the ``Ran``
back over its pipe as ``Ran.as_dict()``). Whatever a handler returns or raises maps to
one ``SliceEnd`` here; ``executor.record`` then writes the one transition it calls for.
"""

from __future__ import annotations

import dataclasses
import json
import traceback as traceback_module
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS

from durable_jobs import conf, db, registry, validation
from durable_jobs.exceptions import CancelRequested, InvalidInput, KindNotRegisteredHere, LeaseLost
from durable_jobs.registry import Handler
from durable_jobs.runtime.context import Slice

if TYPE_CHECKING:
    from durable_jobs.runtime.control import SliceControl
from durable_jobs.states import Done, ErrorClass, Outcome, SliceEnd
from durable_jobs.workflows import Wait


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Ran:
    """How a slice's handler ended, before anything is recorded: a closed set of ends.

    Produced where the handler ran (this thread, or the child process of process
    execution, which sends it over a pipe) and by the worker itself when it had to end
    the slice (time limit, cancel or shutdown past their grace, a dead child). ``record``
    turns each into exactly one transition.
    """

    end: SliceEnd
    result_json: str | None = None  # done: the validated result as JSON text
    interrupted: bool = False  # yield: the worker was shutting down
    error_class: str | None = None  # failed
    code: str | None = None  # failed
    message: str | None = None  # failed, interrupted, time_limit
    #: failed, interrupted: the formatted traceback of what the handler raised, redacted
    #: (REDACT_ERROR) where it was formatted; the store caps its size.
    traceback: str | None = None
    #: The run's own length, by the handler process's clock (process execution only).
    seconds: float | None = None
    #: wait: the workflow wait the handler returned (``Wait.as_json()``), as JSON text.
    wait_json: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set, for the pipe from a handler process (``from_dict`` reads
        them back). Not ``dataclasses.asdict``, a deep copy: this runs once per slice."""
        fields: dict[str, Any] = {"end": self.end.value}
        for name in ("result_json", "error_class", "code", "message", "traceback", "wait_json"):
            value = getattr(self, name)
            if value is not None:
                fields[name] = value
        if self.interrupted:
            fields["interrupted"] = True
        return fields

    @classmethod
    def from_dict(cls, answer: dict[str, Any]) -> Ran:
        """Read back what ``as_dict`` put on the pipe (plus the handler process's clock
        readings ``began`` and ``at``). An end this version does not know is a transient
        ``child_error``, never a transition nobody wrote."""
        end = answer.get("end")
        if end not in ENDS:
            return cls(
                end=SliceEnd.FAILED,
                error_class="transient",
                code="child_error",
                message=f"the handler process answered {str(end)[:100]!r}",
            )
        began, ended = answer.get("began"), answer.get("at")
        seconds = (
            ended - began
            if isinstance(began, (int, float)) and isinstance(ended, (int, float))
            else None
        )
        return cls(
            end=SliceEnd(end),
            result_json=answer.get("result_json"),
            error_class=answer.get("error_class"),
            code=answer.get("code"),
            message=answer.get("message"),
            traceback=answer.get("traceback"),
            interrupted=bool(answer.get("interrupted")),
            seconds=seconds,
            wait_json=answer.get("wait_json"),
        )


#: The ends of ``Ran``, by value: what ``record`` knows how to write (the pipe's check).
ENDS = frozenset(end.value for end in SliceEnd)


def invoke(context: Slice, *, using: str = DEFAULT_DB_ALIAS) -> Ran:
    """Call the handler and say how it ended; writes nothing of the job's bookkeeping.

    Whatever the handler returns or raises maps to one ``Ran``. A lost connection (or a
    server restart) is an interruption, never the work's own failure; a deadlock or a
    serialization failure leaves the connection usable and stays a transient failure.
    """
    handler = context.handler
    try:
        returned = handler.func(context)
    except LeaseLost:
        return Ran(end=SliceEnd.LEASE_LOST)
    except CancelRequested:
        return Ran(end=SliceEnd.CANCEL)
    except BaseException as error:  # noqa: BLE001 - every handler failure is an outcome
        # SystemExit, asyncio.CancelledError and the like too: nothing a handler raises
        # may take its slot (or the handler process) down.
        if db.is_connection_loss(error):
            db.reset_connection(using)
            return Ran(
                end=SliceEnd.INTERRUPTED,
                message=f"interrupted: database connection lost ({describe(error)})"[:2000],
                traceback=format_traceback(error),
            )
        db.leave_broken_transaction(using)
        if isinstance(error, InvalidInput):
            # Data the store can never hold (a checkpoint that is not JSON, a negative
            # count, a start with bad arguments) is the handler's bug, whatever its
            # classifier says: the same call fails the same way every time.
            return Ran(
                end=SliceEnd.FAILED,
                error_class=ErrorClass.TERMINAL.value,
                code=error_code(error),
                message=describe(error),
                traceback=format_traceback(error),
            )
        return Ran(
            end=SliceEnd.FAILED,
            error_class=handler.error_class_of(error),
            code=error_code(error),
            message=describe(error),
            traceback=format_traceback(error),
        )
    if isinstance(returned, Done) or _is(returned, Outcome.DONE):
        result = returned.result if isinstance(returned, Done) else None
        try:
            result_json = validation.payload(
                "result",
                result,
                max_bytes=conf.get().MAX_PAYLOAD_BYTES,
                max_depth=conf.get().MAX_PAYLOAD_DEPTH,
            )
        except Exception as error:  # noqa: BLE001
            # A terminal failure's error_code is the verdict (`terminal`, DESIGN §2), so
            # the message leads with what was wrong, the bound named in it.
            return Ran(
                end=SliceEnd.FAILED,
                error_class=ErrorClass.TERMINAL.value,
                code="invalid_result",
                message=f"invalid_result: {describe(error)}",
            )
        return Ran(end=SliceEnd.DONE, result_json=result_json)
    if _is(returned, Outcome.YIELD) or isinstance(returned, Wait):
        if context.cancel_observed:
            return Ran(end=SliceEnd.CANCEL)
        if isinstance(returned, Wait):
            # Invariant 30: written by record() as a hold that keeps no lease.
            return Ran(end=SliceEnd.WAIT, wait_json=json.dumps(returned.as_json()))
        return Ran(end=SliceEnd.YIELD, interrupted=context.interrupted)
    return Ran(
        end=SliceEnd.FAILED,
        error_class=ErrorClass.TERMINAL.value,
        code="invalid_outcome",
        message=(
            f"handler returned {type(returned).__name__}, expected DONE, Done(...), YIELD "
            "or a wait (job.wait_for_children(), job.wait_for_event(), job.sleep())"
        ),
    )


def time_limit_failure(control: SliceControl) -> Ran:
    """The failure charged to a slice that ran past its kind's time limit.

    Its end is ``TIME_LIMIT`` (recorded as a failed slice whose attempt says ``time_limit``).
    """
    limit = control.handler.time_limit_seconds()
    return Ran(
        end=SliceEnd.TIME_LIMIT,
        error_class=ErrorClass.TRANSIENT.value,
        code="time_limit",
        message=(
            f"slice ran past its time limit of {limit:g}s and was ended; raise time_limit for kind "
            f"{control.kind!r}, or save a checkpoint and return YIELD when should_yield() says so"
        ),
    )


def _is(returned: Any, outcome: Outcome) -> bool:
    # Compared as text only when it is text: ``==`` on an arbitrary object (an array, a
    # model) may raise or answer with something that is not a bool.
    return returned is outcome or (isinstance(returned, str) and returned == outcome.value)


def unregistered(kind: str) -> Handler:
    """A stand-in handler for a kind this worker does not know.

    It fails each slice as a transient ``unknown_kind`` error: during a rolling deploy a
    worker that knows the kind takes the retry; if none does, the job ends
    ``retry_exhausted`` with the reason in its message. It never crashes the worker
    and never spins: retries back off like any other.
    """

    def no_handler(job: Slice) -> None:
        raise KindNotRegisteredHere(
            f"no handler is registered for kind {kind!r} in this worker", code="unknown_kind"
        )

    return registry.Handler(kind=kind, func=no_handler)


def error_code(error: BaseException) -> str:
    code = getattr(error, "code", None)
    if isinstance(code, str) and validation.NAME.match(code):
        return code
    return type(error).__name__[:100]


def describe(error: BaseException) -> str:
    """``Class: message`` of an exception, redacted (REDACT_ERROR), then made printable and
    cut: the hook sees the whole text, so a cut never splits what it would mask."""
    return validation.printable(conf.redact(f"{type(error).__name__}: {error}") or "", limit=2000)


def format_traceback(error: BaseException) -> str | None:
    """The formatted traceback of ``error``, redacted (REDACT_ERROR); None if it cannot be formatted."""
    try:
        text = "".join(traceback_module.format_exception(error))
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises, a broken frame
        return None
    return conf.redact(text)
