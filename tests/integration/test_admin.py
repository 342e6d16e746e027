"""The admin: read-only rows, pretty JSON, actions through the service with permissions."""

from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.contrib.auth.models import Permission, User
from django.db import connection

from durable_jobs.models import Job
from tests.factories import JobFactory, reload

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/durable_jobs/job/"


@pytest.fixture
def staff(client):
    def login(*perms: str) -> User:
        user = User.objects.create_user("op", password="pw", is_staff=True)
        for codename in ("view_job", *perms):
            user.user_permissions.add(Permission.objects.get(codename=codename))
        client.force_login(user)
        return user

    return login


def test_changelist_and_detail_show_progress_and_pretty_json(client, staff):
    staff()
    job = JobFactory(total_count=10, processed_count=4, input={"report": 7, "rows": [1, 2]})
    page = client.get(CHANGELIST).content.decode()
    assert str(job.id) in page and "4/10" in page
    detail = client.get(f"{CHANGELIST}{job.id}/change/").content.decode()
    assert "&quot;report&quot;: 7" in detail or '"report": 7' in detail


def test_cancel_action_needs_its_permission_and_goes_through_the_service(client, staff):
    staff()
    job = JobFactory()
    response = client.post(
        CHANGELIST, {"action": "cancel_jobs", "confirm": "yes", "_selected_action": [str(job.id)]}
    )
    assert reload(job).cancel_requested_at is None, "no cancel_job permission: no action"
    assert response.status_code in (200, 302)


def test_cancel_action_on_a_parent_cancels_its_live_children_too(client, staff, kinds):
    from tests.integration.support import parent_with_live_children

    staff("cancel_job")
    parent, children = parent_with_live_children(kinds, count=2)
    grandchildren = list(Job.objects.filter(parent_id__in=[c.id for c in children]))
    response = client.post(
        CHANGELIST,
        {"action": "cancel_jobs", "confirm": "yes", "_selected_action": [str(parent.id)]},
        follow=True,
    )
    assert "Cancellation requested for 1 job(s)." in response.content.decode()
    tree = [parent, *children, *grandchildren]
    assert [reload(j).cancelled_by for j in tree] == ["admin:op"] * 5


def test_actions_count_what_changed_and_what_was_refused(client, staff):
    staff("cancel_job", "redrive_job")
    live = JobFactory()
    done = JobFactory(status="completed", finished_at=-1, pending_since=None)
    response = client.post(
        CHANGELIST,
        {
            "action": "cancel_jobs",
            "confirm": "yes",
            "_selected_action": [str(live.id), str(done.id)],
        },
        follow=True,
    )
    text = response.content.decode()
    assert "Cancellation requested for 1 job(s)." in text and "Refused 1" in text
    assert reload(live).cancelled_by == "admin:op"
    unrecoverable = JobFactory(
        status="failed", error_code="unrecoverable", finished_at=-1, pending_since=None
    )
    client.post(
        CHANGELIST,
        {"action": "redrive_jobs", "confirm": "yes", "_selected_action": [str(unrecoverable.id)]},
    )
    assert reload(unrecoverable).status == "failed", "force is a separate permission"
    response = client.post(
        CHANGELIST,
        {
            "action": "force_redrive_jobs",
            "confirm": "yes",
            "_selected_action": [str(unrecoverable.id)],
        },
    )
    assert reload(unrecoverable).status == "failed", "no force_redrive_job permission"


def test_force_redrive_with_its_permission(client, staff):
    staff("force_redrive_job")
    unrecoverable = JobFactory(
        status="failed", error_code="unrecoverable", finished_at=-1, pending_since=None
    )
    client.post(
        CHANGELIST,
        {
            "action": "force_redrive_jobs",
            "confirm": "yes",
            "_selected_action": [str(unrecoverable.id)],
        },
    )
    assert reload(unrecoverable).status == "pending"


def test_the_admin_cannot_add_change_or_delete_rows(client, staff):
    staff()
    job = JobFactory()
    assert client.get(f"{CHANGELIST}add/").status_code == 403
    assert client.post(f"{CHANGELIST}{job.id}/delete/").status_code in (403, 302)
    assert reload(job) is not None


