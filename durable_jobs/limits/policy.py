"""Which flow key a job counts against, and its limits: pure values, no database.

A kind opts in with ``@durable.handler(kind, flow=durable.FlowControl(...))``. The key is
chosen when the job starts and stored on its row (``flow_key``), so the claim reads one
indexed column and never evaluates user code (invariant 26).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from durable_jobs.exceptions import ConfigurationError

#: The key sources a FlowControl may name; anything else must be ``input:<field>`` or a
#: callable.
KEY_SOURCES = ("kind", "tenant", "subject", "queue")
MAX_KEY_LENGTH = 200


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Rate:
    """At most ``limit`` slice starts in any window of ``per`` seconds (a sliding window)."""

    limit: int
    per: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.limit, int) or isinstance(self.limit, bool) or self.limit < 1:
            raise ConfigurationError(f"Rate limit must be an int >= 1, got {self.limit!r}")
        if not isinstance(self.per, (int, float)) or not math.isfinite(self.per) or self.per <= 0:
            raise ConfigurationError(
                f"Rate per must be a positive number of seconds, got {self.per!r}"
            )

    @property
    def window_ms(self) -> int:
        return max(1, round(self.per * 1000))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StartFacts:
    """What a key function may read of a job being started."""

    kind: str
    input: Any
    tenant: str
    organization: str | None
    subject_type: str | None
    subject_id: str | None
    queue: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FlowControl:
    """A kind's flow control: the key its jobs count against and the key's default limits.

    ``key``: ``"kind"`` (one key for the kind), ``"tenant"``, ``"subject"``, ``"queue"``,
    ``"input:<field>"`` (a top-level input field), or a callable taking ``StartFacts`` and
    returning the key (or None: that job is not limited). ``concurrency``: at most that
    many of the key's jobs hold a lease at once. ``rate``: at most ``rate.limit`` slice
    starts per ``rate.per`` seconds. ``weight``: the key's share when keys compete for
    workers (fair claiming: a key of weight 3 is claimed three times as often as one of
    weight 1 while both have work). Per-key settings (``FLOW_KEYS``) and an operator's
    runtime limits (``durable_jobs.set_flow_limit``) override these.
    """

    key: str | Callable[[StartFacts], str | None] = "kind"
    concurrency: int | None = None
    rate: Rate | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.key, str):
            if self.key not in KEY_SOURCES and not (
                self.key.startswith("input:") and len(self.key) > len("input:")
            ):
                raise ConfigurationError(
                    f"FlowControl key {self.key!r} must be one of {', '.join(KEY_SOURCES)}, "
                    "'input:<field>' or a callable"
                )
        elif not callable(self.key):
            raise ConfigurationError(
                f"FlowControl key must be a string or a callable, got {self.key!r}"
            )
        if self.concurrency is not None and (
            not isinstance(self.concurrency, int)
            or isinstance(self.concurrency, bool)
            or self.concurrency < 1
        ):
            raise ConfigurationError(
                f"FlowControl concurrency must be an int >= 1, got {self.concurrency!r}"
            )
        if self.rate is not None and not isinstance(self.rate, Rate):
            raise ConfigurationError(
                f"FlowControl rate must be a durable_jobs.Rate, got {self.rate!r}"
            )
        if (
            not isinstance(self.weight, (int, float))
            or not math.isfinite(self.weight)
            or self.weight <= 0
        ):
            raise ConfigurationError(
                f"FlowControl weight must be a positive number, got {self.weight!r}"
            )

    def limits(self) -> dict[str, Any]:
        """The kind's defaults, as the claim statement reads them."""
        return limits_of(self.concurrency, self.rate, self.weight)


def limits_of(concurrency: int | None, rate: Rate | None, weight: float | None) -> dict[str, Any]:
    """One key's or kind's limits in the claim's vocabulary (None values left out)."""
    found: dict[str, Any] = {}
    if concurrency is not None:
        found["concurrency"] = concurrency
    if rate is not None:
        found["rate"] = rate.limit
        found["rate_window_ms"] = rate.window_ms
    if weight is not None:
        found["weight"] = float(weight)
    return found


def key_for(flow: FlowControl, facts: StartFacts) -> str | None:
    """The flow key a job counts against, or None when it is not limited.

    Keys are namespaced by their source (``tenant:acme``, ``subject:shop.Order:7``,
    ``reports.rebuild:account=42``) so two policies never share a key by accident; a
    callable's key is taken as it is, so kinds can share one on purpose.
    """
    source = flow.key
    if callable(source):
        value = source(facts)
        key = None if value is None else str(value)
    elif source == "kind":
        key = f"kind:{facts.kind}"
    elif source == "tenant":
        key = f"tenant:{facts.tenant}"
    elif source == "queue":
        key = f"queue:{facts.queue}"
    elif source == "subject":
        if facts.subject_type is None:
            return None
        key = f"subject:{facts.subject_type}:{facts.subject_id}"
    else:
        field = source.split(":", 1)[1]
        value = facts.input.get(field) if isinstance(facts.input, Mapping) else None
        if value is None:
            return None
        rendered = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        key = f"{facts.kind}:{field}={rendered}"
    if key is not None and (not key or len(key) > MAX_KEY_LENGTH):
        raise ConfigurationError(
            f"flow key for kind {facts.kind!r} must be 1-{MAX_KEY_LENGTH} characters, got {len(key)}"
        )
    return key
