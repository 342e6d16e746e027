"""The admin's paused queues: see what is paused, pause a queue, resume the selected ones.

Every change goes through ``queues.pause_queue`` / ``queues.resume_queue`` (the same
calls as code and ``manage.py durable_jobs pause``), never an ORM write; both need the
``durable_jobs.pause_queue`` permission. Seeing the list needs ``view_pausedqueue``.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest

from durable_jobs import conf, queues, validation
from durable_jobs.exceptions import InvalidInput
from durable_jobs.models import Job, PausedQueue
from durable_jobs.states import LIVE_STATUSES

PERMISSION = "durable_jobs.pause_queue"


class PauseForm(forms.ModelForm):
    """Pause one queue: its name (checked as ``pause_queue`` checks it) and a reason."""

    class Meta:
        model = PausedQueue
        fields = ("queue_name", "reason")

    def clean_queue_name(self) -> str:
        queue = self.cleaned_data["queue_name"]
        try:
            validation.name("queue", queue)
        except InvalidInput as error:
            raise forms.ValidationError(error.detail) from None
        undeclared = conf.undeclared_queue(queue, conf.get())
        if undeclared is not None:
            raise forms.ValidationError(undeclared)
        return str(queue)


@admin.register(PausedQueue)
class PausedQueueAdmin(admin.ModelAdmin):
    """Paused queues (invariant 27): no worker claims from one until it is resumed."""

    form = PauseForm
    list_display = ("queue_name", "paused_at", "paused_by", "reason", "backlog_col")
    actions = ["resume_selected"]
    list_per_page = 100

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERMISSION)

    def has_change_permission(self, request: HttpRequest, obj: PausedQueue | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: PausedQueue | None = None) -> bool:
        return False

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERMISSION)

    def save_model(self, request: HttpRequest, obj: PausedQueue, form: Any, change: bool) -> None:
        """Pause through the service (never ``obj.save()``); say so if it already was."""
        pause = queues.pause_queue(
            obj.queue_name, reason=obj.reason or None, by=request.user.get_username() or None
        )
        obj.paused_at, obj.paused_by = pause.paused_at, pause.paused_by
        if not pause.newly_paused:
            self.message_user(
                request, f"{pause.queue} was already paused; the first pause is kept", messages.INFO
            )

    @admin.action(description="Resume the selected queues", permissions=["pause"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[PausedQueue]) -> None:
        resumed = [
            paused.queue_name
            for paused in queryset
            if queues.resume_queue(paused.queue_name) is not None
        ]
        self.message_user(
            request,
            f"Resumed {len(resumed)} queue(s): {', '.join(resumed) or '-'}; idle workers were woken.",
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[PausedQueue]:
        # The backlog as `durable_jobs queues` counts it: rows a claim could take, read
        # off the deliverable index; one small subquery per paused queue listed.
        waiting = (
            Job.objects.filter(
                queue_name=OuterRef("queue_name"),
                status__in=LIVE_STATUSES,
                lease_owner__isnull=True,
                next_run_at__isnull=False,
            )
            .order_by()
            .values("queue_name")
            .annotate(n=Count("id"))
            .values("n")
        )
        return super().get_queryset(request).annotate(backlog=Coalesce(Subquery(waiting), 0))

    @admin.display(description="waiting to be claimed", ordering="backlog")
    def backlog_col(self, paused: PausedQueue) -> int:
        return int(getattr(paused, "backlog", 0))


def warn_paused(request: HttpRequest) -> None:
    """Say on the job list which queues are paused: their jobs wait, on purpose."""
    for pause in queues.paused_queues():
        messages.warning(
            request,
            f"Queue {pause.queue!r} is paused since {pause.paused_at:%Y-%m-%d %H:%M:%S %Z} by "
            f"{pause.paused_by or 'an unnamed operator'}: {pause.reason or 'no reason given'}. "
            "No worker claims its jobs until it is resumed.",
        )
