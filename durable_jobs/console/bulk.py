"""durable_jobs' own handlers (found by autodiscovery like any app's ``durable.py``).

``durable_jobs.bulk_action``: the admin's "act on all N matching" as a durable job. An
operator's click on a million rows must not be one request; it is a job that walks the
matches newest first in chunks, applies the action to each through the service (the same
rules, scope and row locks as a click on one row), and commits each chunk's cursor and
counts with its lease re-asserted (invariant 5), so a crash or a redrive resumes where the
last chunk committed and a cancel stops it between chunks.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.console import live as console
from durable_jobs.console.actions import BUSY, apply_action
from durable_jobs.models import Job
from durable_jobs.states import LIVE_STATUSES, Scope

#: Jobs per fenced chunk: small enough that a chunk commits within a heartbeat or two.
CHUNK = 200
ACTIONS = ("cancel", "redrive", "force_redrive")


@durable.handler("durable_jobs.bulk_action")
def bulk_action(job):

    spec = job.input or {}
    action, filters, by = spec.get("action"), spec.get("filters") or {}, spec.get("by") or "admin"
    if action not in ACTIONS or not isinstance(filters, dict):
        raise durable.TerminalError(
            f"unknown action {action!r} or filters {filters!r}", code="bad_bulk_action"
        )
    state = job.checkpoint or {"after": None, "changed": 0, "refused": {}, "processed": 0}
    # Only jobs that existed when the action was asked for: later ones were never seen.
    matching = (
        console.matching(filters).filter(created_at__lte=job.row.created_at).exclude(id=job.id)
    )
    while True:
        page = matching
        if state["after"] is not None:
            at, last_id = datetime.fromisoformat(state["after"][0]), state["after"][1]
            page = page.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=last_id))
        chunk = list(
            page.order_by("-created_at", "-id").values_list(
                "id", "tenant_id", "organization_id", "created_at"
            )[:CHUNK]
        )
        if not chunk:
            return durable.Done(
                {"action": action, "changed": state["changed"], "refused": state["refused"]}
            )
        with job.fenced():
            if action == "cancel":
                _cancel_chunk(chunk, by, state)
            else:
                for job_id, tenant, organization, _ in chunk:
                    refusal = apply_action(
                        action, job_id, Scope(tenant=tenant, organization=organization), by
                    )
                    _count(state, None if refusal is None else refusal[0])
            last = chunk[-1]
            state["after"] = [last[3].isoformat(), str(last[0])]
            state["processed"] += len(chunk)
            job.save_checkpoint(state, processed=state["processed"])
        if job.should_yield():
            return durable.YIELD


def _count(state: dict, reason: str | None) -> None:
    if reason is None:
        state["changed"] += 1
    else:
        state["refused"][reason] = state["refused"].get(reason, 0) + 1


def _cancel_chunk(chunk: list, by: str, state: dict) -> None:
    """One statement for the chunk; the rows it did not change are counted by why."""

    changed = store.request_cancel_many([(i, t, o) for i, t, o, _ in chunk], by=by)
    rest = [row[0] for row in chunk if row[0] not in changed]
    statuses = dict(Job.objects.filter(id__in=rest).values_list("id", "status")) if rest else {}
    for _ in changed:
        _count(state, None)
    for job_id in rest:
        status = statuses.get(job_id)
        if status in LIVE_STATUSES:
            _count(state, BUSY)
        else:
            _count(state, f"{status} (it has already finished)" if status else "gone")
