"""The operator console: filters, exact search, estimated counts, bounded paging, capped
payloads, confirmed actions, the background bulk action, the live view, explain()."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth.models import Permission, User

import durable_jobs as durable
from durable_jobs import store, testing
from durable_jobs.console import admin as console_admin
from durable_jobs.console import changelist, explain
from durable_jobs.runtime.reconciler import Reconciler
from tests.factories import JobFactory, live_worker, reload, running

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/durable_jobs/job/"


@pytest.fixture
def operator(client):
    def login(*perms: str, name: str = "op") -> User:
        user = User.objects.create_user(name, password="pw", is_staff=True)
        for codename in ("view_job", *perms):
            user.user_permissions.add(Permission.objects.get(codename=codename))
        client.force_login(user)
        return user

    return login


def listed(client, query: str = "") -> str:
    response = client.get(CHANGELIST + query)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def test_filters_narrow_the_list_to_what_they_name(client, operator):
    operator()
    pending = JobFactory(kind="tests.a")
    other_kind = JobFactory(kind="tests.b", queue_name="reports", tenant_id="acme")
    expired = running(lease_expires_at=-60)
    alive = running()
    parked = JobFactory(
        status="failed", parked_at=-1, finished_at=-1, error_code="poison", pending_since=None
    )
    held = JobFactory(
        held_since=-60,
        wait_for=[{"profile": "stock-level"}],
        wait_label="forged-label",
        next_run_at=30,
    )
    satisfied = JobFactory(held_since=-60, wait_satisfied_at=-1)

    page = listed(client, "?kind=tests.b")
    assert str(other_kind.id) in page and str(pending.id) not in page
    page = listed(client, "?queue=reports")
    assert str(other_kind.id) in page and str(pending.id) not in page
    page = listed(client, "?tenant=acme")
    assert str(other_kind.id) in page and str(pending.id) not in page
    in_org = JobFactory(tenant_id="acme", organization_id="eu")
    console_admin.console._choices_cache.clear()
    page = listed(client, "?organization=eu")
    assert str(in_org.id) in page and str(other_kind.id) not in page
    assert "?organization=eu" in page, "the organization is offered as a choice"
    page = listed(client, "?lease_expired=yes")
    assert str(expired.id) in page and str(alive.id) not in page
    assert "lease expired" in page, "the expired heartbeat is highlighted"
    page = listed(client, "?parked=poison")
    assert str(parked.id) in page and str(pending.id) not in page
    assert str(parked.id) not in listed(client, "?parked=mirror_failed")
    page = listed(client, "?held=yes")
    assert str(held.id) in page and str(satisfied.id) not in page and str(pending.id) not in page
    assert "stock-level" in page, "the held-by-wait label is a column"
    assert "forged-label" not in page, (
        "the label is rebuilt from the validated conditions (invariant 23)"
    )
    page = listed(client, "?status=running")
    assert str(alive.id) in page and str(pending.id) not in page
    assert str(expired.id) not in page, "running means a lease that has not expired"
    page = listed(client, "?status=lease_expired")
    assert str(expired.id) in page and str(alive.id) not in page


def test_filter_choices_include_kinds_in_the_table_and_registered_ones(client, operator):
    operator()
    console_admin.console._choices_cache.clear()
    JobFactory(kind="legacy.kind_from_another_deploy")
    page = listed(client)
    assert "?kind=legacy.kind_from_another_deploy" in page
    assert "?kind=demo.flaky" in page, "a registered kind is offered before any job of it exists"


def test_search_is_exact_on_keys_and_a_prefix_on_kinds(client, operator):
    operator()
    console_admin.console._choices_cache.clear()
    job = JobFactory(
        kind="reports.rebuild",
        idempotency_key="req-42",
        lock_key="report:7",
        subject_type="app.report",
        subject_id="7",
    )
    other = JobFactory(kind="tests.noop")
    for term in (str(job.id), str(job.id).upper(), "req-42", "report:7", "7", "reports.re"):
        page = listed(client, f"?q={term}")
        assert str(job.id) in page and str(other.id) not in page, term
    for near_miss in (str(job.id)[:8], "req-4", "eports"):
        assert str(job.id) not in listed(client, f"?q={near_miss}"), (
            f"{near_miss!r} is not an exact match"
        )


def test_a_large_result_shows_an_estimate_and_deep_pages_are_bounded(client, operator, monkeypatch):
    operator()
    jobs = [JobFactory() for _ in range(12)]
    monkeypatch.setattr(changelist, "EXACT_COUNT_BELOW", 0)
    monkeypatch.setattr(console_admin.JobAdmin, "list_per_page", 5)
    page = listed(client)
    assert "about " in page, "the planner's estimate is labelled as one"
    monkeypatch.setattr(changelist, "MAX_PAGES", 2)
    deep = listed(client, "?p=9999")
    newest_first = sorted(jobs, key=lambda j: (j.created_at, j.id), reverse=True)
    assert str(newest_first[5].id) in deep, "a page past the bound serves the last servable page"


def test_the_detail_page_groups_fields_caps_payloads_and_escapes(client, operator):
    operator()
    nested: object = "leaf"
    for _ in range(60):
        nested = {"k": nested, "pad": "x" * 300}
    job = JobFactory(
        kind="tests.noop",
        input=nested,
        meta={"note": "<script>alert(1)</script>"},
        next_run_at=3600,
        cancel_requested_at=-5,
        cancelled_by="admin:<b>eve</b>",
    )
    response = client.get(f"{CHANGELIST}{job.id}/change/")
    page = response.content.decode()
    for group in (
        "Identity and scope",
        "Why isn&#x27;t it running?",
        "Payloads",
        "Lease and delivery",
        "Budgets and counters",
        "Timeline",
        "Error",
    ):
        assert group in page, group
    assert "truncated" in page
    assert len(page) < 200_000, "a big nested payload no longer explodes into megabytes of HTML"
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    assert "<b>eve</b>" not in page
    assert "Cancellation was requested" in page and "not due until" in page


def test_explain_names_each_reason_a_pending_job_waits(settings):
    due = JobFactory(kind="demo.flaky")
    assert any("No live worker is running" in r for r in explain.explain(reload(due)))
    live_worker(kinds=("demo.flaky",))
    assert any("due since" in r for r in explain.explain(reload(due)))
    later = JobFactory(kind="demo.flaky", next_run_at=600)
    assert any("not due until" in r for r in explain.explain(reload(later)))
    unknown = JobFactory(kind="nobody.knows", queue_name="side")
    reasons = " ".join(explain.explain(reload(unknown)))
    assert "No live worker serves queue 'side'; workers serve 'default'." in reasons
    stray = JobFactory(kind="nobody.knows")
    reasons = " ".join(explain.explain(reload(stray)))
    assert "No live worker serving 'default' can run kind 'nobody.knows'" in reasons
    held = JobFactory(
        kind="demo.flaky",
        held_since=-120,
        wait_for=[{"after": "2030-01-01T00:00:00Z"}],
        wait_label="after 2030-01-01T00:00:00Z",
        next_run_at=60,
    )
    reasons = explain.explain(reload(held))
    assert any(
        "Waiting for after 2030-01-01T00:00:00Z" in r and "held since" in r for r in reasons
    ), reasons
    leased = JobFactory(kind="demo.flaky", lease_owner="w-1", lease_expires_at=30)
    assert any("lease is held by w-1" in r for r in explain.explain(reload(leased)))
    done = JobFactory(kind="demo.flaky", status="completed", finished_at=-1, pending_since=None)
    assert explain.explain(reload(done)) == [
        "It is completed: finished jobs never run again (start a new job instead)."
    ]


def test_an_action_asks_for_confirmation_and_changes_nothing_until_confirmed(client, operator):
    operator("cancel_job")
    jobs = [JobFactory(), JobFactory()]
    response = client.post(
        CHANGELIST, {"action": "cancel_jobs", "_selected_action": [str(j.id) for j in jobs]}
    )
    page = response.content.decode()
    assert response.status_code == 200 and "Request cancellation: 2 jobs" in page
    assert 'name="confirm" value="yes"' in page and "csrfmiddlewaretoken" in page
    assert all(reload(j).cancel_requested_at is None for j in jobs)


def test_select_all_starts_a_bulk_job_that_acts_on_every_match_in_chunks(
    client, operator, monkeypatch
):
    operator("cancel_job", "redrive_job")
    monkeypatch.setattr("durable_jobs.console.bulk.CHUNK", 3)
    # Every slice hands back after one chunk: the job resumes from its committed cursor.
    monkeypatch.setattr("durable_jobs.runtime.context.Slice.should_yield", lambda self: True)
    targets = [JobFactory(queue_name="side", next_run_at=3600) for _ in range(7)]
    finished = JobFactory(status="completed", queue_name="side", finished_at=-1, pending_since=None)
    untouched = JobFactory(status="pending", queue_name="elsewhere", next_run_at=3600)
    response = client.post(
        f"{CHANGELIST}?queue=side",
        {
            "action": "cancel_jobs",
            "select_across": "1",
            "_selected_action": [str(targets[0].id)],
            "index": "0",
            "confirm": "yes",
        },
        follow=True,
    )
    assert "Started a background job" in response.content.decode()
    assert all(reload(j).cancel_requested_at is None for j in targets), (
        "the request itself changed nothing"
    )
    bulk = testing.assert_started("durable_jobs.bulk_action", count=1)[0]
    assert bulk.input["filters"] == {"queue": "side"}
    slices = testing.run_jobs(queues=["default"])
    bulk = reload(bulk)
    assert bulk.status == "completed", bulk.error_message
    assert len(slices) == 4, "three chunks of three, each its own slice, then the empty read"
    assert bulk.result["changed"] == 7 and sum(bulk.result["refused"].values()) == 1
    assert bulk.processed_count == 8
    assert all(reload(j).cancelled_by == "admin:op" for j in targets)
    assert reload(untouched).cancel_requested_at is None and reload(finished).status == "completed"


def test_the_bulk_cancel_asks_each_cancelled_job_s_live_descendants_too(client, operator, kinds):
    from durable_jobs.models import Job
    from tests.integration.support import parent_with_live_children

    operator("cancel_job")
    parent, children = parent_with_live_children(kinds, count=2, queue="tree")
    grandchildren = list(Job.objects.filter(parent_id__in=[c.id for c in children]))
    client.post(
        f"{CHANGELIST}?kind=tests.tree.parent",
        {
            "action": "cancel_jobs",
            "select_across": "1",
            "_selected_action": [str(parent.id)],
            "index": "0",
            "confirm": "yes",
        },
    )
    bulk = testing.assert_started("durable_jobs.bulk_action", count=1)[0]
    testing.run_jobs(queues=["default"])
    bulk = reload(bulk)
    assert (bulk.status, bulk.result["changed"]) == ("completed", 1), bulk.error_message
    tree = [parent, *children, *grandchildren]
    assert [reload(j).cancelled_by for j in tree] == ["admin:op"] * 5


def test_a_cancelled_bulk_job_stops_between_chunks(client, operator, monkeypatch):
    operator("cancel_job")
    monkeypatch.setattr("durable_jobs.console.bulk.CHUNK", 2)
    monkeypatch.setattr("durable_jobs.runtime.context.Slice.should_yield", lambda self: True)
    targets = [JobFactory(queue_name="side", next_run_at=3600) for _ in range(6)]
    client.post(
        f"{CHANGELIST}?queue=side",
        {
            "action": "cancel_jobs",
            "select_across": "1",
            "index": "0",
            "_selected_action": [str(targets[0].id)],
            "confirm": "yes",
        },
    )
    bulk = testing.assert_started("durable_jobs.bulk_action", count=1)[0]
    testing.run_jobs(queues=["default"], max_slices=1)
    durable.cancel(bulk.id)
    Reconciler().run_pass()
    bulk = reload(bulk)
    assert bulk.status == "cancelled"
    assert bulk.processed_count == 2 and bulk.checkpoint["changed"] == 2
    assert sum(reload(j).cancel_requested_at is not None for j in targets) == 2, (
        "only the first chunk ran"
    )


def test_the_live_view_reports_progress_and_honours_permissions(client, operator):
    job = JobFactory(total_count=10, processed_count=3)
    assert client.get(f"{CHANGELIST}live/?id={job.id}").status_code == 302, (
        "anonymous: to the login page"
    )
    user = User.objects.create_user("staff-no-perm", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(f"{CHANGELIST}live/?id={job.id}").status_code == 403
    operator()
    data = json.loads(client.get(f"{CHANGELIST}live/?id={job.id}&id=not-a-uuid").content or b"{}")
    assert data == {"error": "not a job id"}
    data = json.loads(client.get(f"{CHANGELIST}live/?id={job.id}").content)
    assert data["jobs"][str(job.id)] == {
        "status": "pending",
        "stored_status": "pending",
        "processed": 3,
        "total": 10,
        "percent": 30,
        "live": True,
    }


@pytest.mark.django_db(transaction=True)
def test_the_bulk_cancel_skips_a_row_a_worker_holds_and_counts_it_busy(
    client, operator, other_connection
):
    operator("cancel_job")
    targets = [JobFactory(queue_name="side", next_run_at=3600) for _ in range(4)]
    held = targets[1]
    client.post(
        f"{CHANGELIST}?queue=side",
        {
            "action": "cancel_jobs",
            "select_across": "1",
            "index": "0",
            "_selected_action": [str(targets[0].id)],
            "confirm": "yes",
        },
    )
    bulk = testing.assert_started("durable_jobs.bulk_action", count=1)[0]
    with other_connection.transaction():  # a worker's fenced() transaction holding one job row
        other_connection.execute(
            "SELECT 1 FROM durable_jobs_job WHERE id = %s FOR UPDATE", [held.id]
        )
        testing.run_jobs(queues=["default"])
    bulk = reload(bulk)
    assert bulk.status == "completed", bulk.error_message
    assert bulk.result["changed"] == 3
    assert bulk.result["refused"] == {"busy (a worker held the row); try again": 1}
    assert reload(held).cancel_requested_at is None
    assert all(reload(j).cancelled_by == "admin:op" for j in targets if j.id != held.id)


def test_request_cancel_many_matches_each_job_by_its_own_scope_and_live_status():

    mine = JobFactory(tenant_id="acme", organization_id="eu")
    tenant_wide = JobFactory(tenant_id="acme")
    finished = JobFactory(tenant_id="acme", status="completed", finished_at=-1, pending_since=None)
    changed = store.request_cancel_many(
        [
            (mine.id, "acme", "eu"),
            (tenant_wide.id, "acme", "eu"),  # wrong organization: a null one is not a wildcard
            (finished.id, "acme", None),
        ],
        by="admin:op",
    )
    assert changed == {mine.id}
    assert reload(mine).cancelled_by == "admin:op"
    assert (
        reload(tenant_wide).cancel_requested_at is None
        and reload(finished).cancel_requested_at is None
    )


def badge(page: str, job) -> str:
    """The word the status badge of ``job`` shows on ``page``."""
    found = re.search(rf"data-dj-status='{job.id}'[^>]*>([^<]*)</span>", page)
    assert found, f"no status badge for {job.id}"
    return found.group(1)


def test_a_released_lease_shows_waiting_and_an_expired_one_lease_expired_everywhere(
    client, operator
):
    """A running row without a lease (a failed slice waiting out its backoff, a claim
    handed back unstarted) is "waiting"; a held lease past its expiry, during a takeover,
    is "lease expired": the same word on the badge, the job page, the live view, the
    confirmation page and the status filter."""
    operator("cancel_job")
    retrying = running(
        lease_owner=None, lease_expires_at=-5, next_run_at=30, consecutive_failures=1
    )
    handed_back = running(lease_owner=None, lease_expires_at=-1, next_run_at=-1)
    expired = running(lease_expires_at=-60, heartbeat_at=-90)
    alive = running()
    pending = JobFactory()
    words = {
        retrying: "waiting",
        handed_back: "waiting",
        expired: "lease expired",
        alive: "running",
        pending: "pending",
    }
    page = listed(client)
    for job, word in words.items():
        assert badge(page, job) == word, job
        detail = client.get(f"{CHANGELIST}{job.id}/change/").content.decode()
        assert badge(detail, job) == word, job
        assert f"{job.id} ({word})" in detail, "the heading names the same word"
    ids = "&".join(f"id={job.id}" for job in words)
    live = json.loads(client.get(f"{CHANGELIST}live/?{ids}").content)["jobs"]
    assert {job: live[str(job.id)]["status"] for job in words} == words
    assert live[str(retrying.id)]["stored_status"] == "running"
    for word in ("waiting", "running", "lease_expired", "pending"):
        page = listed(client, f"?status={word}")
        shown = {job for job in words if str(job.id) in page}
        assert shown == {job for job, w in words.items() if w == word.replace("_", " ")}, word
    assert "?status=waiting" in listed(client), "the status filter offers waiting"
    confirm = client.post(
        CHANGELIST, {"action": "cancel_jobs", "_selected_action": [str(retrying.id)]}
    ).content.decode()
    assert "(waiting)" in confirm


def test_display_status_and_its_filter_are_one_definition():
    from durable_jobs.console.display import DISPLAY_STATUSES, display_status
    from durable_jobs.console.live import display_status_q
    from durable_jobs.models import Job

    rows = [
        running(lease_owner=None, next_run_at=30),
        running(lease_expires_at=-60),
        running(),
        JobFactory(),
        JobFactory(status="completed", finished_at=-1, pending_since=None),
        JobFactory(status="failed", finished_at=-1, pending_since=None),
        JobFactory(status="cancelled", finished_at=-1, pending_since=None),
    ]
    ids = [job.id for job in rows]
    for word in DISPLAY_STATUSES:
        filtered = set(
            Job.objects.filter(display_status_q(word), id__in=ids).values_list("id", flat=True)
        )
        shown = {job.id for job in map(reload, rows) if display_status(job) == word}
        assert filtered == shown and len(shown) == 1, word
