"""One operator action on one job, as the admin, its bulk job and the console apply it:
the service function for the action, the permission it needs, and a short reason for
each refusal."""

from __future__ import annotations

from typing import Any

from durable_jobs import service
from durable_jobs.exceptions import DurableJobsError, JobBusy, LockKeyHeld, WrongState
from durable_jobs.states import Scope, Status

#: The kind of the admin's "act on all matching" (and "act on many selected") job.
BULK_KIND = "durable_jobs.bulk_action"

ACTIONS = {
    # action name -> (verb for messages, service call)
    "cancel": (
        "Cancellation requested for",
        lambda job_id, scope, by: service.cancel(job_id, scope=scope, by=by),
    ),
    "redrive": ("Re-drove", lambda job_id, scope, by: service.redrive(job_id, scope=scope)),
    "force_redrive": (
        "Force re-drove",
        lambda job_id, scope, by: service.redrive(job_id, scope=scope, force=True),
    ),
}

#: The permission each action needs, for the user who asks for it (in the admin, and
#: again in the bulk job at run time for the user it records).
PERMISSIONS = {
    "cancel": "durable_jobs.cancel_job",
    "redrive": "durable_jobs.redrive_job",
    "force_redrive": "durable_jobs.force_redrive_job",
}


BUSY = "busy (a worker held the row); try again"


def may(user: Any, action: str) -> bool:
    """Whether ``user`` holds the permission ``action`` needs (an unknown action: no)."""
    permission = PERMISSIONS.get(action)
    return bool(permission and user is not None and user.has_perm(permission))


def requester(user: Any) -> str:
    """How an action by ``user`` is recorded (``cancelled_by``, ``created_by``)."""
    return f"admin:{user.get_username()}"[:200]


def user_ref(user: Any) -> Any:
    """The requesting user's primary key as a bulk job's input records it (JSON)."""
    return user.pk if isinstance(user.pk, (int, str)) else str(user.pk)


def apply_action(
    action: str, job_id: object, scope: Scope, by: str, *, user: Any, kind: str | None = None
) -> tuple[str, str] | None:
    """Apply one console action to one job; None when it changed, else ``(reason, message)``.

    ``user`` is who asks, ``kind`` the job's kind (a bulk job is re-driven on behalf of
    the operator who re-drives it, and only by one who may run its own action). The
    reason leaves out the job's id, so equal refusals count together; the message is
    the error's own. Shared by the admin (selected rows) and the bulk-action job.
    """
    if not may(user, action):
        return f"needs the {PERMISSIONS.get(action, action)} permission", action
    try:
        if kind == BULK_KIND and action in ("redrive", "force_redrive"):
            return redrive_bulk(job_id, scope, user=user, force=action == "force_redrive")
        ACTIONS[action][1](job_id, scope, by)
    except JobBusy as error:
        # A worker's transaction holds the row: the action waited a bounded time and gave up.
        return BUSY, str(error)
    except DurableJobsError as error:
        return reason_for(error), str(error)
    return None


def redrive_bulk(job_id: object, scope: Scope, *, user: Any, force: bool) -> tuple[str, str] | None:
    """Re-drive a bulk job for ``user``: refused unless ``user`` may run its action.

    A failed bulk job is not re-issued as it is (its input names who asked for it, and
    the worker would act on their authority): a new bulk job takes over its cursor and
    counts, recording ``user`` as the one who asked, and the failed one stays as the
    record of the first run. A second re-drive of the same failure returns that new job
    (its idempotency key names the failed job and its redrive count). A bulk job that is
    not failed goes through the service as any job does (an orphan is taken over; the
    handler re-checks its recorded user at run time).
    """
    job = service.get(job_id, scope=scope)
    spec = job.input if isinstance(job.input, dict) else {}
    wanted = spec.get("action")
    if not may(user, str(wanted)):
        permission = PERMISSIONS.get(str(wanted), f"an unknown action {wanted!r}")
        return (
            f"re-driving a bulk job that would {str(wanted).replace('_', ' ')} needs the "
            f"{permission} permission",
            f"job {job.id}",
        )
    if job.status != Status.FAILED.value:
        service.redrive(job.id, scope=scope, force=force)
        return None
    if "unrecoverable" in (job.error_class, job.error_code) and not force:
        raise WrongState(
            job.id, job.status, "redrive", "it failed as unrecoverable; re-drive with force"
        )
    by = requester(user)
    service.start(
        BULK_KIND,
        input={
            **spec,
            "by": by,
            "user_id": user_ref(user),
            "resume_of": str(job.id),
            "created_before": spec.get("created_before") or job.created_at.isoformat(),
            "resume_state": job.checkpoint,
        },
        scope=scope,
        total_count=job.total_count,
        created_by=by,
        idempotency_key=f"bulk-redrive:{job.id}:{job.redrives}",
    )
    return None


def reason_for(error: DurableJobsError) -> str:
    """A refusal's reason without the job's id, so equal reasons count together."""
    if isinstance(error, WrongState):
        detail = str(error).partition(f"{error.status!r}: ")[2]
        return f"{error.status}" + (f" ({detail})" if detail else "")
    if isinstance(error, LockKeyHeld):
        return "its lock key is held by another live job"
    return str(error)
