"""Flow control: concurrency per key, rate limits, fair shares, and why a job waits.

The policy lives here and holds no SQL: ``policy`` says which key a job of a kind counts
against and with what limits; ``claims`` turns the settings and the registered kinds into
the one parameter the claim statement reads; ``reasons`` is the vocabulary ``explain``
answers in. The predicates themselves are written once, in ``durable_jobs.store``, and
both the claim (DEQUEUE) and explain (EXPLAIN_JOB) compose them (invariants 26, 28).
"""

from __future__ import annotations

from durable_jobs.limits.policy import FlowControl, Rate, key_for
from durable_jobs.limits.reasons import Reason

__all__ = ["FlowControl", "Rate", "Reason", "key_for"]
