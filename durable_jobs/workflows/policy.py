"""The rules of a workflow, kept apart from the statements that enforce them.

A child's id is ``uuid5(parent id, spawn key)``: the same parent spawning the same key
names the same child, so a slice re-run after a crash finds the child it already started
instead of starting a second (invariant 29). A wait is a value the handler returns
(``Wait``); the worker writes it as a hold that keeps no lease (invariant 30).

Failure policies of a wait for children, decided when the parent is woken:

``fail`` (the default)
    The first child that ends failed or cancelled wakes the parent, which ends ``failed``
    with code ``child_failed`` (its other children run on).
``cancel``
    The same, and the parent's live children are asked to cancel.
``continue``
    A failed or cancelled child counts as ended; the parent resumes when what it waits
    for has ended and reads each child's status, result and error from ``job.children()``.
``wait``
    Only completed children count: a failed child keeps the parent waiting until an
    operator re-drives that child and it completes (or the parent is cancelled).
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta
from typing import Any

from durable_jobs import validation
from durable_jobs.exceptions import InvalidInput

#: The error code of a parent ended by its wait's failure policy.
CHILD_FAILED = "child_failed"
POLICIES = ("fail", "cancel", "continue", "wait")
#: At most this many children in one ``spawn_many`` call (one statement, one jsonb array).
MAX_SPAWN_BATCH = 50_000
#: The longest a wait may name: a sleep or an event's timeout (thirty days ahead, like the
#: ``after`` wait condition's ceiling).
MAX_WAIT = timedelta(days=30)


def child_id(parent_id: Any, key: str) -> uuid.UUID:
    """The id of the child ``parent_id`` spawns under ``key`` (invariant 29)."""
    parent = parent_id if isinstance(parent_id, uuid.UUID) else uuid.UUID(str(parent_id))
    return uuid.uuid5(parent, key)


def spawn_row(
    parent_id: Any, kind: str, input: Any, key: Any, *, max_bytes: int, max_depth: int
) -> dict[str, Any]:
    """One child's row for the spawn statement, checked; ``InvalidInput`` names what is wrong."""
    validation.name("kind", kind)
    spawn_key = validation.key("key", key, max_length=200)
    validation.payload("input", input, max_bytes=max_bytes, max_depth=max_depth)
    return {
        "id": str(child_id(parent_id, spawn_key)),
        "kind": kind,
        "spawn_key": spawn_key,
        "input": input,
    }


