"""How the console shows a job: status badges, progress bars, ages, payloads (pretty,
bounded), and the first few reasons of an explanation."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from durable_jobs.models import Job, JobAttempt
from durable_jobs.states import Status

if TYPE_CHECKING:
    from django.utils.safestring import SafeString

#: Largest JSON payload shown on the detail page, in characters; beyond it a prefix is
#: shown with a "truncated" marker (a 1 MB input nested 60 deep once made 63 MB of HTML).
PAYLOAD_DISPLAY_LIMIT = 20_000
#: Pretty-printing indents each level: past this multiple of the compact size, compact it is.
_PRETTY_GROWTH_LIMIT = 3


# --- display helpers ---------------------------------------------------------------------

#: What the console calls a job, beside its stored status: a ``running`` row is one of
#: three things to an operator. The words are also the status filter's choices.
WAITING = "waiting"
RUNNING = "running"
LEASE_EXPIRED = "lease expired"
#: Every word ``display_status`` returns, in the order the status filter offers them.
DISPLAY_STATUSES = (
    Status.PENDING.value,
    WAITING,
    RUNNING,
    LEASE_EXPIRED,
    Status.COMPLETED.value,
    Status.FAILED.value,
    Status.CANCELLED.value,
)
_EXPLAINED = {
    WAITING: "stored as running, but no worker holds it: its lease was released (a failed "
    "slice waiting out its backoff, or a claim handed back unstarted at a shutdown) and it "
    "runs again when due",
    LEASE_EXPIRED: "stored as running, but its worker stopped heartbeating: the lease has "
    "expired and the reconciler takes the job over after the orphan grace",
}


def display_status(job: Job, now: datetime | None = None) -> str:
    """Return the one word the console shows for ``job``'s status.

    A stored status other than ``running`` is shown as it is. A ``running`` row is
    ``"waiting"`` when no lease is held (``lease_owner`` is NULL: a failed slice waiting
    out its backoff, a claim released unstarted), ``"lease expired"`` when a lease is held
    but ``lease_expires_at`` is before ``now`` (its worker stopped or stalled; the takeover
    is due), and ``"running"`` otherwise. ``now`` is the database's clock (invariant 2):
    by default the ``db_now`` the admin annotates on every row, else read from the database.
    ``console.live.display_status_q`` is the same definition as a queryset filter.
    """
    if job.status != Status.RUNNING.value:
        return job.status
    if job.lease_owner is None:
        return WAITING
    if now is None:
        now = getattr(job, "db_now", None)
    if now is None:
        from durable_jobs import db  # a row read without the admin's annotation

        now = db.database_now(using=job._state.db or "default")
    if job.lease_expires_at is not None and job.lease_expires_at < now:
        return LEASE_EXPIRED
    return RUNNING


def status_class(word: str) -> str:
    """The badge's CSS class for a display status (``console.css`` colours it)."""
    return "dj-status dj-status-" + word.replace(" ", "-")


def status_badge(job: Job, now: datetime | None = None) -> SafeString:
    word = display_status(job, now)
    return format_html(
        "<span class='{}' data-dj-status='{}' data-dj-live='{}'{}>{}</span>",
        status_class(word),
        job.id,
        "true" if job.is_live else "false",
        format_html(" title='{}'", _EXPLAINED[word]) if word in _EXPLAINED else "",
        word,
    )


#: How many characters of a job id the change list shows (the full id is one click away).
SHORT_ID = 8


def job_id_html(job: Job, url: str) -> SafeString:
    """A job id as the change list shows it: its first ``SHORT_ID`` characters linking to
    the job's page, the full id as the link's title and behind a copy button."""
    full = str(job.id)
    return format_html(
        "<a href='{}' class='dj-id' title='{}'>{}</a>"
        "<button type='button' class='dj-copy' data-dj-copy='{}' title='Copy the full id'"
        " aria-label='Copy the full id {}'>copy</button>",
        url,
        full,
        full[:SHORT_ID],
        full,
        full,
    )


def breakable(text: str) -> SafeString:
    """``text`` escaped, with a line-break opportunity after each ``.``, ``_``, ``:``, ``/``
    and ``-``, so a long kind, subject or scope wraps at a separator, not mid-word."""
    pieces = re.split(r"(?<=[._:/-])", text)
    return format_html_join(mark_safe("<wbr>"), "{}", ((piece,) for piece in pieces if piece))


def subject_html(job: Job, url: str | None) -> SafeString | str:
    """The job's subject, linked to its admin page when ``url`` is given."""
    if not job.subject_type:
        return "-"
    text = breakable(f"{job.subject_type}:{job.subject_id}")
    if url is None:
        return text
    return format_html("<a href='{}' class='dj-subject'>{}</a>", url, text)


