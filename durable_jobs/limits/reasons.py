"""The reasons a job is not running, as data: a code, its facts, and one plain sentence.

``durable_jobs.explain(job)`` answers with a tuple of these, most decisive first, for a
program (``code`` and ``fields``) and an operator (``sentence``) alike. The codes are a
closed set; a reason whose predicate the claim statement also reads (``BLOCKING``) is
decided by the same SQL fragment in both places (invariant 28).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

#: Every code explain may give.
RUNNING = "running"  # it holds a live lease: it is running now
LEASE_EXPIRED = "lease_expired"  # running under a lease that expired: an orphan soon
FINISHED = "finished"  # completed or cancelled
FAILED = "failed"  # failed for good: only a redrive runs it again
PARKED = "parked"  # failed and parked (poison, mirror_failed, ...)
NOT_DUE = "not_due"  # scheduled for later (until)
BACKING_OFF = "backing_off"  # a failed slice waiting out its backoff (failures, until)
HELD = "held"  # held by a wait condition (since, checks, next check)
WORKFLOW_WAIT = "workflow_wait"  # waits for children, dependencies, an event or a sleep
CANCEL_REQUESTED = "cancel_requested"  # the reconciler ends it instead
QUEUE_PAUSED = "queue_paused"
CONCURRENCY_FULL = "concurrency_full"  # its flow key's permits are all held (by whom)
RATE_LIMITED = "rate_limited"  # its flow key's rate window is full (until)
FAIR_TURN = "fair_turn"  # claimable, after other keys' turns
LOCK_KEY_HELD = "lock_key_held"  # another live job holds its lock key
NO_WORKER = "no_worker"  # no live worker serves its queue (the last time one did)
NO_KIND = "no_kind"  # no live worker serving its queue runs its kind
CLAIMABLE = "claimable"  # nothing holds it: the next free slot takes it

#: The reasons that keep the claim statement from taking a pending job.
BLOCKING = frozenset(
    {
        NOT_DUE,
        BACKING_OFF,
        HELD,
        WORKFLOW_WAIT,
        CANCEL_REQUESTED,
        QUEUE_PAUSED,
        CONCURRENCY_FULL,
        RATE_LIMITED,
    }
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Reason:
    """One reason a job is not running (or, ``claimable``, that nothing holds it)."""

    code: str
    sentence: str
    fields: Mapping[str, Any] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    @property
    def blocks_claim(self) -> bool:
        """True when the claim statement leaves the job alone for this reason."""
        return self.code in BLOCKING

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: instants as ISO-8601 strings."""
        return {
            "code": self.code,
            "sentence": self.sentence,
            "fields": {name: _plain(value) for name, value in self.fields.items()},
        }


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
