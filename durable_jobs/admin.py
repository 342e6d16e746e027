"""The operators' view: progress, filters, pretty JSON, and cancel / redrive / force redrive.

Read-only over the ORM; every action calls the same service functions as code and the
command line, and reports how many jobs changed and how many were refused, and why.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.utils.html import format_html

from durable_jobs import service
from durable_jobs.exceptions import DurableJobsError, JobBusy
from durable_jobs.models import Job
from durable_jobs.states import Scope


class ParkedFilter(admin.SimpleListFilter):
    title = "parked"
    parameter_name = "parked"

    def lookups(self, request, model_admin):
        return [("yes", "parked (needs an operator)"), ("no", "not parked")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(parked_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(parked_at__isnull=True)
        return queryset


def _pretty(value) -> str:
    if value is None:
        return "-"
    return format_html("<pre style='margin:0'>{}</pre>", json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def _first_few(reasons: list[str]) -> str:
    return "; ".join(reasons[:5]) + (f"; and {len(reasons) - 5} more" if len(reasons) > 5 else "")


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "status", "progress_bar", "tenant_id", "organization_id", "error_code",
                    "created_at", "updated_at")
    list_filter = ("status", ParkedFilter, "kind", "queue_name", "error_class", "tenant_id")
    search_fields = ("=id", "=lock_key", "=idempotency_key", "=subject_id", "kind")
    date_hierarchy = None
    ordering = ("-created_at",)
    list_per_page = 50
    # Large tables: never count the whole table for the change list.
    show_full_result_count = False
    actions = ["cancel_jobs", "redrive_jobs", "force_redrive_jobs"]
    readonly_fields = ("progress_bar", "input_pretty", "checkpoint_pretty", "meta_pretty", "result_pretty",
                       "wait_for_pretty")
    fieldsets = [
        (None, {"fields": ("id", "kind", "status", "progress_bar", "tenant_id", "organization_id",
                           "subject_type", "subject_id", "created_by", "created_at", "updated_at")}),
        ("Payload", {"fields": ("input_pretty", "checkpoint_pretty", "meta_pretty", "result_pretty")}),
        ("Outcome", {"fields": ("error_class", "error_code", "error_message", "started_at", "finished_at",
                                "parked_at", "cancel_requested_at", "cancelled_by", "domain_mirrored_at")}),
        ("Keys", {"fields": ("lock_key", "idempotency_key", "queue_name", "priority")}),
        ("Lease and delivery", {"classes": ("collapse",), "fields": (
            "lease_owner", "lease_epoch", "lease_expires_at", "heartbeat_at", "continuation_seq", "redrives",
            "next_run_at", "pending_since")}),
        ("Budgets", {"classes": ("collapse",), "fields": (
            "consecutive_failures", "redrives_since_commit", "interruptions", "mirror_attempts",
            "last_committed_at")}),
        ("Wait", {"classes": ("collapse",), "fields": ("wait_for_pretty", "wait_key", "wait_label", "held_since",
                                                       "wait_checks", "wait_faults", "wait_satisfied_at")}),
    ]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if hasattr(admin, "ShowFacets"):
            self.show_facets = admin.ShowFacets.NEVER

    # --- read-only: the ORM never writes a job row ---
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_cancel_permission(self, request):
        return request.user.has_perm("durable_jobs.cancel_job")

    def has_redrive_permission(self, request):
        return request.user.has_perm("durable_jobs.redrive_job")

    def has_force_redrive_permission(self, request):
        return request.user.has_perm("durable_jobs.force_redrive_job")

    # --- display ---
    @admin.display(description="progress")
    def progress_bar(self, job: Job):
        if job.total_count:
            percent = round(100 * (job.progress or 0))
            return format_html(
                "<progress value='{}' max='100' style='width:8em'></progress> {}/{}",
                percent, job.processed_count, job.total_count,
            )
        return f"{job.processed_count} processed"

    @admin.display(description="input")
    def input_pretty(self, job: Job):
        return _pretty(job.input)

    @admin.display(description="checkpoint")
    def checkpoint_pretty(self, job: Job):
        return _pretty(job.checkpoint)

    @admin.display(description="meta")
    def meta_pretty(self, job: Job):
        return _pretty(job.meta)

    @admin.display(description="result")
    def result_pretty(self, job: Job):
        return _pretty(job.result)

    @admin.display(description="wait for")
    def wait_for_pretty(self, job: Job):
        return _pretty(job.wait_for)

    # --- actions: service functions, a count of what changed and what was refused ---
    def _apply(self, request, queryset, verb: str, action) -> None:
        done, refused, busy = 0, [], []
        for job in queryset:
            scope = Scope(tenant=job.tenant_id, organization=job.organization_id)
            try:
                action(job, scope)
                done += 1
            except JobBusy as error:
                # A worker's transaction holds the row: the action waited a bounded time
                # and gave up, so the page answers instead of hanging.
                busy.append(str(error))
            except DurableJobsError as error:
                refused.append(str(error))
        if done:
            self.message_user(request, f"{verb} {done} job(s).", messages.SUCCESS)
        if refused:
            self.message_user(request, f"Refused {len(refused)}: {_first_few(refused)}", messages.WARNING)
        if busy:
            self.message_user(request, f"Busy, not changed, try again: {len(busy)}: {_first_few(busy)}",
                              messages.WARNING)

    @admin.action(description="Request cancellation", permissions=["cancel"])
    def cancel_jobs(self, request, queryset):
        by = f"admin:{request.user.get_username()}"[:200]
        self._apply(request, queryset, "Cancellation requested for",
                    lambda job, scope: service.cancel(job.id, scope=scope, by=by))

    @admin.action(description="Re-drive failed jobs", permissions=["redrive"])
    def redrive_jobs(self, request, queryset):
        self._apply(request, queryset, "Re-drove", lambda job, scope: service.redrive(job.id, scope=scope))

    @admin.action(description="Force re-drive (also unrecoverable)", permissions=["force_redrive"])
    def force_redrive_jobs(self, request, queryset):
        self._apply(request, queryset, "Force re-drove",
                    lambda job, scope: service.redrive(job.id, scope=scope, force=True))
