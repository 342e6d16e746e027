"""durable_jobs' own handlers (found by autodiscovery like any app's ``durable.py``).

``durable_jobs.bulk_action``: the admin's "act on all N matching" (and on a selection
larger than ``ADMIN_ACTION_MAX_ROWS``) as a durable job. An operator's click on a million
rows must not be one request; it is a job that walks the matches newest first in chunks,
applies the action to each through the service (the same rules, scope and row locks as a
click on one row), and commits each chunk's cursor and counts with its lease re-asserted
(invariant 5), so a crash or a redrive resumes where the last chunk committed and a
cancel stops it between chunks.

The job acts on behalf of the user its input records (``user_id``), never on its own
authority: each slice loads that user, refuses to go on unless they still hold the
permission the action needs, and narrows the matches by ``ADMIN_SCOPE`` for them.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet

import durable_jobs as durable
from durable_jobs import service, store
from durable_jobs.console import live as console
from durable_jobs.console.actions import BULK_KIND, BUSY, PERMISSIONS, apply_action, may
from durable_jobs.models import Job, newest_first
from durable_jobs.states import LIVE_STATUSES, Scope

#: Jobs per fenced chunk: small enough that a chunk commits within a heartbeat or two.
CHUNK = 200
ACTIONS = tuple(PERMISSIONS)
#: The error code of a bulk job whose recorded user may not (or no longer) run its action.
#: It leads the message too: a terminal failure's ``error_code`` column holds the verdict.
FORBIDDEN = "bulk_action_forbidden"


@durable.handler(BULK_KIND)
def bulk_action(job):
    spec = job.input or {}
    action, by = spec.get("action"), spec.get("by") or "admin"
    filters, ids = spec.get("filters") or {}, spec.get("ids")
    if (
        action not in ACTIONS
        or not isinstance(filters, dict)
        or not (ids is None or isinstance(ids, list))
    ):
        raise durable.TerminalError(
            f"unknown action {action!r} or filters {filters!r}", code="bad_bulk_action"
        )
    user = _requester(spec, action)
    state = (
        job.checkpoint
        or spec.get("resume_state")
        or {
            "after": None,
            "changed": 0,
            "refused": {},
            "processed": 0,
        }
    )
    # Only jobs that existed when the action was asked for: later ones were never seen.
    created_before = spec.get("created_before") or job.row.created_at.isoformat()
    matching = _matching(filters, ids, user).filter(
        created_at__lte=datetime.fromisoformat(created_before)
    )
    matching = matching.exclude(id=job.id)
    if spec.get("resume_of"):
        matching = matching.exclude(id=spec["resume_of"])
    while True:
        if action == "cancel":
            _ask_descendants(state, by)
        page = matching
        if state["after"] is not None:
            at, last_id = datetime.fromisoformat(state["after"][0]), state["after"][1]
            page = page.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=last_id))
        chunk = list(
            newest_first(
                page.values_list("id", "tenant_id", "organization_id", "created_at", "kind"),
                0,
                CHUNK,
            )
        )
        if not chunk:
            return durable.Done(
                {"action": action, "changed": state["changed"], "refused": state["refused"]}
            )
        with job.fenced():
            if action == "cancel":
                _cancel_chunk(chunk, by, state)
            else:
                for job_id, tenant, organization, _, kind in chunk:
                    refusal = apply_action(
                        action,
                        job_id,
                        Scope(tenant=tenant, organization=organization),
                        by,
                        user=user,
                        kind=kind,
                    )
                    _count(state, None if refusal is None else refusal[0])
            last = chunk[-1]
            state["after"] = [last[3].isoformat(), str(last[0])]
            state["processed"] += len(chunk)
            job.save_checkpoint(state, processed=state["processed"])
        if job.should_yield():
            return durable.YIELD


def _requester(spec: dict, action: str) -> Any:
    """The user the job acts for, if they may still run ``action``; else a terminal error."""
    user_id = spec.get("user_id")
    user = None if user_id is None else get_user_model()._default_manager.filter(pk=user_id).first()
    if user is None:
        raise durable.TerminalError(
            f"{FORBIDDEN}: the bulk {action} records no user who asked for it (or that user is gone); "
            "start it again from the admin",
            code=FORBIDDEN,
        )
    if not may(user, action):
        raise durable.TerminalError(
            f"{FORBIDDEN}: user {user.get_username()!r} who asked for this bulk {action} does not hold the "
            f"{PERMISSIONS[action]} permission it needs",
            code=FORBIDDEN,
        )
    return user


def _matching(filters: dict, ids: list | None, user: Any) -> QuerySet[Job]:
    """The jobs the action is for: the console's filters, or exactly the selected ids,
    narrowed again by ADMIN_SCOPE for the recorded user (what they may see now)."""
    if ids is not None:
        try:
            wanted = [uuid.UUID(str(i)) for i in ids]
        except ValueError:
            raise durable.TerminalError(
                "the bulk job's ids are not all job ids", code="bad_bulk_action"
            ) from None
        queryset: QuerySet[Job] = Job.objects.filter(id__in=wanted)
    else:
        queryset = console.matching(filters)
    return console.scoped(queryset, user)


def _ask_descendants(state: dict, by: str) -> None:
    """Ask the live descendants of the last chunk's cancelled jobs to cancel, as
    ``service.cancel`` does: outside the chunk's fenced transaction, a page per statement,
    so a tree never adds its rows to the chunk's locks. A walk repeated after a crash asks
    only what is still unasked."""
    for parent_id, tenant, organization in state.get("descend", []):
        service.cancel_descendants(
            parent_id, Scope(tenant=tenant, organization=organization), by=by
        )
    state["descend"] = []


def _count(state: dict, reason: str | None) -> None:
    if reason is None:
        state["changed"] += 1
    else:
        state["refused"][reason] = state["refused"].get(reason, 0) + 1


def _cancel_chunk(chunk: list, by: str, state: dict) -> None:
    """One statement for the chunk; the rows it did not change are counted by why. The
    jobs it asked that have children are kept in ``state["descend"]``, saved with the
    chunk's checkpoint, for ``_ask_descendants`` once the chunk has committed."""

    changed = store.request_cancel_many([(i, t, o) for i, t, o, _, _ in chunk], by=by)
    parents = Job.objects.filter(id__in=changed, children_total__gt=0)
    state["descend"] = [
        [str(parent_id), tenant, organization]
        for parent_id, tenant, organization in parents.values_list(
            "id", "tenant_id", "organization_id"
        )
    ]
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
