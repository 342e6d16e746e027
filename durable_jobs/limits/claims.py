"""The limits a claim reads besides the operator's: the settings' and the kinds'.

DEQUEUE and EXPLAIN_JOB take them as one JSON parameter (``{"keys": {...}, "kinds":
{...}}``) so the statement, not Python, decides which applies (the operator's row, then
the key's settings, then the kind's), and both statements read the same answer
(invariant 28).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from durable_jobs import conf, registry, store
from durable_jobs.exceptions import InvalidInput
from durable_jobs.limits.policy import Rate, StartFacts, key_for, limits_of


def claim_settings(kinds: Iterable[str] | None = None) -> str:
    """The claim's flow parameter for ``kinds`` (None: every registered kind)."""
    settings = conf.get()
    keys: dict[str, Any] = {}
    for key, raw in settings.FLOW_KEYS.items():
        rate = None if raw.get("rate") is None else Rate(limit=raw["rate"], per=raw.get("per", 1.0))
        keys[key] = limits_of(raw.get("concurrency"), rate, raw.get("weight"))
    by_kind: dict[str, Any] = {}
    for kind in registry.kinds() if kinds is None else kinds:
        handler = registry.get(kind)
        if handler is not None and handler.flow is not None:
            by_kind[kind] = handler.flow.limits()
    return json.dumps({"keys": keys, "kinds": by_kind}, sort_keys=True)


def flow_kinds() -> bool:
    """Whether a kind registered here has flow control: only its jobs carry a flow key.

    A worker whose kinds have none never needs the keyed claim, nor the look for keyed
    work (invariant 14b: it claims only the kinds it runs), so flow control costs a
    project that does not use it nothing on the claim path.
    """
    return any(
        handler is not None and handler.flow is not None
        for handler in map(registry.get, registry.kinds())
    )


#: How long a worker trusts its last look for keyed jobs (seconds). A keyed job started
#: while a worker's unkeyed backlog keeps its claims full waits at most this long; one
#: started into an otherwise idle queue is seen at once (see ``keyed_work``).
KEYED_LOOK_TTL = 2.0
_looked: dict[tuple[str, ...], tuple[float, bool]] = {}


def for_claim(queues: Sequence[str], *, using: str = DEFAULT_DB_ALIAS) -> str | None:
    """The ``flow`` parameter of a worker's claim, or None for the default claim.

    The keyed claim (DEQUEUE) costs several times the default one (DEQUEUE_OPEN) to plan,
    so a worker uses it only while a job with a flow key waits in its queues, looked up
    at most every KEYED_LOOK_TTL seconds. The default claim never takes a keyed job, so a
    stale answer only delays one; it never lets one past its key.
    """
    if not flow_kinds():
        return None  # no kind it runs has a key: every job it may claim is unkeyed
    key = tuple(queues)
    seen = _looked.get(key)
    if seen is None or time.monotonic() - seen[0] > KEYED_LOOK_TTL:
        return claim_settings() if keyed_work(queues, using=using) else None
    return claim_settings() if seen[1] else None


def keyed_work(queues: Sequence[str], *, using: str = DEFAULT_DB_ALIAS) -> bool:
    """Look now whether a job with a flow key waits in ``queues`` (and remember it).

    A worker whose default claim came back short asks this before it waits, so a keyed
    job in an otherwise drained queue is claimed at once, not after the look's TTL.
    """
    if not flow_kinds():
        return False
    found = store.has_keyed_work(queues, using=using)
    _looked[tuple(queues)] = (time.monotonic(), found)
    return found


def flow_key(fields: dict[str, Any], tenant: str, organization: str | None) -> str | None:
    """The flow key of a start's prepared fields, by its kind's FlowControl (None: unlimited)."""
    handler = registry.get(fields["kind"])
    if handler is None or handler.flow is None:
        return None
    raw_input = fields.get("input")
    facts = StartFacts(
        kind=fields["kind"],
        input=json.loads(raw_input) if isinstance(raw_input, str) else raw_input,
        tenant=tenant,
        organization=organization,
        subject_type=fields.get("subject_type"),
        subject_id=fields.get("subject_id"),
        queue=fields["queue"],
    )
    key = key_for(handler.flow, facts)
    transport = conf.transport_of(fields["queue"], conf.get())
    if key is not None and transport != "database":
        # Invariant 26 is decided by the keyed claim statement; a broker's delivery claims
        # one job through store.claim, which has no permits to grant.
        raise InvalidInput(
            "queue",
            f"{fields['queue']!r} is delivered by {transport}, and {fields['kind']!r} has "
            "flow control, which only the database transport's claim enforces: start it "
            "on a database queue",
        )
    return key
