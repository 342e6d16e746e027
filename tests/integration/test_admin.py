"""The admin: read-only rows, pretty JSON, actions through the service with permissions."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

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
