"""One operator action on one job, as the admin, its bulk job and the console apply it:
the service function for the action, and a short reason for each refusal."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_jobs import service
from durable_jobs.exceptions import DurableJobsError, JobBusy, LockKeyHeld, WrongState
from durable_jobs.states import Scope

if TYPE_CHECKING:
    pass


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


BUSY = "busy (a worker held the row); try again"


def apply_action(action: str, job_id: object, scope: Scope, by: str) -> tuple[str, str] | None:
    """Apply one console action to one job; None when it changed, else ``(reason, message)``.

    The reason leaves out the job's id, so equal refusals count together; the message is
    the error's own. Shared by the admin (selected rows) and the bulk-action job.
    """
    try:
        ACTIONS[action][1](job_id, scope, by)
    except JobBusy as error:
        # A worker's transaction holds the row: the action waited a bounded time and gave up.
        return BUSY, str(error)
    except DurableJobsError as error:
        return reason_for(error), str(error)
    return None


def reason_for(error: DurableJobsError) -> str:
    """A refusal's reason without the job's id, so equal reasons count together."""
    if isinstance(error, WrongState):
        detail = str(error).partition(f"{error.status!r}: ")[2]
        return f"{error.status}" + (f" ({detail})" if detail else "")
    if isinstance(error, LockKeyHeld):
        return "its lock key is held by another live job"
    return str(error)
