"""The limits a claim reads besides the operator's: the settings' and the kinds'.

DEQUEUE and EXPLAIN_JOB take them as one JSON parameter (``{"keys": {...}, "kinds":
{...}}``) so the statement, not Python, decides which applies (the operator's row, then
the key's settings, then the kind's), and both statements read the same answer
(invariant 28).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from durable_jobs import conf, registry
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
    return key_for(handler.flow, facts)
