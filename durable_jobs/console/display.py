"""How the console shows a job: status badges, progress bars, ages, payloads (pretty,
bounded), and the first few reasons of an explanation."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils.html import format_html, format_html_join

from durable_jobs.models import Job, JobAttempt

if TYPE_CHECKING:
    from django.utils.safestring import SafeString

#: Largest JSON payload shown on the detail page, in characters; beyond it a prefix is
#: shown with a "truncated" marker (a 1 MB input nested 60 deep once made 63 MB of HTML).
PAYLOAD_DISPLAY_LIMIT = 20_000
#: Pretty-printing indents each level: past this multiple of the compact size, compact it is.
_PRETTY_GROWTH_LIMIT = 3


# --- display helpers ---------------------------------------------------------------------

_BADGE_COLOURS = {
    "pending": "#6b7280",
    "running": "#2563eb",
    "completed": "#15803d",
    "failed": "#b91c1c",
    "cancelled": "#92400e",
}


def status_badge(job: Job) -> SafeString:
    colour = _BADGE_COLOURS.get(job.status, "#6b7280")
    return format_html(
        "<span class='dj-status' data-dj-status='{}' "
        "style='background:{};color:#fff;border-radius:3px;"
        "padding:1px 6px;font-size:11px'>{}</span>",
        job.id,
        colour,
        job.status,
    )


def progress_html(job: Job) -> SafeString:
    if job.total_count:
        percent = round(100 * (job.progress or 0))
        return format_html(
            "<progress data-dj-progress='{}' value='{}' max='100' style='width:8em'></progress> "
            "<span data-dj-count='{}'>{}/{}</span>",
            job.id,
            percent,
            job.id,
            job.processed_count,
            job.total_count,
        )
    count = format_html("<span data-dj-count='{}'>{} processed</span>", job.id, job.processed_count)
    if not job.is_live:
        return count
    # Unknown total while live: an indeterminate bar (a progress element without a value).
    return format_html(
        "<progress data-dj-progress='{}' style='width:8em'></progress> {}", job.id, count
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