def test_the_subject_links_to_its_admin_page_for_a_user_who_may_view_it(client, staff):
    operator = staff()
    subject = User.objects.create_user("customer")
    linked = JobFactory(subject_type="auth.user", subject_id=str(subject.pk))
    unregistered = JobFactory(subject_type="demo.report", subject_id="7")
    not_a_model = JobFactory(subject_type="billing-system", subject_id="inv-9")
    url = f"/admin/auth/user/{subject.pk}/change/"

    page = client.get(CHANGELIST).content.decode()
    assert f"auth.<wbr>user:<wbr>{subject.pk}" in page and url not in page, (
        "no view permission on users: plain text"
    )
    operator.user_permissions.add(Permission.objects.get(codename="view_user"))
    operator = User.objects.get(pk=operator.pk)  # permissions are cached per instance
    client.force_login(operator)
    page = client.get(CHANGELIST).content.decode()
    assert f"href='{url}'" in page
    detail = client.get(f"{CHANGELIST}{linked.id}/change/").content.decode()
    assert f"href='{url}'" in detail, "the job page links the subject too"
    for job in (unregistered, not_a_model):
        detail = client.get(f"{CHANGELIST}{job.id}/change/").content.decode()
        assert "class='dj-subject'" not in detail, job.subject_type
    assert "billing-<wbr>system:<wbr>inv-<wbr>9" in page


def job_page_actions(client, job) -> list[str]:
    page = client.get(f"{CHANGELIST}{job.id}/change/").content.decode()
    return re.findall(r'name="dj_job_action" value="([a-z_]+)"', page)


def test_the_job_page_cancels_through_the_list_action_after_confirmation(client, staff):
    staff("cancel_job", "redrive_job")
    job = JobFactory()
    assert job_page_actions(client, job) == ["cancel_jobs"]
    form = {
        "action": "cancel_jobs",
        "index": "0",
        "_selected_action": str(job.id),
        "from_job": str(job.id),
    }
    confirm = client.post(CHANGELIST, form)
    assert confirm.status_code == 200
    assert "Request cancellation: 1 job" in confirm.content.decode()
    assert f'name="from_job" value="{job.id}"' in confirm.content.decode()
    assert reload(job).cancel_requested_at is None, "nothing changes before the confirmation"
    done = client.post(CHANGELIST, {**form, "confirm": "yes"})
    assert done.status_code == 302 and done["Location"] == f"{CHANGELIST}{job.id}/change/"
    assert reload(job).cancel_requested_at is not None and reload(job).cancelled_by == "admin:op"
    back = client.get(done["Location"]).content.decode()
    assert "Cancellation requested for 1 job(s)." in back
    assert job_page_actions(client, job) == [], "already requested: no button"

    parked = JobFactory(
        status="failed", error_code="poison", parked_at=-1, finished_at=-1, pending_since=None
    )
    assert job_page_actions(client, parked) == ["redrive_jobs"]
    unrecoverable = JobFactory(
        status="failed", error_class="unrecoverable", finished_at=-1, pending_since=None
    )
    assert job_page_actions(client, unrecoverable) == ["redrive_jobs"], (
        "force re-drive needs its own permission"
    )


def test_without_the_permission_the_job_page_offers_no_button_and_refuses_a_forged_post(
    client, staff
):
    staff("redrive_job")
    job = JobFactory()
    assert job_page_actions(client, job) == []
    client.post(
        CHANGELIST,
        {
            "action": "cancel_jobs",
            "index": "0",
            "confirm": "yes",
            "_selected_action": str(job.id),
            "from_job": str(job.id),
        },
    )
    assert reload(job).cancel_requested_at is None


def test_before_migrate_the_job_pages_say_the_tables_are_missing(client, staff):
    staff()
    job = JobFactory()
    # Inside the test's transaction, rolled back after it: the tables come back.
    with connection.cursor() as cursor:
        for model in apps.get_app_config("durable_jobs").get_models():
            cursor.execute(f'DROP TABLE IF EXISTS "{model._meta.db_table}" CASCADE')
    for url in (CHANGELIST, f"{CHANGELIST}?status=running", f"{CHANGELIST}{job.id}/change/"):
        response = client.get(url)
        page = response.content.decode()
        assert response.status_code == 503, url
        assert (
            "durable_jobs' tables are missing: run <code>python manage.py migrate</code>" in page
        ), url
    live = client.get(f"{CHANGELIST}live/?id={job.id}")
    assert live.status_code == 503
    assert live.json() == {
        "error": "durable_jobs' tables are missing: run python manage.py migrate"
    }
