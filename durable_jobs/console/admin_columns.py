"""What the job admin shows, column by column and field by field (mixed into ``JobAdmin``).

Each method renders one column of the change list or one read-only field of the job
page from the row alone (and the database clock the admin annotates on it): no method
here writes, and none reads more than its row, so a page of 100 jobs costs the page's
one query.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from durable_jobs.console import explain
from durable_jobs.console import live as console
from durable_jobs.console.display import (
    LEASE_EXPIRED,
    PAYLOAD_DISPLAY_LIMIT,
    breakable,
    db_now,
    format_age,
    job_attempts_html,
    job_id_html,
    pretty_json,
    progress_html,
    status_badge,
    subject_html,
)
from durable_jobs.console.subjects import SUBJECT_URL
from durable_jobs.models import Job
from durable_jobs.states import Status
from durable_jobs.waits import grammar as wait_grammar

if TYPE_CHECKING:
    from django.utils.safestring import SafeString


class JobColumns:
    """The job admin's columns and read-only fields."""

    admin_site: admin.AdminSite

    # --- columns ---
    def action_checkbox(self, obj: Job) -> SafeString:
        # Django renders a form widget through a template per row, a third of the page's
        # time at 50 rows; the same markup, written out.
        return format_html(
            "<input type='checkbox' name='{}' value='{}' class='action-select' "
            "aria-label='Select this object for an action - {}'>",
            ACTION_CHECKBOX_NAME,
            obj.pk,
            obj,
        )

    @admin.display(description="id", ordering="id")
    def id_col(self, job: Job) -> SafeString:
        url = reverse(
            f"{self.admin_site.name}:durable_jobs_job_change",
            args=[job.pk],
            current_app=self.admin_site.name,
        )
        return job_id_html(job, url)

    @admin.display(description="kind", ordering="kind")
    def kind_col(self, job: Job) -> SafeString:
        return breakable(job.kind)

    @admin.display(description="status")
    def status_col(self, job: Job) -> SafeString:
        notes: list[SafeString | str] = []
        if job.error_code:
            notes.append(
                format_html("<small class='dj-note'>{}</small>", breakable(job.error_code))
            )
        if console.is_held(job):
            notes.append(self.held_col(job))
        return format_html(
            "{}{}", status_badge(job), format_html_join("", "<br>{}", ((n,) for n in notes))
        )

    @admin.display(description="progress")
    def progress_col(self, job: Job) -> SafeString:
        return progress_html(job)

    @admin.display(description="subject")
    def subject_col(self, job: Job) -> SafeString | str:
        # The link was worked out for this request's user (``subjects.link_subjects``).
        return subject_html(job, getattr(job, SUBJECT_URL, None))

    @admin.display(description="scope")
    def scope_col(self, job: Job) -> SafeString:
        return breakable(
            job.tenant_id + (f"/{job.organization_id}" if job.organization_id is not None else "")
        )

    @admin.display(description="age")
    def age_col(self, job: Job) -> str:
        return format_age((db_now(job) - job.created_at).total_seconds())

    @admin.display(description="heartbeat")
    def heartbeat_col(self, job: Job) -> str:
        if job.heartbeat_at is None:
            return "-"
        now = db_now(job)
        age = format_age((now - job.heartbeat_at).total_seconds())
        expired = (
            job.status == Status.RUNNING.value
            and job.lease_owner is not None
            and job.lease_expires_at is not None
            and job.lease_expires_at < now
        )
        if expired:
            # The badge says "lease expired"; the age of the last beat is marked with it.
            return format_html(
                "<span class='dj-lease-expired' title='{}'>{}</span>", LEASE_EXPIRED, age
            )
        return age

    @admin.display(description=mark_safe("seq /<wbr> redrives /<wbr> fails"))
    def attempts_col(self, job: Job) -> str:
        return f"{job.continuation_seq} / {job.redrives} / {job.consecutive_failures}"

    @admin.display(description="held by")
    def held_col(self, job: Job) -> SafeString | str:
        if not console.is_held(job):
            return "-"
        return format_html(
            "<span class='dj-held'>{}</span>",
            # Rebuilt from the validated conditions, never the stored label (invariant 23).
            wait_grammar.label(job.wait_for) or "a condition this version cannot read",
        )

    # --- detail ---
    @admin.display(description="why isn't it running?")
    def why_not_running(self, job: Job) -> str:
        reasons = explain.explain(job, now=getattr(job, "db_now", None))
        if not reasons:
            return "It is running."
        return format_html(
            "<ul class='dj-why' style='margin:0'>{}</ul>",
            format_html_join("", "<li>{}</li>", ((r,) for r in reasons)),
        )

    @admin.display(description="timeline")
    def timeline(self, job: Job) -> SafeString:
        points = [
            (getattr(job, name), label)
            for name, label in (
                ("created_at", "created"),
                ("held_since", "held by a wait"),
                ("wait_satisfied_at", "wait satisfied"),
                ("started_at", "first slice started"),
                ("last_committed_at", "last committed unit"),
                ("heartbeat_at", "last heartbeat"),
                ("cancel_requested_at", "cancellation requested"),
                ("parked_at", "parked"),
                ("finished_at", "finished"),
                ("domain_mirrored_at", "outcome mirrored"),
                ("updated_at", "row last changed"),
            )
            if getattr(job, name) is not None
        ]
        points.sort(key=lambda point: point[0])
        return format_html(
            "<ol class='dj-timeline' style='margin:0'>{}</ol>",
            format_html_join(
                "",
                "<li><code>{}</code> {}</li>",
                ((f"{at:%Y-%m-%d %H:%M:%S.%f}"[:-3] + f" {at:%Z}", label) for at, label in points),
            ),
        )

    @admin.display(description="attempts (newest first)")
    def attempt_history(self, job: Job) -> str:
        return job_attempts_html(job)

    @admin.display(description="error message")
    def error_message_capped(self, job: Job) -> str:
        if not job.error_message:
            return "-"
        if len(job.error_message) > PAYLOAD_DISPLAY_LIMIT:
            return format_html(
                "<pre style='white-space:pre-wrap'>{}</pre><strong class='dj-truncated'>truncated"
                "</strong>",
                job.error_message[:PAYLOAD_DISPLAY_LIMIT],
            )
        return format_html("<pre style='white-space:pre-wrap;margin:0'>{}</pre>", job.error_message)

    @admin.display(description="input")
    def input_pretty(self, job: Job) -> str:
        return pretty_json(job.input)

    @admin.display(description="checkpoint")
    def checkpoint_pretty(self, job: Job) -> str:
        return pretty_json(job.checkpoint)

    @admin.display(description="meta")
    def meta_pretty(self, job: Job) -> str:
        return pretty_json(job.meta)

    @admin.display(description="result")
    def result_pretty(self, job: Job) -> str:
        return pretty_json(job.result)

    @admin.display(description="wait for")
    def wait_for_pretty(self, job: Job) -> str:
        return pretty_json(job.wait_for)
