"""Workflows: child jobs, fan-in, events and durable sleep (invariants 29 and 30).

Policy only, no SQL: what a handler may return to wait (``Wait``), how a child's identity
derives from its parent and key, what a finished child looks like to its parent
(``ChildOutcome``), and when a parent's failure policy ends it. The statements live in
``durable_jobs.store`` (section 9, "Workflows"); the handler's surface is on the slice
context (``job.spawn``, ``job.wait_for_children``, ``job.children``, ``job.wait_for_event``,
``job.received``, ``job.sleep``); ``durable_jobs.send_event`` is in the service.
"""

from durable_jobs.workflows.policy import (
    CHILD_FAILED,
    POLICIES,
    ChildOutcome,
    Event,
    Wait,
    child_id,
    current_wait,
    describe_wait,
    failure_verdict,
    spawn_row,
)

__all__ = [
    "CHILD_FAILED",
    "POLICIES",
    "ChildOutcome",
    "Event",
    "Wait",
    "child_id",
    "current_wait",
    "describe_wait",
    "failure_verdict",
    "spawn_row",
]
