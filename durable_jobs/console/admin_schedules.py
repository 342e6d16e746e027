"""The admin's schedules: every schedule with its next and last run, the last job's outcome
and missed ticks; pause, resume and run now through the service functions (never the ORM)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html

from durable_jobs import conf
from durable_jobs.exceptions import DurableJobsError
from durable_jobs.models import Job, Schedule
from durable_jobs.schedules import api

PERMISSION = "durable_jobs.change_schedule_state"


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "kind",
        "expression",
        "zone",
        "state_col",
        "next_col",
        "last_tick_at",
        "last_outcome_col",
        "missed_ticks",
        "catch_up",
    )
    list_filter = ("kind",)
    search_fields = ("=name", "=kind")
    ordering = ("name",)
    list_per_page = 100
    actions = ("pause_selected", "resume_selected", "run_selected_now")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        last = Job.objects.filter(id=OuterRef("last_job_id")).values("status")[:1]
        return super().get_queryset(request).annotate(last_job_status=Subquery(last))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False

    def has_change_schedule_state_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERMISSION)

    @admin.display(description="state")
    def state_col(self, schedule: Schedule) -> str:
        if schedule.removed_at is not None:
            return "removed from code"
        if schedule.paused_at is not None:
            return "paused"
        return "active"

    @admin.display(description="next run", ordering="next_tick_at")
    def next_col(self, schedule: Schedule) -> str:
        if schedule.removed_at is not None or schedule.paused_at is not None:
            return "-"
        return str(schedule.next_tick_at)

    @admin.display(description="last job")
    def last_outcome_col(self, schedule: Schedule) -> str:
        if schedule.last_job_id is None:
            return "-"
        status = getattr(schedule, "last_job_status", None) or "deleted (retention)"
        url = reverse("admin:durable_jobs_job_change", args=[schedule.last_job_id])
        return format_html('<a href="{}">{}</a>', url, status)

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet[Schedule],
        act: Callable[[str], object],
        done: str,
    ) -> None:
        """Act on each selected schedule through the service; say what changed and what was refused."""
        changed, refused = 0, []
        for name in queryset.values_list("name", flat=True):
            try:
                act(name)
            except DurableJobsError as error:
                refused.append(str(error))
                continue
            changed += 1
        if changed:
            self.message_user(request, f"{changed} schedule(s) {done}.", messages.SUCCESS)
        for reason in refused:
            self.message_user(request, reason, messages.WARNING)

    @admin.action(description="Pause selected schedules", permissions=["change_schedule_state"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, api.pause_schedule, "paused")

    @admin.action(description="Resume selected schedules", permissions=["change_schedule_state"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, api.resume_schedule, "resumed from their next tick")

    @admin.action(
        description="Run selected schedules once now", permissions=["change_schedule_state"]
    )
    def run_selected_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, api.run_schedule, "started once now")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Say when a schedule is overdue: no scheduler is firing it (no worker runs)."""
        grace = timedelta(seconds=conf.get().SCHEDULE_GRACE)
        overdue = [v.name for v in api.list_schedules() if v.overdue]
        if overdue and request.method == "GET":
            self.message_user(
                request,
                f"{len(overdue)} schedule(s) overdue by more than {grace}: "
                f"{', '.join(overdue[:10])}; is a worker running?",
                messages.WARNING,
            )
        return super().changelist_view(request, extra_context)
