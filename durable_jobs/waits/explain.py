"""What a held job is waiting for, in plain words: one answer for the admin and the CLI.

``explain_hold(job)`` reads only the row (plus the database's clock, once, when no
``now`` is given). Every word of it that came from a caller is rebuilt here from the
wait grammar (invariant 23): the label is re-derived from ``wait_for`` rather than
copied from the stored ``wait_label`` column, so a row written by anything else cannot
put bytes of its choosing in front of an operator.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from durable_jobs import db
from durable_jobs.waits import grammar

if TYPE_CHECKING:
    from durable_jobs.models import Job


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HoldExplanation:
    """Why a job is held, and what happens next."""

    label: str  # "after 2026-09-01T09:00:00Z + ticket-closed"
    after: datetime | None  # the instant it waits for, if any
    profiles: tuple[str, ...]  # the checks, in the order they run
    held_since: datetime
    held_for: timedelta
    checks: int  # check runs so far
    faults: int  # consecutive "cannot tell" answers
    denials: int  # consecutive pickups refused a check turn (capacity)
    next_check: datetime | None  # when the job is due again (next_run_at)
    next_check_in: timedelta | None
    waiting_on_instant: bool  # True: the next pickup is the instant itself, no check runs
    unreadable: int  # stored conditions this version cannot read (the gate will fail the job)
    summary: str  # all of the above in one sentence


def explain_hold(job: Job, *, now: datetime | None = None) -> HoldExplanation | None:
    """Explain a held job (``JobQuerySet.held()``'s predicate); None for any other job."""
    if job.status != "pending" or job.held_since is None or job.wait_satisfied_at is not None:
        return None
    if now is None:
        now = db.database_now()
    after = grammar.after_instant(job.wait_for)
    profiles = tuple(grammar.profile_names(job.wait_for))
    label = grammar.label(job.wait_for) or "a condition this version cannot read"
    held_for = max(timedelta(0), now - job.held_since)
    next_check = job.next_run_at
    next_in = None if next_check is None else max(timedelta(0), next_check - now)
    on_instant = after is not None and next_check is not None and next_check <= after
    unreadable = len(grammar.unreadable(job.wait_for))
    return HoldExplanation(
        label=label,
        after=after,
        profiles=profiles,
        held_since=job.held_since,
        held_for=held_for,
        checks=job.wait_checks,
        faults=job.wait_faults,
        denials=getattr(job, "wait_denials", 0),
        next_check=next_check,
        next_check_in=next_in,
        waiting_on_instant=on_instant,
        unreadable=unreadable,
        summary=_summary(label, job, held_for, next_check, next_in, on_instant, unreadable),
    )


def _summary(
    label: str,
    job: Job,
    held_for: timedelta,
    next_check: datetime | None,
    next_in: timedelta | None,
    on_instant: bool,
    unreadable: int,
) -> str:
    parts = [
        f"Waiting for {label}, held since {job.held_since:%Y-%m-%d %H:%M:%S %Z} ({_span(held_for)})."
    ]
    if unreadable:
        parts.append(
            f"{unreadable} condition(s) cannot be read by this version: the job will fail "
            "wait_unreadable at its next pickup."
        )
    if job.wait_checks or job.wait_faults:
        parts.append(
            f"{job.wait_checks} check run(s) so far"
            + (f", the last {job.wait_faults} unable to answer" if job.wait_faults else "")
            + "."
        )
    denials = getattr(job, "wait_denials", 0)
    if denials:
        parts.append(
            f"Denied a check turn {denials} time(s) in a row (WAIT_MAX_CONCURRENT_CHECKS)."
        )
    if next_check is not None and next_in is not None:
        what = "Due at its instant" if on_instant else "Next check"
        parts.append(f"{what} {next_check:%Y-%m-%d %H:%M:%S %Z} (in {_span(next_in)}).")
    return " ".join(parts)


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"
