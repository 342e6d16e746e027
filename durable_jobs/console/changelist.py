"""The admin change list's parts that stay fast on millions of rows: an estimated count
past ``EXACT_COUNT_BELOW``, bounded paging, and filters that all go through
``console.live.apply`` (which the bulk action reuses, so "all N matching" means what the
list shows)."""

from __future__ import annotations

import math
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import EmptyPage, Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

from durable_jobs import conf
from durable_jobs.console import live as console
from durable_jobs.console.display import DISPLAY_STATUSES, LEASE_EXPIRED
from durable_jobs.models import Job, merged_in_order

#: Count exactly when the planner expects fewer rows than this; estimate beyond it.
EXACT_COUNT_BELOW = 10_000
#: Deepest page the change list serves (a filter narrows further than paging can).
MAX_PAGES = 200


# --- the change list's count and paging -------------------------------------------------


class Estimate(int):
    """A row count that is the planner's estimate; prints as one."""

    def __str__(self) -> str:
        return f"about {int(self):,}"


class ConsolePaginator(Paginator):
    """Counts from the planner unless the answer is small; serves at most MAX_PAGES pages.

    A page past the last servable one shows the last one, so a deep link is answered in
    the time of a shallow one (OFFSET reads every row it skips).
    """

    @cached_property
    def count(self) -> int:
        # The admin pages a queryset (the stubs type object_list as any sequence).
        queryset = cast(QuerySet[Job], self.object_list)
        n, exact = console.estimate_count(queryset, exact_below=EXACT_COUNT_BELOW)
        return n if exact else Estimate(n)

    @cached_property
    def num_pages(self) -> int:
        if self.count == 0 and not self.allow_empty_first_page:
            return 0
        return max(1, min(MAX_PAGES, math.ceil(max(1, self.count - self.orphans) / self.per_page)))

    def page(self, number: int | str) -> Page:
        """The page, read in two merged parts (``models.merged_in_order``): the newest-first
        indexes leave running rows out (migration 0017), so a plain ``ORDER BY
        created_at DESC`` (or ``kind, created_at DESC`` for a list sorted by kind) on a
        filter of kind, queue or tenant alone could use none of them and would read the
        table."""
        queryset = cast(QuerySet[Job], self.object_list)
        ordering = _field_order(queryset)
        if ordering is None:
            return super().page(number)
        # Paginator.page's bounds (the last page takes its orphans), on the merged read.
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        return Page(merged_in_order(queryset, ordering, bottom, top), number, self)

    def validate_number(self, number: int | float | str) -> int:
        try:
            return super().validate_number(number)
        except EmptyPage:
            # Past the bound (or the estimate): serve the last page instead of an error.
            return self.num_pages


class ConsoleChangeList(ChangeList):
    """Reads a one-page list in two merged parts too (a longer one is read by
    ``ConsolePaginator.page``)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        ordering = _field_order(self.queryset)
        if not self.multi_page and ordering is not None:
            self.result_list = merged_in_order(self.queryset, ordering)


def _field_order(queryset: QuerySet[Any]) -> tuple[str, ...] | None:
    """The list's order as field names (newest first, or a sorted column and then newest
    first), or None when it holds an expression the merged read would not know."""
    names = []
    for name in queryset.query.order_by:
        if not isinstance(name, str):
            return None
        # Django may add the primary key by its alias to make an order total.
        names.append({"pk": "id", "-pk": "-id"}.get(name, name))
    # The admin's queryset and the change list each name the order: it arrives twice.
    return tuple(dict.fromkeys(names)) or None


# --- filters: each delegates to console.apply, which the bulk action reuses ----------------


class _ConsoleFilter(admin.SimpleListFilter):
    #: Every console filter names its parameter (Django allows None until the check runs).
    parameter_name: str

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return console.apply(queryset, self.parameter_name, self.value())


class StatusFilter(_ConsoleFilter):
    title, parameter_name = "status", "status"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        # The words the badges show (console.display.display_status), not the stored
        # statuses: "running" is a held lease, "waiting" a released one.
        return [(word.replace(" ", "_"), word) for word in DISPLAY_STATUSES]


class KindFilter(_ConsoleFilter):
    title, parameter_name = "kind", "kind"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [(k, k) for k in console.kind_choices()]


class QueueFilter(_ConsoleFilter):
    title, parameter_name = "queue", "queue"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [(q, q) for q in console.queue_choices()]


class ParkedFilter(_ConsoleFilter):
    title, parameter_name = "parked", "parked"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [
            ("yes", "parked (needs an operator)"),
            *[(r, f"parked: {r}") for r in console.PARK_REASONS],
            ("no", "not parked"),
        ]


class LeaseExpiredFilter(_ConsoleFilter):
    title, parameter_name = "lease", "lease_expired"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [("yes", LEASE_EXPIRED)]


class HeldFilter(_ConsoleFilter):
    title, parameter_name = "held by a wait", "held"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [("yes", "held"), ("no", "not held")]


class TenantFilter(_ConsoleFilter):
    title, parameter_name = "tenant", "tenant"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [
            (t, t) for t in _visible(request, model_admin, "tenant_id", console.tenant_choices())
        ]


class OrganizationFilter(_ConsoleFilter):
    title, parameter_name = "organization", "organization"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        values = _visible(request, model_admin, "organization_id", console.organization_choices())
        return [(o, o) for o in values]


def _visible(
    request: HttpRequest, model_admin: admin.ModelAdmin[Any], column: str, values: list[str]
) -> list[str]:
    """The choices this user's ADMIN_SCOPE lets them see (an index probe each); the names of
    other tenants' scopes are not shown to someone who may not see their jobs."""
    if conf.get().ADMIN_SCOPE is None:
        return values
    visible = model_admin.get_queryset(request)
    return [value for value in values if visible.filter(**{column: value}).exists()]