def progress_html(job: Job) -> SafeString:
    if job.total_count:
        percent = round(100 * (job.progress or 0))
        return format_html(
            "<progress class='dj-progress' data-dj-progress='{}' value='{}' max='100'></progress> "
            "<span class='dj-count' data-dj-count='{}'>{}/{}</span>",
            job.id,
            percent,
            job.id,
            f"{job.processed_count:,}",
            f"{job.total_count:,}",
        )
    count = format_html(
        "<span class='dj-count' data-dj-count='{}'>{} processed</span>",
        job.id,
        f"{job.processed_count:,}",
    )
    if not job.is_live:
        return count
    # Unknown total while live: an indeterminate bar (a progress element without a value).
    return format_html(
        "<progress class='dj-progress' data-dj-progress='{}'></progress> {}", job.id, count
    )


def format_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def pretty_json(value: Any) -> str:
    """Indented JSON of a payload, capped at PAYLOAD_DISPLAY_LIMIT characters with a marker."""
    if value is None:
        return "-"
    compact = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    text = compact
    if len(compact) <= PAYLOAD_DISPLAY_LIMIT:
        pretty = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
        if len(pretty) <= max(PAYLOAD_DISPLAY_LIMIT, _PRETTY_GROWTH_LIMIT * len(compact)):
            text = pretty
    if len(text) > PAYLOAD_DISPLAY_LIMIT:
        return format_html(
            "<pre style='margin:0;white-space:pre-wrap'>{}</pre>"
            "<p><strong class='dj-truncated'>truncated</strong>:"
            " showing {} of {} characters</p>",
            text[:PAYLOAD_DISPLAY_LIMIT],
            f"{PAYLOAD_DISPLAY_LIMIT:,}",
            f"{len(text):,}",
        )
    return format_html("<pre style='margin:0;white-space:pre-wrap'>{}</pre>", text)


def db_now(job: Job) -> datetime:
    """The database's clock, which ``JobAdmin.get_queryset`` annotates on every row."""
    now: datetime = job.db_now  # type: ignore[attr-defined]  # annotate(db_now=Now())
    return now


def first_few(reasons: list[str]) -> str:
    return "; ".join(reasons[:5]) + (f"; and {len(reasons) - 5} more" if len(reasons) > 5 else "")


# --- attempt history (invariant 32) --------------------------------------------------------

_OUTCOME_COLOURS = {
    "failed": "#b91c1c",
    "time_limit": "#92400e",
    "interrupted": "#6b7280",
    "lease_lost": "#7c3aed",
}


def _stamp(value: datetime | None) -> str:
    return value.isoformat(sep=" ", timespec="milliseconds") if value is not None else "-"


def _took(attempt: JobAttempt) -> str:
    if attempt.started_at is None:
        return "-"
    return format_age((attempt.ended_at - attempt.started_at).total_seconds())


def attempts_html(attempts: Sequence[JobAttempt]) -> SafeString:
    """The job page's attempt history: one row per recorded attempt, newest first as given
    (``console.queries.attempts_of``), each traceback folded in a ``<details>``.

    Every value is escaped: error text and tracebacks come from handlers (and passed the
    REDACT_ERROR hook before they were stored).
    """
    if not attempts:
        return format_html(
            "<p class='dj-attempts-none'>{}</p>",
            "No failed, interrupted or lost slices recorded (a slice that succeeds records none).",
        )
    rows = format_html_join(
        "\n",
        "<tr data-dj-attempt='{}'><td>{}</td>"
        "<td><span style='color:{};font-weight:600'>{}</span></td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                attempt.attempt,
                attempt.attempt,
                _OUTCOME_COLOURS.get(attempt.outcome, "#6b7280"),
                attempt.outcome,
                attempt.worker or "-",
                _stamp(attempt.started_at),
                _stamp(attempt.ended_at),
                _took(attempt),
                " / ".join(part for part in (attempt.error_class, attempt.error_code) if part)
                or "-",
                attempt.error_message or "",
                format_html(
                    "<details><summary>traceback</summary>"
                    "<pre style='white-space:pre-wrap;max-height:30em;overflow:auto'>{}</pre>"
                    "</details>",
                    attempt.traceback,
                )
                if attempt.traceback
                else "",
            )
            for attempt in attempts
        ),
    )
    return format_html(
        "<table class='dj-attempts'><thead><tr><th>#</th><th>outcome</th><th>worker</th>"
        "<th>started</th><th>ended</th><th>took</th><th>class / code</th><th>message</th>"
        "<th></th></tr></thead><tbody>{}</tbody></table>",
        rows,
    )


def job_attempts_html(job: Job, *, limit: int = 20) -> SafeString:
    """The job page's attempt history of ``job`` (already scoped by the page), newest first."""
    from durable_jobs.console import queries  # reads; display itself stays free of SQL

    return attempts_html(queries.attempts_of(job.id, limit=limit, using=job._state.db or "default"))
