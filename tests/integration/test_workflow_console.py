"""The job page's workflow panel: parent, children by state, unread events, the wait."""

from __future__ import annotations

import pytest
from django.urls import reverse

import durable_jobs as durable
from durable_jobs import testing
from durable_jobs.models import Job

pytestmark = pytest.mark.django_db


def test_job_page__shows_the_parent_children_counts_and_unread_events(kinds, admin_client):
    def parent(job):
        with job.fenced():
            job.spawn_many([{"kind": "tests.flow.child", "key": f"c{i}"} for i in range(3)])
        return job.wait_for_children()

    kinds.add("tests.flow.parent", parent)
    kinds.add("tests.flow.child")
    job = durable.start("tests.flow.parent")
    testing.run_jobs(max_slices=1)
    durable.send_event(job, "approved", {"by": "ops"}, scope=job.tenant_id)

    page = admin_client.get(reverse("admin:durable_jobs_job_change", args=[job.id]))
    text = page.content.decode()
    assert page.status_code == 200
    assert "3 spawned, 0 ended" in text and "3 pending" in text
    assert "waiting for all children (policy fail)" in text
    assert "approved" in text

    child = Job.objects.filter(parent_id=job.id).first()
    child_page = admin_client.get(reverse("admin:durable_jobs_job_change", args=[child.id]))
    assert str(job.id) in child_page.content.decode()


def test_explain__says_what_a_held_job_waits_for(kinds):
    from durable_jobs.console.explain import explain
    from tests.factories import reload

    def parent(job):
        with job.fenced():
            job.spawn_many([{"kind": "tests.flow.child", "key": f"c{i}"} for i in range(2)])
        return job.wait_for_children(policy="continue")

    kinds.add("tests.flow.parent", parent)
    kinds.add("tests.flow.child")
    kinds.add("tests.flow.order", lambda job: job.wait_for_event("paid"))
    job = durable.start("tests.flow.parent")
    order = durable.start("tests.flow.order")
    testing.run_jobs(max_slices=2)

    assert any("waits for all of its 2 children" in r for r in explain(reload(job)))
    assert any("waits for the event 'paid'" in r for r in explain(reload(order)))
    assert not any("no run time" in r for r in explain(reload(job)))
