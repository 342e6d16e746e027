"""The admin acts with the authority of the operator who asks, and no further: a bulk
job is authorised for its recorded user at run time and at re-drive, a large selection
becomes a bulk job, and ADMIN_SCOPE narrows every view, action, live poll and bulk job."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.db.models import Q

from durable_jobs import conf, testing
from durable_jobs.exceptions import ConfigurationError
from tests.factories import JobFactory, reload

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/durable_jobs/job/"
BULK = "durable_jobs.bulk_action"


def make_user(name: str, *perms: str, superuser: bool = False) -> User:
    if superuser:
        return User.objects.create_superuser(name, password="pw")
    user = User.objects.create_user(name, password="pw", is_staff=True)
    for codename in ("view_job", *perms):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def unrecoverable(**fields):
    return JobFactory(
        status="failed",
        error_class="unrecoverable",
        error_code="unrecoverable",
        finished_at=-1,
        pending_since=None,
        **fields,
    )


def failed_bulk(action: str, user: User, **fields):
    """A bulk job that failed part-way, as a crash past its budget leaves it."""
    return JobFactory(
        kind=BULK,
        status="failed",
        error_class="terminal",
        error_code="retry_exhausted",
        finished_at=-1,
        pending_since=None,
        input={"action": action, "filters": {}, "by": f"admin:{user.username}", "user_id": user.pk},
        created_by=f"admin:{user.username}",
        **fields,
    )


def post_action(client, action: str, ids, query: str = "", **extra):
    return client.post(
        CHANGELIST + query,
        {"action": action, "confirm": "yes", "_selected_action": [str(i) for i in ids], **extra},
        follow=True,
    )


# --- 1. a bulk job's action is authorised for the user who asks -------------------------


def test_redrive_of_a_force_redrive_bulk_job__is_refused_to_an_operator_without_force(client):
    root = make_user("root", superuser=True)
    targets = [unrecoverable() for _ in range(3)]
    bulk = failed_bulk("force_redrive", root)
    client.force_login(make_user("op", "redrive_job"))

    text = post_action(client, "redrive_jobs", [bulk.id]).content.decode()

    assert "needs the durable_jobs.force_redrive_job permission" in text
    assert reload(bulk).status == "failed"
    testing.run_jobs(queues=["default"])
    assert [reload(t).status for t in targets] == ["failed"] * 3, "nothing was force re-driven"


def test_a_bulk_job_whose_user_lost_the_permission__fails_terminally_and_changes_nothing(client):
    operator = make_user("op", "cancel_job")
    client.force_login(operator)
    targets = [JobFactory(next_run_at=3600) for _ in range(3)]
    post_action(client, "cancel_jobs", [targets[0].id], select_across="1", index="0")
    bulk = testing.assert_started(BULK, count=1)[0]
    operator.user_permissions.remove(Permission.objects.get(codename="cancel_job"))

    testing.run_jobs(queues=["default"])

    bulk = reload(bulk)
    assert (bulk.status, bulk.error_class) == ("failed", "terminal")
    assert (
        "bulk_action_forbidden: user 'op' who asked for this bulk cancel does not hold the "
        "durable_jobs.cancel_job permission it needs" in bulk.error_message
    )
    assert all(reload(t).cancel_requested_at is None for t in targets)


def test_a_bulk_job_recording_no_user__is_refused_at_run_time():
    root = make_user("root", superuser=True)
    target = unrecoverable()
    JobFactory(
        kind=BULK, input={"action": "force_redrive", "filters": {}, "by": f"admin:{root.username}"}
    )
    testing.run_jobs(queues=["default"])
    bulk = testing.assert_started(BULK, count=1)[0]
    assert reload(bulk).status == "failed" and "records no user" in reload(bulk).error_message
    assert reload(target).status == "failed"


def test_a_re_driven_bulk_job__runs_for_the_operator_who_re_drove_it_from_its_cursor(client):
    root = make_user("root", superuser=True)
    targets = sorted((JobFactory(next_run_at=3600) for _ in range(3)), key=lambda j: j.id)
    done = targets[-1]  # the first run cancelled the newest-first top of the list, then failed
    bulk = failed_bulk(
        "cancel",
        root,
        checkpoint={
            "after": [done.created_at.isoformat(), str(done.id)],
            "changed": 1,
            "refused": {},
            "processed": 1,
        },
    )
    operator = make_user("op2", "cancel_job", "redrive_job")
    client.force_login(operator)

    text = post_action(client, "redrive_jobs", [bulk.id]).content.decode()

    assert "Re-drove 1 job(s)." in text
    assert reload(bulk).status == "failed", "the failed run stays as its record"
    again = [j for j in testing.assert_started(BULK, count=2) if j.id != bulk.id][0]
    assert again.created_by == "admin:op2" and again.input["user_id"] == operator.pk
    assert again.input["resume_of"] == str(bulk.id)
    post_action(client, "redrive_jobs", [bulk.id])
    assert len(testing.assert_started(BULK, count=2)) == 2, "a second re-drive starts nothing"

    testing.run_jobs(queues=["default"])

    again = reload(again)
    assert again.status == "completed", again.error_message
    assert again.result["changed"] == 3, "one from the first run, two from this one"
    assert [reload(j).cancelled_by for j in targets[:-1]] == ["admin:op2", "admin:op2"]
    assert reload(done).cancel_requested_at is None, "resumed past what the first run did"


def test_a_bulk_redrive_reaching_a_force_redrive_bulk_job__does_not_re_drive_it(client):
    root = make_user("root", superuser=True)
    target = unrecoverable()
    inner = failed_bulk("force_redrive", root)
    client.force_login(make_user("op", "redrive_job"))
    post_action(client, "redrive_jobs", [inner.id], select_across="1", index="0")

    testing.run_jobs(queues=["default"])

    outer = [j for j in testing.assert_started(BULK, count=2) if j.id != inner.id][0]
    outer = reload(outer)
    assert outer.status == "completed", outer.error_message
    refusals = outer.result["refused"]
    assert any("needs the durable_jobs.force_redrive_job permission" in r for r in refusals)
    assert reload(inner).status == "failed" and reload(target).status == "failed"


# --- 2. a large selection is a bulk job ---------------------------------------------------


def test_a_selection_past_the_bound__starts_a_bulk_job_over_exactly_those_ids(client, settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "ADMIN_ACTION_MAX_ROWS": 3}
    client.force_login(make_user("op", "cancel_job"))
    selected = [JobFactory(next_run_at=3600) for _ in range(5)]
    other = JobFactory(next_run_at=3600)

    text = post_action(client, "cancel_jobs", [j.id for j in selected]).content.decode()

    assert "Started a background job to cancel the 5 selected jobs" in text
    assert all(reload(j).cancel_requested_at is None for j in selected), "the request changed none"
    bulk = testing.assert_started(BULK, count=1)[0]
    assert sorted(bulk.input["ids"]) == sorted(str(j.id) for j in selected)
    testing.run_jobs(queues=["default"])
    assert reload(bulk).result["changed"] == 5
    assert all(reload(j).cancelled_by == "admin:op" for j in selected)
    assert reload(other).cancel_requested_at is None

    small = [JobFactory(next_run_at=3600) for _ in range(3)]
    text = post_action(client, "cancel_jobs", [j.id for j in small]).content.decode()
    assert "Cancellation requested for 3 job(s)." in text, "at the bound: in the request"


def test_the_bound_is_a_positive_integer():
    with pytest.raises(ConfigurationError, match=r"ADMIN_ACTION_MAX_ROWS.*positive integer"):
        conf.load({"ADMIN_ACTION_MAX_ROWS": 0})


# --- 3. ADMIN_SCOPE narrows everything ----------------------------------------------------


def visible_jobs(user, queryset):
    """The ADMIN_SCOPE of these tests: "op-a" sees tenant "a" and the bulk jobs it started."""
    if user.is_superuser:
        return queryset
    tenant = user.username.removeprefix("op-")
    return queryset.filter(
        Q(tenant_id=tenant) | Q(kind=BULK, created_by=f"admin:{user.get_username()}")
    )


@pytest.fixture
def scoped(client, settings):
    settings.DURABLE_JOBS = {
        **settings.DURABLE_JOBS,
        "ADMIN_SCOPE": f"{__name__}.visible_jobs",
    }
    client.force_login(make_user("op-a", "cancel_job", "redrive_job"))
    return JobFactory(tenant_id="a", next_run_at=3600), JobFactory(tenant_id="b", next_run_at=3600)


def test_a_scoped_operator__sees_neither_the_other_tenants_job_nor_its_name(client, scoped):
    mine, theirs = scoped
    page = client.get(CHANGELIST).content.decode()
    assert str(mine.id) in page and str(theirs.id) not in page
    assert "?tenant=b" not in page, "the tenant filter offers only visible tenants"
    assert client.get(f"{CHANGELIST}{mine.id}/change/").status_code == 200
    response = client.get(f"{CHANGELIST}{theirs.id}/change/")
    assert response.status_code == 302, "Django's answer for a job that does not exist"
    searched = client.get(f"{CHANGELIST}?q={theirs.id}").content.decode()
    assert f"{theirs.id}/change/" not in searched


def test_a_scoped_operator__cannot_poll_the_other_tenants_job(client, scoped):
    mine, theirs = scoped
    data = json.loads(client.get(f"{CHANGELIST}live/?id={mine.id}&id={theirs.id}").content)
    assert list(data["jobs"]) == [str(mine.id)]


def test_a_scoped_operator__cannot_act_on_the_other_tenants_job(client, scoped):
    mine, theirs = scoped
    post_action(client, "cancel_jobs", [mine.id, theirs.id])
    assert reload(mine).cancelled_by == "admin:op-a"
    assert reload(theirs).cancel_requested_at is None


def test_a_scoped_operators_bulk_job__never_touches_the_other_tenant(client, scoped):
    mine, theirs = scoped
    text = post_action(
        client, "cancel_jobs", [mine.id], select_across="1", index="0"
    ).content.decode()
    assert "Started a background job" in text
    bulk = testing.assert_started(BULK, count=1)[0]
    assert bulk.input["filters"] == {}, "the filters alone would match every tenant"

    testing.run_jobs(queues=["default"])

    assert reload(bulk).status == "completed", reload(bulk).error_message
    assert reload(mine).cancelled_by == "admin:op-a"
    assert reload(theirs).cancel_requested_at is None


def test_admin_scope_must_be_a_dotted_path():
    with pytest.raises(ConfigurationError, match=r"ADMIN_SCOPE.*dotted path.*'not a path'"):
        conf.load({"ADMIN_SCOPE": "not a path"})
