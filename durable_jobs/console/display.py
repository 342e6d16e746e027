"""How the console shows a job: status badges, progress bars, ages, payloads (pretty,
bounded), and the first few reasons of an explanation."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils.html import format_html

from durable_jobs.models import Job

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
