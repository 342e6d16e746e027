"""The operators' console: a change list that stays fast on millions of rows, a grouped
detail page that says why a job is not running, live progress, and confirmed actions.

Read-only over the ORM; every action calls the same service functions as code and the
command line, and reports how many jobs changed and how many were refused, and why.
Acting on "all N matching" starts a durable job of this app (``durable_jobs.bulk_action``)
that works through the matches in fenced chunks, so the request returns at once.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.views.main import ChangeList
from django.db import DatabaseError, ProgrammingError, connections, router, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from durable_jobs import conf, service
from durable_jobs.console import admin_queues, changelist, workflow_panel
from durable_jobs.console import live as console
from durable_jobs.console.actions import (
    ACTIONS,
    BULK_KIND,
    BUSY,
    PERMISSIONS,
    apply_action,
    requester,
    user_ref,
)
from durable_jobs.console.admin_columns import JobColumns
from durable_jobs.console.changelist import (
    ConsoleChangeList,
    ConsolePaginator,
    Estimate,
    HeldFilter,
    KindFilter,
    LeaseExpiredFilter,
    OrganizationFilter,
    ParkedFilter,
    QueueFilter,
    StatusFilter,
    TenantFilter,
)
from durable_jobs.console.display import (
    display_status,
    first_few,
)
from durable_jobs.console.subjects import link_subjects
from durable_jobs.models import Job, newest_first
from durable_jobs.states import Scope, Status

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldOpts, _FieldsetSpec
    from django.urls import URLPattern
    from django.utils.functional import _StrOrPromise

#: Most jobs the live-progress view answers for in one poll.
LIVE_MAX_IDS = 200
__all__ = ["BULK_KIND", "LIVE_MAX_IDS", "JobAdmin"]
_LIST_DEFERRED = ("input", "checkpoint", "meta", "result", "wait_for", "error_message")
#: What the admin's job pages say on a database ``migrate`` has not brought up to date.
MISSING_TABLES = "durable_jobs' tables are missing: run python manage.py migrate"


def _missing_tables(using: str) -> list[str]:
    """durable_jobs' tables the database ``using`` lacks (empty once migrated)."""
    # Django's schema introspection (its own catalogue read), not SQL of this app's.
    present = set(connections[using].introspection.table_names())
    wanted = [model._meta.db_table for model in apps.get_app_config("durable_jobs").get_models()]
    return [table for table in wanted if table not in present]


