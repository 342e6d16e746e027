"""Handler registration and per-kind policy.

A handler is a function taking the slice context and returning ``DONE``, ``Done(result)``
or ``YIELD``; it raises to fail the slice. Policy fields left as ``None`` take their value
from ``DURABLE_JOBS`` when they are read, so tests that override settings see them.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durable_jobs import conf
from durable_jobs import unique as uniqueness
from durable_jobs.exceptions import ConfigurationError, InvalidInput, JobError
from durable_jobs.limits.policy import FlowControl
from durable_jobs.schedules import declare
from durable_jobs.states import ErrorClass

if TYPE_CHECKING:
    from durable_jobs.models import Job
    from durable_jobs.runtime.context import Slice

KIND_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,100}\Z")  # \Z: "$" would accept a final newline

#: classify(exc) -> "transient" | "terminal" | "unrecoverable"
Classifier = Callable[[BaseException], str]
#: mirror(job, outcome) runs inside the terminal transaction; outcome is "completed",
#: "failed" or "cancelled" and ``job`` is the row as that transaction wrote it.
Mirror = Callable[["Job", str], None]


def default_classifier(error: BaseException) -> str:
    """JobError subclasses say their class; anything else is worth a retry."""
    if isinstance(error, JobError):
        return error.error_class
    return ErrorClass.TRANSIENT.value


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Handler:
    kind: str
    func: Callable[[Slice], Any]
    queue: str | None = None
    slice_budget: float | None = None
    time_limit: float | None = None
    lease_ttl: float | None = None
    heartbeat_interval: float | None = None
    max_consecutive_failures: int | None = None
    retry_backoff_base: float | None = None
    retry_backoff_max: float | None = None
    max_mirror_attempts: int | None = None
    classify: Classifier = default_classifier
    mirror: Mirror | None = None
    #: job_policy(job) -> {"max_consecutive_failures": ..., "retry_backoff_base": ...}:
    #: per-job values of these policy fields, read where a failed slice is counted (the
    #: tasks backend stores each task's max_attempts and backoff on its job). A key left
    #: out or None falls back to the kind's policy.
    job_policy: Callable[[Job], dict[str, Any]] | None = None
    #: The kind's default ``unique`` for its starts (a start's own ``unique`` overrides
    #: it, ``unique=False`` turns it off): see durable_jobs.uniqueness.Unique.
    unique: uniqueness.Unique | None = None
    #: The kind's flow control (durable_jobs.limits.FlowControl): the key its jobs count
    #: against and that key's default concurrency, rate and weight (invariant 26).
    flow: FlowControl | None = None

    def setting(self, name: str) -> Any:
        """Return this handler's policy value, or the DURABLE_JOBS default."""
        own = getattr(self, name.lower())
        return own if own is not None else getattr(conf.get(), name)

    def setting_for(self, job: Job, name: str) -> Any:
        """Return ``job``'s own value of a policy field (``job_policy``), else ``setting(name)``."""
        if self.job_policy is not None:
            own = self.job_policy(job).get(name.lower())
            if own is not None:
                return own
        return self.setting(name)

    def time_limit_seconds(self) -> float:
        """The hard bound on one slice: the kind's own, DURABLE_JOBS' TIME_LIMIT, or twice the budget."""
        own = self.time_limit if self.time_limit is not None else conf.get().TIME_LIMIT
        return own if own is not None else 2 * self.setting("SLICE_BUDGET")

    def retry_delay(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds before the next attempt: capped exponential, jitter on the upper half.

        Jitter spreads the retries of jobs that failed together (a database blip) so they
        do not all come back in the same instant.
        """
        base = self.setting("RETRY_BACKOFF_BASE")
        cap = self.setting("RETRY_BACKOFF_MAX")
        ceiling = min(cap, base * 2 ** max(0, failures - 1))
        return ceiling / 2 + (rng or random).random() * ceiling / 2

    def error_class_of(self, error: BaseException) -> str:
        """Classify ``error``; a classifier that fails or answers nonsense means transient."""
        try:
            answer = str(self.classify(error))
        except Exception:  # noqa: BLE001 - a broken classifier must not strand the job
            return ErrorClass.TRANSIENT.value
        if answer not in {c.value for c in ErrorClass}:
            return ErrorClass.TRANSIENT.value
        return answer


_handlers: dict[str, Handler] = {}


def handler(kind: str, **policy: Any) -> Callable[[Callable], Callable]:
    """Register the decorated function as the handler of ``kind``.

    ``policy`` takes the ``Handler`` fields: queue, slice_budget, time_limit, lease_ttl,
    heartbeat_interval, max_consecutive_failures, retry_backoff_base, retry_backoff_max,
    max_mirror_attempts, classify, mirror, flow (a ``durable.FlowControl``), unique (True, a
    list of input keys or a ``durable.Unique``: the default of the kind's starts); and
    ``schedule``: a ``Schedule`` (or a list of them) that starts this kind periodically
    (durable_jobs.schedules).
    """
    if not isinstance(kind, str) or not KIND_PATTERN.match(kind):
        raise ConfigurationError(
            f"handler kind {kind!r} must be 1-100 characters of letters, digits, _ . : -"
        )
    schedules = policy.pop("schedule", None)
    unknown = set(policy) - {f.name for f in dataclasses.fields(Handler)} - {"kind", "func"}
    if unknown:
        raise ConfigurationError(f"handler {kind!r}: unknown policy {sorted(unknown)}")

    policy = _checked_policy(kind, policy)

    def register(func: Callable) -> Callable:
        if not callable(func):
            raise ConfigurationError(f"handler {kind!r} must be callable")
        existing = _handlers.get(kind)
        if (
            existing is not None
            and existing.func is not func
            and _qualname(existing.func) != _qualname(func)
        ):
            raise ConfigurationError(
                f"kind {kind!r} is registered twice: {_qualname(existing.func)} and {_qualname(func)}"
            )
        entry = Handler(kind=kind, func=func, **policy)
        undeclared = None if entry.queue is None else conf.undeclared_queue(entry.queue, conf.get())
        if undeclared is not None:
            raise ConfigurationError(f"handler {kind!r}: queue {undeclared}")
        lease = entry.setting("LEASE_TTL")
        if entry.setting("HEARTBEAT_INTERVAL") >= lease:
            raise ConfigurationError(
                f"handler {kind!r}: heartbeat_interval must be below lease_ttl"
            )
        if entry.time_limit_seconds() <= entry.setting("SLICE_BUDGET"):
            raise ConfigurationError(
                f"handler {kind!r}: time_limit ({entry.time_limit_seconds()}s) must exceed slice_budget "
                f"({entry.setting('SLICE_BUDGET')}s), or should_yield() never gets the chance to end a slice"
            )
        _handlers[kind] = entry
        if schedules is not None:
            declare.declare(kind, schedules)
        return func

    return register


_DURATIONS = (
    "slice_budget",
    "time_limit",
    "lease_ttl",
    "heartbeat_interval",
    "retry_backoff_base",
    "retry_backoff_max",
)
_COUNTS = ("max_consecutive_failures", "max_mirror_attempts")


def _checked_policy(kind: str, policy: dict[str, Any]) -> dict[str, Any]:
    """Apply the settings' rules to a handler's own policy: seconds or timedelta, counts >= 1."""
    checked = dict(policy)
    for name, value in policy.items():
        if value is None:
            continue
        label = f"handler {kind!r} {name}"
        if name in _DURATIONS:
            checked[name] = conf.duration(label, value)
        elif name in _COUNTS:
            conf.positive_int(label, value)
        elif name in ("classify", "mirror", "job_policy") and not callable(value):
            raise ConfigurationError(f"{label} must be callable")
        elif name == "unique":
            try:
                checked[name] = uniqueness.coerce(label, value) or None
            except InvalidInput as error:
                raise ConfigurationError(str(error)) from None
        elif name == "flow" and not isinstance(value, FlowControl):
            raise ConfigurationError(f"{label} must be a durable_jobs.FlowControl")
        elif name == "queue" and (not isinstance(value, str) or not conf.NAME_PATTERN.match(value)):
            raise ConfigurationError(
                f"{label} must be 1-100 characters of letters, digits, _ . : -"
            )
    return checked


def _qualname(func: Callable) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


def get(kind: str) -> Handler | None:
    """Return the handler registered for ``kind``, or None."""
    return _handlers.get(kind)


def kinds() -> list[str]:
    return sorted(_handlers)


def unregister(kind: str) -> None:
    """Forget ``kind`` (for tests that register handlers of their own)."""
    _handlers.pop(kind, None)
