"""Unique jobs by arguments: what ``start(..., unique=...)`` means, and the key it computes.

A unique start carries a key computed here from the kind, the scope and the chosen input
fields; the database's unique indexes on that key are the authority (invariant 25), so
this module only decides *what* is compared, never *whether* a job exists. Pure: no
database, no settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from datetime import timedelta
from typing import Any, Literal

from durable_jobs.exceptions import InvalidInput

LIVE = ("pending", "running")
#: The terminal states a key may also cover within its period.
FINISHED = ("completed", "failed", "cancelled")
#: A period's bounds: a second (finer is noise against a start's own duration) to a year.
MIN_PERIOD_MS = 1_000
MAX_PERIOD_MS = 366 * 86_400_000


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Unique:
    """At most one job of a kind per scope with the same selected input, while covered.

    ``fields``: top-level input keys compared (None: the whole input). ``period``
    (seconds or a timedelta): also cover jobs created in the same window of that length,
    aligned to the Unix epoch on the database clock, once they reach one of ``states``'
    finished states. ``states``: the statuses covered; always ``pending`` and
    ``running`` (a yield moves a job between the two, so coverage must not change with
    it), plus finished ones, which need a period; default: the live ones, and
    ``completed`` when a period is given.
    """

    fields: tuple[str, ...] | None = None
    period: timedelta | None = None
    states: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        set_(self, "fields", _fields(self.fields))
        set_(self, "period", _period(self.period))
        set_(self, "states", _states(self.states, self.period))

    @property
    def period_ms(self) -> int | None:
        """The period in milliseconds (what crosses into SQL), or None."""
        return None if self.period is None else self.period // timedelta(milliseconds=1)


def _fields(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise InvalidInput("unique.fields", "must be a list of input keys, or None for all")
    if not value:
        raise InvalidInput("unique.fields", "is empty; leave it None to compare the whole input")
    if not all(isinstance(f, str) and f for f in value):
        raise InvalidInput("unique.fields", "must hold non-empty strings (top-level input keys)")
    if len(set(value)) != len(value):
        raise InvalidInput("unique.fields", "names a key twice")
    return tuple(sorted(value))


def _period(value: Any) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise InvalidInput("unique.period", "must be seconds or a timedelta")
    period = value if isinstance(value, timedelta) else timedelta(seconds=value)
    ms = period // timedelta(milliseconds=1)
    if not MIN_PERIOD_MS <= ms <= MAX_PERIOD_MS or period % timedelta(seconds=1):
        raise InvalidInput("unique.period", "must be whole seconds, from 1 second to 366 days")
    return period


def _states(value: Any, period: timedelta | None) -> tuple[str, ...]:
    if not value:
        return (*LIVE, "completed") if period is not None else LIVE
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise InvalidInput("unique.states", "must be a list of statuses")
    states = {str(getattr(s, "value", s)) for s in value}
    unknown = sorted(states - set(LIVE) - set(FINISHED))
    if unknown:
        raise InvalidInput("unique.states", f"unknown statuses {unknown}")
    if not set(LIVE) <= states:
        raise InvalidInput(
            "unique.states",
            "must include pending and running: a yield moves a job between them",
        )
    if states == set(LIVE) and period is not None:
        raise InvalidInput("unique.states", "a period needs a finished state to cover")
    if states != set(LIVE) and period is None:
        raise InvalidInput(
            "unique.states",
            "finished states need a period (to cover finished jobs forever, use idempotency_key)",
        )
    return tuple(s for s in (*LIVE, *FINISHED) if s in states)


def coerce(field: str, value: Any) -> Unique | Literal[False] | None:
    """Read a ``unique=`` argument: None (not given), False (off), or a ``Unique``.

    ``True`` is the whole input; a list or tuple of strings is those fields.
    """
    if value is None or isinstance(value, Unique):
        return value
    if value is False:
        return False
    if value is True:
        return Unique()
    if isinstance(value, (list, tuple)):
        try:
            return Unique(fields=tuple(value))
        except InvalidInput as error:
            raise InvalidInput(field, error.detail) from None
    raise InvalidInput(
        field, f"must be True, a list of input keys or a durable.Unique, got {type(value).__name__}"
    )


def key(unique: Unique, kind: str, tenant: str, organization: str | None, input: Any) -> str:
    """The unique key of a start: its kind, readable, and a digest of scope and selection.

    The selection is canonical JSON (keys sorted, no spaces), so key order in the caller's
    dict changes nothing. A selected field missing from the input is left out, which is
    not the same as a field present with null.
    """
    if unique.fields is None:
        selected = input
    elif isinstance(input, dict):
        selected = {name: input[name] for name in unique.fields if name in input}
    else:
        raise InvalidInput("unique.fields", "selects keys, so the input must be a JSON object")
    text = json.dumps(
        [tenant, organization, selected], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return f"{kind}:{hashlib.sha256(text.encode()).hexdigest()}"
