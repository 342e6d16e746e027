"""The job page's workflow panel: its parent, its children by state, its dependencies and
the events it has not consumed yet, and what it waits for now.

Reads only, each bounded: the children's counts come from one GROUP BY over the
child-key index (the children of one parent), the list shows the first ``LIMIT`` of them,
and the events are the unread ones of this job.
"""

from __future__ import annotations

from django.db.models import Count
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from durable_jobs.models import Job, JobEvent

LIMIT = 50


def _link(job_id: object) -> SafeString:
    return format_html(
        "<a href='{}'><code>{}</code></a>",
        reverse("admin:durable_jobs_job_change", args=[job_id]),
        job_id,
    )


def has_workflow(job: Job) -> bool:
    """Whether the page shows the panel: a child, a parent, a dependent, or a wait."""
    return bool(job.parent_id or job.children_total or job.deps_total or job.flow_wait)


def _waiting_for(job: Job) -> str:
    wait = job.flow_wait if isinstance(job.flow_wait, dict) else {}
    held = job.status == "pending" and job.lease_owner is None
    if not wait:
        return "-"
    on = wait.get("on")
    if on == "children":
        what = f"{wait.get('at_least') or 'all'} children (policy {wait.get('policy', 'fail')})"
    elif on == "event":
        what = f"event {wait.get('event')!r}"
    elif on == "after":
        what = f"{job.deps_total} jobs it was started after (policy {wait.get('policy', 'fail')})"
    else:
        what = "a durable sleep"
    if not held:
        return f"last waited for {what}"
    return f"waiting for {what}" + (
        "" if job.next_run_at is None else f", due {job.next_run_at:%Y-%m-%d %H:%M:%S}"
    )


def workflow_html(job: Job) -> SafeString:
    """The panel's HTML (every value escaped)."""
    using = job._state.db or "default"
    rows: list[tuple[str, SafeString | str]] = [("wait", _waiting_for(job))]
    if job.parent_id:
        rows.append(("parent", _link(job.parent_id)))
        rows.append(("spawn key", job.spawn_key or "-"))
    if job.children_total:
        counts = (
            Job.objects.using(using)
            .filter(parent_id=job.id, tenant_id=job.tenant_id)
            .values("status")
            .annotate(n=Count("id"))
            .order_by("status")
        )
        rows.append(
            (
                "children",
                f"{job.children_total} spawned, {job.children_ended} ended "
                f"({job.children_failed} failed or cancelled): "
                + ", ".join(f"{c['n']} {c['status']}" for c in counts),
            )
        )
        first = (
            Job.objects.using(using)
            .filter(parent_id=job.id, tenant_id=job.tenant_id)
            .order_by("spawn_key")
            .values_list("id", "spawn_key", "kind", "status")[:LIMIT]
        )
        rows.append(
            (
                f"first {LIMIT} children",
                format_html_join(
                    "",
                    "<div>{} {} <code>{}</code> {}</div>",
                    ((_link(i), key, kind, status) for i, key, kind, status in first),
                ),
            )
        )
    if job.deps_total:
        rows.append(
            (
                "started after",
                f"{job.deps_total} jobs, {job.deps_ended} ended "
                f"({job.deps_failed} failed or cancelled)",
            )
        )
    if job.dependents:
        rows.append(
            (
                "dependents",
                format_html_join(" ", "{}", ((_link(i),) for i in job.dependents[:LIMIT])),
            )
        )
    unread = (
        JobEvent.objects.using(using)
        .filter(job_id=job.id, consumed_at__isnull=True)
        .order_by("id")
        .values_list("name", "sent_at")[:LIMIT]
    )
    rows.append(
        (
            "unread events",
            format_html_join(
                ", ", "{} ({})", ((name, f"{sent:%Y-%m-%d %H:%M:%S}") for name, sent in unread)
            )
            or "-",
        )
    )
    return format_html(
        "<table class='dj-workflow'>{}</table>",
        format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows),
    )
