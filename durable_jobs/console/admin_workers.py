"""The admin's list of live workers: read-only, what each serves and runs now."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse

from durable_jobs import conf
from durable_jobs.console import workers
from durable_jobs.models import WorkerProcess
from durable_jobs.transports import publishing


@admin.register(WorkerProcess)
class WorkerAdmin(admin.ModelAdmin):
    """Workers whose beat is younger than LEASE_TTL; a stopped or dead one is not listed."""

    list_display = (
        "identity",
        "version",
        "queues_col",
        "slots",
        "execution",
        "started_at",
        "beat_at",
        "running_col",
    )
    ordering = ("host", "pid")
    list_per_page = 100

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Each broker queue's health above the workers serving it (docs/transports.rst)."""
        for found in publishing.health():
            level = messages.INFO if found.reachable else messages.WARNING
            self.message_user(request, publishing.describe(found), level)
        return super().changelist_view(request, extra_context)

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkerProcess]:
        ttl = timedelta(seconds=conf.get().LEASE_TTL)
        return super().get_queryset(request).filter(beat_at__gte=Now() - ttl)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: WorkerProcess | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: WorkerProcess | None = None) -> bool:
        return False

    @admin.display(description="queues")
    def queues_col(self, worker: WorkerProcess) -> str:
        return ", ".join(worker.queues)

    @admin.display(description="running now")
    def running_col(self, worker: WorkerProcess) -> str:
        live = {w.identity: w for w in workers.live_workers()}.get(worker.identity)
        if live is None or not live.running:
            return "idle"
        return ", ".join(f"{kind} x{n}" for kind, n in sorted(live.running.items()))
