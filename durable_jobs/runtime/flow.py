"""The worker's half of workflows: spawning under the fence, holding, and the failure policy.

The handler's surface is on ``Slice`` (``spawn``, ``spawn_many``, ``wait_for_children``,
``children``, ``wait_for_event``, ``received``, ``sleep``), which delegates here; the
statements are ``store`` section 9; the rules are ``durable_jobs.workflows``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction

from durable_jobs import conf, reads, registry, store, workflows
from durable_jobs.exceptions import InvalidInput, LeaseLost, UnknownKind
from durable_jobs.limits import claims
from durable_jobs.models import Job
from durable_jobs.states import Lease, Scope, SliceOutcome
from durable_jobs.transports import publishing as transports
from durable_jobs.workflows import api as workflows_api

if TYPE_CHECKING:
    from durable_jobs.runtime.context import Slice


def refuse_on_a_broker(queue: str, field: str) -> None:
    """Refuse a workflow on a broker queue, in one line naming the queue and its transport.

    A workflow's wake-ups (a child born, the last child's end, an event, a dependency's
    end) make a row due inside a terminal or sending statement; the database transport's
    claim reads that, but nothing publishes it to a broker, and a broker delivery's claim
    cannot see a hold. Workflows therefore run on database queues.
    """
    if transports.is_brokered(queue):
        transport = conf.transport_of(queue, conf.get())
        raise InvalidInput(
            field,
            f"queue {queue!r} is delivered by {transport}; workflows (children, waits for "
            "children or events, after=) run on database queues",
        )


def child_rows(parent_id: Any, children: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each child checked (``InvalidInput`` names the field), with its kind's queue and priority."""
    settings = conf.get()
    rows = []
    for child in children:
        unknown = set(child) - {"kind", "input", "key", "priority"}
        if unknown or "kind" not in child or "key" not in child:
            raise InvalidInput(
                "children", "each child is a dict with 'kind' and 'key' (and 'input', 'priority')"
            )
        row = workflows.spawn_row(
            parent_id,
            child["kind"],
            child.get("input"),
            child["key"],
            max_bytes=settings.MAX_PAYLOAD_BYTES,
            max_depth=settings.MAX_PAYLOAD_DEPTH,
        )
        handler = registry.get(row["kind"])
        if handler is None and settings.REQUIRE_REGISTERED_KINDS:
            raise UnknownKind(row["kind"])  # as start() refuses it
        row["queue"] = (handler.queue if handler else None) or settings.DEFAULT_QUEUE
        undeclared = conf.undeclared_queue(row["queue"], settings)
        if undeclared is not None:
            raise InvalidInput("queue", undeclared)
        refuse_on_a_broker(row["queue"], "queue")
        row["priority"] = child.get("priority")
        rows.append(row)
    if len(rows) > workflows.policy.MAX_SPAWN_BATCH:
        raise InvalidInput(
            "children", f"at most {workflows.policy.MAX_SPAWN_BATCH} in one spawn_many call"
        )
    return rows


def spawn(context: Slice, children: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Insert ``children`` under the slice's fence; return their ids (invariant 29).

    Only inside ``job.fenced()`` (or a ``save_checkpoint`` of it): the children commit
    with that transaction, so a slice that crashes before it commits started none, and one
    that re-runs finds the children it had committed (same parent, same key, same id).
    """
    if not context._state.in_fence:
        raise InvalidInput(
            "spawn",
            "call job.spawn()/spawn_many() inside `with job.fenced():`, so the children "
            "commit with the slice's fenced write (a re-run slice then finds them)",
        )
    rows = child_rows(context.id, children)
    if not rows:
        return []
    for row in rows:  # invariant 26: a child counts against its kind's flow key, as a start does
        row["flow_key"] = claims.flow_key(row, context.scope.tenant, context.scope.organization)
    born = store.spawn_children(
        context.lease, rows, notify_channel=conf.get().NOTIFY_CHANNEL, using=context.using
    )
    if born is None:  # cannot happen while fenced() holds the row; never assume
        raise LeaseLost(context.id, context.lease.epoch)
    return [row["id"] for row in rows]


def children(context: Slice) -> list[workflows.ChildOutcome]:
    """The slice's job's children, in spawn-key order, as last committed."""
    rows = reads.children_of(context.id, context.scope, using=context.using).values_list(
        "id", "spawn_key", "kind", "status", "result", "error_code", "error_message"
    )
    return [
        workflows.ChildOutcome(
            id=id,
            key=key or "",
            kind=kind,
            status=status,
            result=result,
            error_code=error_code,
            error_message=error_message,
        )
        for id, key, kind, status, result, error_code, error_message in rows
    ]


def received(context: Slice, name: str) -> workflows.Event | None:
    """Consume the oldest unread event ``name``, inside the slice's fence (exactly once)."""
    if not context._state.in_fence:
        raise InvalidInput(
            "received",
            "call job.received() inside `with job.fenced():`, so the event is consumed "
            "with the writes that act on it",
        )
    got = store.receive_event(context.lease, name, using=context.using)
    return None if got is None else workflows.Event(id=got[0], name=name, payload=got[1])


def hold(lease: Lease, wait_json: str | None, *, using: str) -> SliceOutcome | None:
    """Write the wait the handler returned; ``HELD``, ``YIELDED`` (already due), None: lease lost.

    Invariant 30. The row is locked first (``assert_lease``), then held in a statement of
    its own: an event whose sender committed before the lock is seen, and one sent after
    it waits for this transaction and then wakes the job.
    """
    wait = json.loads(wait_json or "null")
    with transaction.atomic(using=using):
        if not store.assert_lease(lease, using=using):
            return None
        answer = store.hold_for_wait(lease, wait, using=using)
    if answer is None:
        return None
    return SliceOutcome.HELD if answer[0] else SliceOutcome.YIELDED


def failure_verdict(job: Job, lease: Lease, *, using: str) -> tuple[str, str] | None:
    """``(code, message)`` when the parent's wait policy ends it now; asks siblings to cancel
    first when the policy is ``cancel``."""
    verdict = workflows.failure_verdict(
        job.flow_wait,
        job.children_failed,
        job.deps_failed,
        continuation_seq=job.continuation_seq,
    )
    if verdict is None:
        return None
    code, message, cancel_siblings = verdict
    if cancel_siblings:
        scope = Scope(tenant=job.tenant_id, organization=job.organization_id)
        workflows_api.cancel_children(job.id, scope, by=f"job:{job.id}", using=using)
    return code, message