@admin.register(Job)
class JobAdmin(JobColumns, admin.ModelAdmin):
    # Fits a 1366 px laptop beside the filters: a short id, values that wrap at their
    # separators, and the error code and the wait's label under the status badge.
    list_display = (
        "id_col",
        "kind_col",
        "status_col",
        "progress_col",
        "subject_col",
        "scope_col",
        "age_col",
        "heartbeat_col",
        "attempts_col",
    )
    list_display_links = None  # the id column links itself, beside its copy button
    list_filter = (
        StatusFilter,
        KindFilter,
        QueueFilter,
        ParkedFilter,
        LeaseExpiredFilter,
        HeldFilter,
        TenantFilter,
        OrganizationFilter,
    )
    search_fields = (
        "id",
    )  # served by get_search_results (exact, index-served), not by Django's icontains
    search_help_text = (
        "Exact job id, idempotency key, lock key or subject id, or the start of a kind."
    )
    date_hierarchy = None
    ordering = ("-created_at", "-id")
    list_per_page = 50
    list_max_show_all = 0  # "show all" on a million rows is never what anyone wants
    # Large tables: never count the whole table for the change list.
    show_full_result_count = False
    paginator = ConsolePaginator
    actions = ("cancel_jobs", "redrive_jobs", "force_redrive_jobs")
    readonly_fields = (
        "status_col",
        "progress_col",
        "why_not_running",
        "timeline",
        "subject_col",
        "scope_col",
        "input_pretty",
        "checkpoint_pretty",
        "meta_pretty",
        "result_pretty",
        "wait_for_pretty",
        "error_message_capped",
        "attempt_history",
        "held_col",
        "workflow",
    )

    class Media:
        css = {"all": ("durable_jobs/console.css",)}
        js = ("durable_jobs/console.js",)

    # Facet counts would count the whole table once per filter choice (Django 5.0+).
    show_facets = admin.ShowFacets.NEVER

    # --- read-only: the ORM never writes a job row ---
    @admin.display(description="workflow")
    def workflow(self, job: Job) -> str:
        return workflow_panel.workflow_html(job)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERMISSIONS["cancel"])

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERMISSIONS["redrive"])

    def has_force_redrive_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERMISSIONS["force_redrive"])

    # --- queries ---
    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        # The database's clock rides along with every row: ages are measured on it.
        # ADMIN_SCOPE narrows it here, so the list, the detail page, every action and the
        # live view see only what this user may (the bulk job narrows again at run time).
        queryset = console.scoped(super().get_queryset(request), request.user)
        queryset = queryset.annotate(db_now=Now())
        match = getattr(request, "resolver_match", None)
        if match is None or match.url_name != "durable_jobs_job_change":
            # Lists never show payloads: fifty 1 MB inputs are not read to draw a table.
            queryset = queryset.defer(*_LIST_DEFERRED)
        return queryset

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        return console.search(queryset, search_term), False

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> _FieldsetSpec:
        groups: list[tuple[_StrOrPromise | None, _FieldOpts]] = []
        if obj is not None and obj.status in (Status.PENDING.value, Status.RUNNING.value):
            groups.append(("Why isn't it running?", {"fields": ("why_not_running",)}))
        groups.append(
            (
                "Identity and scope",
                {
                    "fields": (
                        "id",
                        "kind",
                        "status_col",
                        "progress_col",
                        "scope_col",
                        "subject_col",
                        "created_by",
                        "queue_name",
                        "priority",
                        "lock_key",
                        "idempotency_key",
                    )
                },
            ),
        )
        if obj is None or any(
            (
                obj.error_class,
                obj.error_code,
                obj.error_message,
                obj.parked_at,
                obj.cancel_requested_at,
            )
        ):
            groups.append(
                (
                    "Error",
                    {
                        "fields": (
                            "error_class",
                            "error_code",
                            "error_message_capped",
                            "parked_at",
                            "cancel_requested_at",
                            "cancelled_by",
                        )
                    },
                )
            )
        if obj is not None and workflow_panel.has_workflow(obj):
            groups.append(("Workflow", {"fields": ("workflow",)}))
        # Every failed, interrupted, timed-out or lost slice, newest first (invariant 32).
        groups.append(("Attempts", {"fields": ("attempt_history",), "classes": ("collapse",)}))
        groups += [
            ("Timeline", {"fields": ("timeline",)}),
            (
                "Payloads",
                {"fields": ("input_pretty", "checkpoint_pretty", "meta_pretty", "result_pretty")},
            ),
            (
                "Lease and delivery",
                {
                    "fields": (
                        "lease_owner",
                        "lease_epoch",
                        "lease_expires_at",
                        "heartbeat_at",
                        "continuation_seq",
                        "redrives",
                        "next_run_at",
                        "pending_since",
                        "queue_job_id",
                    )
                },
            ),
            (
                "Budgets and counters",
                {
                    "fields": (
                        "processed_count",
                        "total_count",
                        "consecutive_failures",
                        "redrives_since_commit",
                        "interruptions",
                        "mirror_attempts",
                        "park_mirror_attempts",
                        "last_committed_at",
                    )
                },
            ),
            (
                "Wait",
                {
                    "fields": (
                        "held_col",
                        "wait_for_pretty",
                        "wait_key",
                        "wait_label",
                        "held_since",
                        "wait_checks",
                        "wait_faults",
                        "wait_satisfied_at",
                    )
                },
            ),
        ]
        return groups

    # --- per-request reads: subject links, the job page's buttons, a missing schema ---
    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ConsoleChangeList

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        changelist_ = super().get_changelist_instance(request)
        link_subjects(self.admin_site, request, changelist_.result_list)
        return changelist_

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Job | None:
        job = super().get_object(request, object_id, from_field)
        if job is not None:
            link_subjects(self.admin_site, request, [job])
        return job

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Job | None = None,
    ) -> HttpResponse:
        context["job_actions"] = [] if obj is None else self._job_page_actions(request, obj)
        if obj is not None:
            # The heading and the breadcrumb name the status as the badge does.
            context["subtitle"] = f"{obj.kind} {obj.id} ({display_status(obj)})"
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _job_page_actions(self, request: HttpRequest, job: Job) -> list[tuple[str, str]]:
        """The list actions this user may apply to ``job`` from its page: (name, title).

        Offered by the same rule as the list (``get_actions``: the action's permission)
        and posted to the list's action endpoint, so the confirmation, the service call
        and the refusals are the list action's own.
        """
        offered = self.get_actions(request)
        wanted = []
        if job.is_live and job.cancel_requested_at is None:
            wanted.append("cancel_jobs")
        if job.status == Status.FAILED.value:
            wanted.append("redrive_jobs")
            if "unrecoverable" in (job.error_class, job.error_code):
                wanted.append("force_redrive_jobs")
        found = [(name, offered.get(name)) for name in wanted]
        # Django 6.1's actions are objects with a description; 5.2's are (func, name,
        # description) tuples, whose indexing 6.1 deprecates.
        return [
            (name, str(getattr(entry, "description", None) or entry[2]))
            for name, entry in found
            if entry is not None
        ]

    def _from_job(self, request: HttpRequest) -> str | None:
        """The job whose page asked for this action (its only selected job), if any."""
        raw = request.POST.get("from_job", "")
        selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
        try:
            wanted = str(uuid.UUID(raw))
        except ValueError:
            return None
        return wanted if selected == [wanted] or selected == [raw] else None

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        def view() -> HttpResponse:
            if request.method == "GET":
                admin_queues.warn_paused(request)  # invariant 27: their jobs are not claimed
            return super(JobAdmin, self).changelist_view(request, extra_context)

        return self._unless_schema_missing(request, view)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        return self._unless_schema_missing(
            request,
            lambda: super(JobAdmin, self).change_view(request, object_id, form_url, extra_context),
        )

    def _unless_schema_missing(
        self, request: HttpRequest, view: Callable[[], HttpResponse]
    ) -> HttpResponse:
        """Run ``view``; before ``migrate``, one clear page instead of a ProgrammingError.

        A read (GET) is rendered here, in a savepoint: its columns and the attempt history
        read the database while rendering, and the savepoint keeps the connection usable
        after a failed read, to find out whether the tables are there. An action (POST) is
        not wrapped: each job's action commits on its own, as from code.
        """
        using = router.db_for_read(Job)
        reading = request.method in ("GET", "HEAD")
        try:
            with transaction.atomic(using=using) if reading else contextlib.nullcontext():
                response = view()
                if reading and isinstance(response, TemplateResponse):
                    response.render()
        except ProgrammingError:
            try:
                missing = _missing_tables(using)
            except DatabaseError:
                missing = []  # the transaction is aborted: not ours to diagnose
            if not missing:
                raise
            context = {
                **self.admin_site.each_context(request),
                "title": "durable_jobs' tables are missing",
                "opts": self.model._meta,
                "missing": missing,
                "database": using,
            }
            return TemplateResponse(
                request, "admin/durable_jobs/job/missing_tables.html", context, status=503
            )
        return response

    # --- live progress: a JSON view under the admin's own permission checks ---
    def get_urls(self) -> list[URLPattern]:
        return [
            path("live/", self.admin_site.admin_view(self.live_view), name="durable_jobs_job_live"),
            *super().get_urls(),
        ]

    def live_view(self, request: HttpRequest) -> JsonResponse:
        if not self.has_view_permission(request):
            return JsonResponse({"error": "permission denied"}, status=403)
        using = router.db_for_read(Job)
        try:
            with transaction.atomic(using=using):
                return self._live(request)
        except ProgrammingError:
            if not _missing_tables(using):
                raise
            return JsonResponse({"error": MISSING_TABLES}, status=503)

    def _live(self, request: HttpRequest) -> JsonResponse:
        ids = []
        for raw in request.GET.getlist("id")[:LIVE_MAX_IDS]:
            try:
                ids.append(uuid.UUID(raw))
            except ValueError:
                return JsonResponse({"error": "not a job id"}, status=400)
        jobs = {}
        for job in self.get_queryset(request).filter(pk__in=ids):
            jobs[str(job.id)] = {
                # The badge's word (display_status), and the row's own for scripts.
                "status": display_status(job),
                "stored_status": job.status,
                "processed": job.processed_count,
                "total": job.total_count,
                "percent": None if job.progress is None else round(100 * job.progress),
                "live": job.is_live,
            }
        return JsonResponse({"jobs": jobs})

    # --- actions: a confirmation page, then service functions and a count ---
    def _confirm_or_apply(
        self, request: HttpRequest, queryset: QuerySet[Job], action: str, title: str
    ) -> HttpResponse | None:
        by = requester(request.user)
        select_across = request.POST.get("select_across") == "1"
        if request.POST.get("confirm") != "yes":
            if select_across:
                count, exact = console.estimate_count(
                    queryset, exact_below=changelist.EXACT_COUNT_BELOW
                )
            else:
                count, exact = queryset.count(), True
            context = {
                **self.admin_site.each_context(request),
                "title": title,
                "opts": self.model._meta,
                "action": f"{action}_jobs",
                "action_title": title,
                "count": count if exact else Estimate(count),
                "select_across": select_across,
                "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
                "sample": [(job, display_status(job)) for job in newest_first(queryset, 0, 10)],
                "index": request.POST.get("index", "0"),
                "from_job": self._from_job(request),
            }
            return TemplateResponse(request, "admin/durable_jobs/job/confirm_action.html", context)
        back = self._from_job(request)
        if select_across:
            self._start_bulk(request, queryset, action, by)
            return None
        self._apply_selected(request, queryset, action, by)
        if back is not None:
            return HttpResponseRedirect(
                reverse(f"{self.admin_site.name}:durable_jobs_job_change", args=[back])
            )
        return None

    def _apply_selected(
        self, request: HttpRequest, queryset: QuerySet[Job], action: str, by: str
    ) -> None:
        """Apply ``action`` to the selected jobs one by one, and say what changed."""
        rows = list(queryset.values_list("id", "tenant_id", "organization_id", "kind"))
        if len(rows) > conf.get().ADMIN_ACTION_MAX_ROWS:
            # Past the bound one request would hold the operator (and a server thread) for
            # seconds: the same background job as "all matching", over exactly these ids.
            self._start_bulk(request, queryset, action, by, ids=[row[0] for row in rows])
            return
        done = 0
        refused: Counter[str] = Counter()
        busy: list[str] = []
        for job_id, tenant, organization, kind in rows:
            refusal = apply_action(
                action,
                job_id,
                Scope(tenant=tenant, organization=organization),
                by,
                user=request.user,
                kind=kind,
            )
            if refusal is None:
                done += 1
            elif refusal[0] == BUSY:
                busy.append(refusal[1])
            else:
                refused[refusal[0]] += 1
        verb = ACTIONS[action][0]
        self.message_user(
            request, f"{verb} {done} job(s).", messages.SUCCESS if done else messages.INFO
        )
        if refused:
            reasons = [f"{n} × {reason}" for reason, n in refused.most_common()]
            self.message_user(
                request, f"Refused {sum(refused.values())}: {first_few(reasons)}", messages.WARNING
            )
        if busy:
            self.message_user(
                request,
                f"Busy, not changed, try again: {len(busy)}: {first_few(busy)}",
                messages.WARNING,
            )

    def _start_bulk(
        self,
        request: HttpRequest,
        queryset: QuerySet[Job],
        action: str,
        by: str,
        *,
        ids: list[uuid.UUID] | None = None,
    ) -> None:
        """Start the bulk job on behalf of this user: over the list's filters, or ``ids``."""
        spec: dict[str, Any] = {"action": action, "by": by, "user_id": user_ref(request.user)}
        if ids is None:
            spec["filters"] = {
                name: request.GET[name] for name in console.PARAMETERS if request.GET.get(name)
            }
            count, _ = console.estimate_count(queryset, exact_below=changelist.EXACT_COUNT_BELOW)
            what = f"all {count:,} matching jobs"
        else:
            spec["ids"] = [str(i) for i in ids]
            count = len(ids)
            what = f"the {count:,} selected jobs"
        job = service.start(BULK_KIND, input=spec, total_count=count, created_by=by)
        url = reverse("admin:durable_jobs_job_change", args=[job.id])
        self.message_user(
            request,
            format_html(
                "Started a background job to {} {}: <a href='{}'>{}</a> "
                "(progress, counts and refusals appear there; cancel it to stop).",
                action.replace("_", " "),
                what,
                url,
                job.id,
            ),
            messages.SUCCESS,
        )

    @admin.action(description="Request cancellation", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        return self._confirm_or_apply(request, queryset, "cancel", "Request cancellation")

    @admin.action(description="Re-drive failed jobs", permissions=["redrive"])
    def redrive_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        return self._confirm_or_apply(request, queryset, "redrive", "Re-drive failed jobs")

    @admin.action(description="Force re-drive (also unrecoverable)", permissions=["force_redrive"])
    def force_redrive_jobs(
        self, request: HttpRequest, queryset: QuerySet[Job]
    ) -> HttpResponse | None:
        return self._confirm_or_apply(
            request, queryset, "force_redrive", "Force re-drive (also unrecoverable)"
        )
