"""The admin's schedules page: the facts, and pause/resume/run now with their permission."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

import durable_jobs as durable
from durable_jobs import testing
from durable_jobs.models import Job, Schedule
from durable_jobs.schedules import declare

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/durable_jobs/schedule/"


@pytest.fixture
def report_schedule(kinds):
    kinds.add("tests.report")
    durable.schedule("tests.report", "@hourly", tz="Europe/Berlin")
    durable.sync_schedules()
    yield "tests.report"
    declare.forget("tests.report")


@pytest.fixture
def staff(client):
    def login(*perms: str) -> User:
        user = User.objects.create_user("op", password="pw", is_staff=True)
        for codename in ("view_schedule", "view_job", *perms):
            user.user_permissions.add(Permission.objects.get(codename=codename))
        client.force_login(user)
        return user

    return login


def test_the_page_lists_each_schedule_with_its_state_and_last_job(client, staff, report_schedule):
    staff()
    testing.fast_forward_schedule(report_schedule)
    testing.fire_schedules()
    testing.run_jobs()
    page = client.get(CHANGELIST).content.decode()
    assert "tests.report" in page and "Europe/Berlin" in page and "active" in page
    job = Job.objects.get(meta__schedule=report_schedule)
    assert f"/admin/durable_jobs/job/{job.id}/change/" in page and "completed" in page


def test_pause_resume_and_run_now_need_their_permission(client, staff, report_schedule):
    staff()
    client.post(CHANGELIST, {"action": "pause_selected", "_selected_action": [report_schedule]})
    assert Schedule.objects.get(name=report_schedule).paused_at is None, "no permission: no action"


def test_actions_go_through_the_service_and_say_what_changed(client, staff, report_schedule):
    staff("change_schedule_state")
    response = client.post(
        CHANGELIST, {"action": "pause_selected", "_selected_action": [report_schedule]}, follow=True
    )
    assert Schedule.objects.get(name=report_schedule).paused_at is not None
    assert "1 schedule(s) paused." in response.content.decode()
    client.post(CHANGELIST, {"action": "run_selected_now", "_selected_action": [report_schedule]})
    assert Job.objects.filter(meta__schedule=report_schedule).count() == 1
    client.post(CHANGELIST, {"action": "resume_selected", "_selected_action": [report_schedule]})
    assert Schedule.objects.get(name=report_schedule).paused_at is None


def test_the_admin_cannot_add_change_or_delete_schedules(client, staff, report_schedule):
    staff("change_schedule_state")
    assert client.get(f"{CHANGELIST}add/").status_code == 403
    response = client.post(
        f"{CHANGELIST}{report_schedule}/change/", {"name": report_schedule, "kind": "x"}
    )
    assert response.status_code == 403
