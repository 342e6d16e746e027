"""Links from a job to its subject's admin page, where the subject has one this user may open."""

from __future__ import annotations

from collections.abc import Iterable

from django.apps import apps
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

from durable_jobs.models import Job

#: Where ``link_subjects`` leaves a job's subject link for this request's user.
SUBJECT_URL = "console_subject_url"


def link_subjects(site: admin.AdminSite, request: HttpRequest, jobs: Iterable[Job]) -> None:
    """Give each job the admin URL of its subject, where there is one this user may open.

    A subject type is ``app_label.model_name`` (``service.start(subject=instance)``
    records ``_meta.label_lower``); it links when that model is registered on this admin
    site and the user may view it there. Anything else stays plain text. One decision per
    subject type, and no read of the subjects themselves.
    """
    decided: dict[str, str | None] = {}
    for job in jobs:
        kind = job.subject_type
        if not kind or job.subject_id is None:
            continue
        if kind not in decided:
            decided[kind] = subject_route(site, request, kind)
        route = decided[kind]
        if route is not None:
            url = reverse(route, args=[quote(job.subject_id)], current_app=site.name)
            setattr(job, SUBJECT_URL, url)


def subject_route(site: admin.AdminSite, request: HttpRequest, subject_type: str) -> str | None:
    """The change view's URL name for ``subject_type``, or None when it gets no link."""
    try:
        model = apps.get_model(subject_type)
    except (LookupError, ValueError):
        return None
    if not site.is_registered(model):
        return None
    model_admin = site.get_model_admin(model)
    if not model_admin.has_view_or_change_permission(request):
        return None
    opts = model._meta
    route = f"{site.name}:{opts.app_label}_{opts.model_name}_change"
    try:
        reverse(route, args=["0"], current_app=site.name)
    except NoReverseMatch:
        return None
    return route