def _duration_ms(field: str, value: Any) -> int:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = timedelta(seconds=value)
    if not isinstance(value, timedelta) or not timedelta(0) <= value <= MAX_WAIT:
        raise InvalidInput(field, "must be a timedelta (or seconds) from 0 to 30 days")
    return int(value.total_seconds() * 1000)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    """What a handler returns to wait without a lease: for children, an event, or a sleep.

    Build it with ``job.wait_for_children()``, ``job.wait_for_event()`` or ``job.sleep()``.
    """

    on: str  # "children" | "event" | "sleep"
    at_least: int | None = None  # children: how many must have ended (None: all)
    policy: str = "fail"  # children: see the module's docstring
    event: str | None = None  # event: its name
    delay_ms: int | None = None  # sleep: how long; event: the timeout (None: no timeout)

    @classmethod
    def children(cls, *, at_least: int | None = None, policy: str = "fail") -> Wait:
        if at_least is not None:
            validation.integer("at_least", at_least, low=1, high=2**31 - 1)
        if policy not in POLICIES:
            raise InvalidInput("policy", f"must be one of {', '.join(POLICIES)}")
        return cls(on="children", at_least=at_least, policy=policy)

    @classmethod
    def for_event(cls, name: str, *, timeout: Any = None) -> Wait:
        validation.name("event", name)
        delay = None if timeout is None else _duration_ms("timeout", timeout)
        return cls(on="event", event=name, delay_ms=delay)

    @classmethod
    def sleep(cls, duration: Any) -> Wait:
        return cls(on="sleep", delay_ms=_duration_ms("sleep", duration))

    def as_json(self) -> dict[str, Any]:
        """The form stored in ``flow_wait`` and carried over a handler process's pipe."""
        fields = {"on": self.on, "at_least": self.at_least, "policy": self.policy}
        fields.update(event=self.event, delay_ms=self.delay_ms)
        return {name: value for name, value in fields.items() if value is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Wait:
        return cls(
            on=data["on"],
            at_least=data.get("at_least"),
            policy=data.get("policy", "fail"),
            event=data.get("event"),
            delay_ms=data.get("delay_ms"),
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ChildOutcome:
    """One child as its parent reads it (``job.children()``)."""

    id: uuid.UUID
    key: str
    kind: str
    status: str
    result: Any = None
    error_code: str | None = None
    error_message: str | None = None

    @property
    def ended(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """An event a job received (``job.received()``): consumed by the slice's next fenced write."""

    id: int
    name: str
    payload: Any


#: The error code of a job started ``after=[...]`` whose dependency failed (policy ``fail``).
DEPENDENCY_FAILED = "dependency_failed"


def current_wait(flow_wait: Any, continuation_seq: int) -> dict[str, Any] | None:
    """The wait the continuation ``continuation_seq`` resumes from, else None.

    A hold stamps the continuation it hands over to (``seq``); a later slice, after an
    ordinary yield, is not resuming from that wait, and its policy no longer applies.
    """
    if not isinstance(flow_wait, dict) or flow_wait.get("seq") != continuation_seq:
        return None
    return flow_wait


def failure_verdict(
    flow_wait: Any, children_failed: int, deps_failed: int = 0, *, continuation_seq: int
) -> tuple[str, str, bool] | None:
    """``(code, message, cancel siblings)`` when a woken job must end failed, else None.

    Read from the row as claimed: the policy of the wait it resumes from (``current_wait``)
    and how many of its children (or dependencies) ended failed or cancelled, as their
    terminal statements counted them.
    """
    flow_wait = current_wait(flow_wait, continuation_seq)
    if flow_wait is None:
        return None
    if flow_wait.get("on") == "after":
        if flow_wait.get("policy", "fail") != "fail" or deps_failed <= 0:
            return None
        message = (
            f"{deps_failed} job(s) it was started after ended failed or cancelled "
            "(after_policy 'fail'; use after_policy='run' to run anyway)"
        )
        return DEPENDENCY_FAILED, message, False
    if flow_wait.get("on") != "children":
        return None
    policy = flow_wait.get("policy", "fail")
    if policy not in ("fail", "cancel") or children_failed <= 0:
        return None
    message = (
        f"{children_failed} child job(s) ended failed or cancelled "
        f"(wait policy {policy!r}; use policy='continue' to resume with their outcomes)"
    )
    return CHILD_FAILED, message, policy == "cancel"


def describe_wait(job: Any) -> str:
    """Why a job held by a workflow wait is not running, for ``explain`` and the console.

    ``job`` is a job row (its ``flow_wait``, counters and ``next_run_at`` are read).
    """
    wait = job.flow_wait if isinstance(job.flow_wait, dict) else {}
    on, policy = wait.get("on"), wait.get("policy", "fail")
    until = (
        ""
        if job.next_run_at is None
        else f" (at the latest until {job.next_run_at:%Y-%m-%d %H:%M:%S %Z})"
    )
    if on == "children":
        want = wait.get("at_least") or "all"
        return (
            f"It waits for {want} of its {job.children_total} children to end "
            f"({job.children_ended} ended, {job.children_failed} of them failed or cancelled; "
            f"policy {policy!r}): the child whose end satisfies the wait wakes it, holding no lease."
        )
    if on == "after":
        return (
            f"It waits for the {job.deps_total} jobs it was started after "
            f"({job.deps_ended} ended, {job.deps_failed} failed or cancelled; "
            f"after_policy {policy!r}): the last to end wakes it."
        )
    if on == "event":
        return (
            f"It waits for the event {wait.get('event')!r}{until}: "
            "durable_jobs.send_event() wakes it."
        )
    return f"It sleeps{until}, holding no lease."
