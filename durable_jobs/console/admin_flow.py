"""The admin's flow keys: each key's limits in force and its occupancy, and an operator's
runtime limits (invariant 26).

Changes go through ``limits_api.set_flow_limit`` (the same call as code and ``manage.py
durable_jobs set-limit``), never an ORM write, and need the
``durable_jobs.change_flow_limit`` permission; the next claim on every worker applies
them. A field left blank clears the operator's value (the settings' or the kind's
applies again). Seeing the list needs ``view_flowkey``.
"""

from __future__ import annotations

import threading
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from durable_jobs import validation
from durable_jobs.exceptions import InvalidInput
from durable_jobs.limits import api as limits_api
from durable_jobs.limits.policy import Rate
from durable_jobs.models import FlowKey
from durable_jobs.states import FlowKeyState

PERMISSION = "durable_jobs.change_flow_limit"
_LIMITS = ("concurrency", "rate", "rate_window_ms", "weight")


class LimitForm(forms.ModelForm):
    """An operator's limits for one key: blank means "not set"."""

    class Meta:
        model = FlowKey
        fields = ("key", *_LIMITS)

    def clean_key(self) -> str:
        key = self.cleaned_data["key"]
        try:
            return validation.key("key", key, max_length=200)
        except InvalidInput as error:
            raise forms.ValidationError(error.detail) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name in ("concurrency", "rate", "rate_window_ms"):
            value = data.get(name)
            if value is not None and value < (0 if name == "concurrency" else 1):
                self.add_error(name, "must be positive (concurrency may be 0: the key is stopped)")
        if data.get("weight") is not None and data["weight"] <= 0:
            self.add_error("weight", "must be a positive number")
        return data


@admin.register(FlowKey)
class FlowKeyAdmin(admin.ModelAdmin):
    """Flow keys: limits in force, permits held, starts in the rate window, jobs waiting."""

    form = LimitForm
    list_display = (
        "key",
        "running_col",
        "window_col",
        "waiting_col",
        "weight",
        "changed_by",
        "changed_at",
    )
    search_fields = ("key",)
    list_per_page = 100
    _seen = threading.local()

    def get_readonly_fields(
        self, request: HttpRequest, obj: FlowKey | None = None
    ) -> tuple[str, ...]:
        return ("key",) if obj is not None else ()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERMISSION)

    def has_change_permission(self, request: HttpRequest, obj: FlowKey | None = None) -> bool:
        return request.user.has_perm(PERMISSION)

    def has_delete_permission(self, request: HttpRequest, obj: FlowKey | None = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        # One read of every key's occupancy for the page (store.LIST_FLOW_KEYS).
        self._seen.states = {state.key: state for state in limits_api.flow_keys()}
        return super().changelist_view(request, extra_context)

    def _state(self, key: FlowKey) -> FlowKeyState | None:
        return getattr(self._seen, "states", {}).get(key.key)

    @admin.display(description="running / limit")
    def running_col(self, key: FlowKey) -> str:
        state = self._state(key)
        if state is None:
            return "-"
        return f"{state.running} / {'-' if state.concurrency is None else state.concurrency}"

    @admin.display(description="starts in window / rate")
    def window_col(self, key: FlowKey) -> str:
        state = self._state(key)
        if state is None:
            return "-"
        return f"{state.recent_starts} / {'-' if state.rate is None else state.rate}"

    @admin.display(description="waiting")
    def waiting_col(self, key: FlowKey) -> int | str:
        state = self._state(key)
        return "-" if state is None else state.waiting

    def save_model(self, request: HttpRequest, obj: FlowKey, form: Any, change: bool) -> None:
        """Set the limits through the service (never ``obj.save()``); blank clears."""
        data = form.cleaned_data
        rate = None
        if data.get("rate") is not None:
            rate = Rate(limit=data["rate"], per=(data.get("rate_window_ms") or 1000) / 1000)
        cleared = [name for name in ("concurrency", "rate", "weight") if data.get(name) is None]
        limits_api.set_flow_limit(
            obj.key,
            concurrency=data.get("concurrency"),
            rate=rate,
            weight=data.get("weight"),
            clear=cleared,
            by=request.user.get_username() or None,
        )
