"""Invariant 27 where operators meet it: ``manage.py durable_jobs pause|resume|queues``,
``stats``, the Prometheus gauges, the admin's paused-queue page (through the service,
with its permission) and the "why isn't it running" explanation."""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import override_settings

import durable_jobs as durable
from durable_jobs.console import explain, live
from durable_jobs.models import PausedQueue
from tests.factories import JobFactory, reload

pytestmark = pytest.mark.django_db

PAGE = "/admin/durable_jobs/pausedqueue/"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("durable_jobs", *args, stdout=out)
    return out.getvalue()


def test_pause_resume_and_queues_on_the_command_line():
    JobFactory(queue_name="reports")
    JobFactory(queue_name="reports", next_run_at=3600)
    said = run("pause", "reports", "--reason", "incident 42", "--by", "alice")
    assert "queue reports paused since" in said and "alice: incident 42" in said
    assert "already paused" in run("pause", "reports")

    listed = {q["queue"]: q for q in json.loads(run("queues", "--json"))}
    assert listed["reports"]["paused"] and listed["reports"]["reason"] == "incident 42"
    assert (listed["reports"]["backlog"], listed["reports"]["due"]) == (2, 1)
    assert listed["default"]["paused"] is False
    human = run("queues")
    assert "reports" in human and "paused" in human and "alice: incident 42" in human

    assert json.loads(run("resume", "reports", "--json")) == {"queue": "reports", "resumed": True}
    assert "was not paused: nothing changed" in run("resume", "reports")
    assert durable.paused_queues() == []


def test_the_command_refuses_an_undeclared_queue_with_a_did_you_mean():
    with override_settings(DURABLE_JOBS={"QUEUES": ["default", "reports"]}):
        with pytest.raises(CommandError, match="'reprots' is not a declared queue.*'reports'"):
            run("pause", "reprots")
    assert durable.paused_queues() == []


def test_stats_and_metrics_show_the_paused_queue(client):
    durable.pause_queue("reports", reason="incident 42", by="alice")
    data = json.loads(run("stats", "--json"))
    assert data["paused_queues"]["reports"]["reason"] == "incident 42"
    assert "paused queues: reports since" in run("stats")

    user = User.objects.create_user("viewer", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(user)
    text = client.get("/metrics/durable-jobs").content.decode()
    assert 'durable_jobs_queue_paused{queue="reports"} 1.0' in text
    assert 'durable_jobs_queue_paused{queue="default"} 0.0' in text


def test_explain_says_the_queue_is_paused_since_when_by_whom_and_why():
    job = JobFactory(queue_name="reports")
    durable.pause_queue("reports", reason="incident 42", by="alice")
    reasons = explain.explain(reload(job))
    assert any(
        "Queue 'reports' is paused since" in r and "by alice: incident 42" in r for r in reasons
    )
    said = run("explain", str(job.id))
    assert "queue reports is paused since" in said and "by alice: incident 42" in said
    assert (
        json.loads(run("explain", str(job.id), "--json"))["queue_paused"]["reason"] == "incident 42"
    )

    durable.resume_queue("reports")
    assert not any("paused" in r for r in explain.explain(reload(job)))
    assert json.loads(run("explain", str(job.id), "--json"))["queue_paused"] is None


@pytest.fixture
def operator(client):
    def login(*perms: str) -> User:
        user = User.objects.create_user("op", password="pw", is_staff=True)
        for codename in ("view_pausedqueue", *perms):
            user.user_permissions.add(Permission.objects.get(codename=codename))
        client.force_login(user)
        return user

    return login


def test_the_admin_pauses_and_resumes_through_the_service_with_its_permission(client, operator):
    operator("pause_queue")
    response = client.post(f"{PAGE}add/", {"queue_name": "reports", "reason": "incident 42"})
    assert response.status_code == 302
    (pause,) = durable.paused_queues()
    assert (pause.queue, pause.paused_by, pause.reason) == ("reports", "op", "incident 42")
    JobFactory(queue_name="reports")
    page = client.get(PAGE).content.decode()
    assert "reports" in page and "incident 42" in page

    client.post(PAGE, {"action": "resume_selected", "_selected_action": ["reports"]})
    assert durable.paused_queues() == []


def test_without_the_permission_the_admin_neither_pauses_nor_resumes(client, operator):
    operator()
    assert client.post(f"{PAGE}add/", {"queue_name": "reports"}).status_code == 403
    durable.pause_queue("reports")
    client.post(PAGE, {"action": "resume_selected", "_selected_action": ["reports"]})
    assert [p.queue for p in durable.paused_queues()] == ["reports"]
    assert PausedQueue.objects.count() == 1


def test_the_admin_refuses_an_undeclared_queue_on_its_form(client, operator):
    operator("pause_queue")
    with override_settings(DURABLE_JOBS={"QUEUES": ["default", "reports"]}):
        page = client.post(f"{PAGE}add/", {"queue_name": "reprots"}).content.decode()
    assert "is not a declared queue" in page
    assert durable.paused_queues() == []


def test_the_job_list_says_which_queues_are_paused(client):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(user)
    durable.pause_queue("reports", reason="incident 42", by="alice")
    try:
        page = client.get("/admin/durable_jobs/job/").content.decode()
    finally:
        live._choices_cache.clear()  # the filters' choices, read for this page, go with it
    assert "Queue &#x27;reports&#x27; is paused since" in page and "by alice: incident 42" in page
