"""Flow control, the public side: why a job waits, and the limits an operator sets.

The policy is ``durable_jobs.limits.policy``; the claim and the explanation read the same
predicates in ``durable_jobs.store`` (invariants 26 and 28). See docs/howto/flow-control.rst.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.db import DEFAULT_DB_ALIAS

from durable_jobs import store, validation
from durable_jobs.exceptions import InvalidInput
from durable_jobs.limits import claims
from durable_jobs.limits import explain as limits_explain
from durable_jobs.limits.policy import Rate
from durable_jobs.limits.reasons import Reason
from durable_jobs.models import Job
from durable_jobs.service import get
from durable_jobs.states import FlowKeyState, Scope


def explain(
    job: Job | uuid.UUID | str,
    *,
    scope: Scope | str | tuple[str, str | None] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> tuple[Reason, ...]:
    """Return every reason ``job`` is not running now, as data, most decisive first.

    Each ``Reason`` has a ``code`` (``durable_jobs.limits.reasons``), its ``fields`` and a
    plain ``sentence``; a job nothing holds answers ``claimable`` (or ``fair_turn``).
    Invariant 28: what keeps a pending job from the claim is read with the claim
    statement's own predicates, so explain and the claim cannot disagree. A job id is
    looked up in ``scope`` (invariant 10).
    """
    if not isinstance(job, Job):
        job = get(job, scope=scope, using=using)
    return limits_explain.explain(job, using=using)


def set_flow_limit(
    key: str,
    *,
    concurrency: int | None = None,
    rate: Rate | None = None,
    weight: float | None = None,
    clear: Iterable[str] = (),
    by: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Set an operator's limits on flow ``key``, in force from the next claim on, fleet-wide.

    They override the settings' ``FLOW_KEYS`` and the kinds' ``FlowControl`` until
    cleared (``clear=["concurrency", "rate", "weight"]``). Lowering a limit never stops
    running jobs: the key admits no new one until its running jobs fall below it.
    """
    validation.key("key", key, max_length=200)
    cleared = list(clear)
    unknown = set(cleared) - {"concurrency", "rate", "weight"}
    if unknown:
        raise InvalidInput("clear", f"names no limit: {sorted(unknown)}")
    if concurrency is not None:
        validation.integer("concurrency", concurrency, low=0, high=1_000_000)
    if rate is not None and not isinstance(rate, Rate):
        raise InvalidInput("rate", "must be a durable_jobs.Rate")
    if weight is not None and (
        isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0
    ):
        raise InvalidInput("weight", "must be a positive number")
    if by is not None:
        by = validation.key("by", by, max_length=200)
    store.set_flow_limit(
        key,
        concurrency=concurrency,
        rate=None if rate is None else rate.limit,
        rate_window_ms=None if rate is None else rate.window_ms,
        weight=None if weight is None else float(weight),
        clear=cleared,
        changed_by=by,
        using=using,
    )


def flow_keys(*, using: str = DEFAULT_DB_ALIAS) -> list[FlowKeyState]:
    """Every flow key with its limits in force and its occupancy (permits, window, waiting)."""
    return store.list_flow_keys(flow=claims.claim_settings(), using=using)
