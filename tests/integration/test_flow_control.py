"""Flow control (invariant 26): concurrency per key, rate limits, fair shares, runtime limits.

Claims go through the one claim statement (store.dequeue); the races use a second raw
connection whose claim commits between our statement's snapshot and its lock.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.limits import claims
from durable_jobs.models import Job
from tests.integration.support import FAIL_DEFAULTS, lease_of

TTL_MS = 30_000


def _claim(limit: int = 10, owner: str = "w1") -> list[Job]:
    return store.dequeue(
        ["default"], owner, TTL_MS, kinds=None, limit=limit, flow=claims.claim_settings()
    )


def _claim_on(conn, limit: int = 10, owner: str = "w2") -> list:
    params = store.claim_params(
        ["default"], owner, TTL_MS, kinds=None, limit=limit, flow=claims.claim_settings()
    )
    return [row[0] for row in conn.execute(store.DEQUEUE, params).fetchall()]


@pytest.fixture
def limited(kinds):
    """A kind whose jobs count against one key per input account, two at a time."""
    kinds.add("flow.limited", flow=durable.FlowControl(key="input:account", concurrency=2))
    kinds.add("flow.free")
    return "flow.limited"


@pytest.mark.django_db
def test_start__stores_the_flow_key_its_kind_chooses(limited, kinds):
    kinds.add("flow.tenant", flow=durable.FlowControl(key="tenant"))
    job = durable.start(limited, input={"account": 7})
    [many] = durable.start_many([{"kind": "flow.tenant"}], scope="acme")

    assert Job.objects.get(id=job.id).flow_key == "flow.limited:account=7"
    assert Job.objects.get(id=many).flow_key == "tenant:acme"
    assert durable.start("flow.free").flow_key is None


@pytest.mark.django_db
def test_dequeue__a_batch_never_takes_more_permits_than_the_key_has(limited):
    """Invariant 26: a batched claim of 10 takes two of one key's jobs, not three."""
    for _ in range(5):
        durable.start(limited, input={"account": 1})

    assert len(_claim(10)) == 2
    assert _claim(10) == []


@pytest.mark.django_db
def test_dequeue__a_full_key_starves_neither_other_keys_nor_unkeyed_jobs(limited):
    for _ in range(20):
        durable.start(limited, input={"account": 1})
    assert len(_claim(10)) == 2  # account 1 is full; 18 of its jobs wait
    other = durable.start(limited, input={"account": 2})
    free = durable.start("flow.free")

    rest = _claim(10)

    assert {other.id, free.id} <= {j.id for j in rest}
    assert all(j.flow_key != "flow.limited:account=1" for j in rest)


@pytest.mark.django_db
@pytest.mark.parametrize("release", ["yield", "fail", "complete", "orphan_take"])
def test_dequeue__a_permit_comes_back_when_its_lease_is_released_or_taken_over(limited, release):
    """Invariant 26: yield, a failed slice, the end, or an orphan take release the permit,
    with no bookkeeping of their own; the key's next job is claimed."""
    for _ in range(3):
        durable.start(limited, input={"account": 1})
    first, _ = _claim(10)
    lease = lease_of(first)
    assert _claim(10) == []

    if release == "yield":
        store.yield_slice(lease)
    elif release == "fail":
        store.fail_slice(lease, **{**FAIL_DEFAULTS, "backoff_base_ms": 60_000})
    elif release == "complete":
        store.complete(lease)
    else:
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {store.TABLE} SET lease_expires_at = now() - interval '1 hour' WHERE id = %s",
                [first.id],
            )
        assert store.take_orphan(first.id, grace_ms=0, backoff_ms=3_600_000) is not None

    assert len(_claim(10)) == (1 if release == "yield" else 1)


@pytest.mark.django_db
def test_dequeue__an_expired_lease_still_holds_its_permit_until_taken_over(limited):
    """Invariant 26: an expired lease's worker may still write until the epoch moves."""
    for _ in range(3):
        durable.start(limited, input={"account": 1})
    first, second = _claim(10)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {store.TABLE} SET lease_expires_at = now() - interval '1 hour' WHERE id = %s",
            [first.id],
        )

    assert _claim(10) == []


@pytest.mark.django_db(transaction=True)
def test_dequeue__a_claim_committed_after_our_snapshot_still_counts(limited, other_connection):
    """Invariant 26, the race: another claim takes the key's last permit and commits while
    our claim statement (snapshot already taken) waits for the key row; ours must not
    take a third permit. A count of leased job rows would read the old snapshot here."""
    kinds_limit_one = durable.FlowControl(key="kind", concurrency=1)
    from durable_jobs import registry

    registry.unregister("flow.limited")
    registry.handler("flow.limited", flow=kinds_limit_one)(lambda job: "done")
    for _ in range(3):
        durable.start("flow.limited", input={"account": 1})
    durable.set_flow_limit("kind:flow.limited", concurrency=1)  # the key row exists

    other_connection.execute("BEGIN")
    assert len(_claim_on(other_connection, 10)) == 1  # holds the key row, uncommitted
    ours: list = []
    waiting = threading.Thread(target=lambda: ours.extend(_claim_in_thread()))
    waiting.start()
    time.sleep(0.5)  # our statement is now blocked on the key row, its snapshot taken
    other_connection.execute("COMMIT")
    waiting.join(10)

    assert ours == []
    assert Job.objects.filter(status="running", lease_owner__isnull=False).count() == 1


def _claim_in_thread() -> list:
    try:
        return [j.id for j in _claim(10, owner="w3")]
    finally:
        connection.close()


@pytest.mark.django_db
def test_dequeue__a_rate_limit_admits_its_starts_per_window_under_a_burst(kinds):
    kinds.add(
        "flow.rated", flow=durable.FlowControl(key="queue", rate=durable.Rate(limit=3, per=60))
    )
    for _ in range(10):
        durable.start("flow.rated")

    first = _claim(10)
    for job in first:
        store.complete(lease_of(job))

    assert len(first) == 3
    assert _claim(10) == []  # finished, yet the window still holds their three starts


@pytest.mark.django_db
def test_set_flow_limit__takes_effect_at_the_next_claim(limited):
    for _ in range(5):
        durable.start(limited, input={"account": 1})
    assert len(_claim(10)) == 2

    durable.set_flow_limit("flow.limited:account=1", concurrency=3, by="ops")
    assert len(_claim(10)) == 1
    durable.set_flow_limit("flow.limited:account=1", concurrency=0)
    assert _claim(10) == []

    [state] = durable.flow_keys()
    assert (state.key, state.concurrency, state.running, state.waiting) == (
        "flow.limited:account=1",
        0,
        3,
        2,
    )
    durable.set_flow_limit("flow.limited:account=1", clear=["concurrency"])
    assert durable.flow_keys()[0].concurrency == 2


@pytest.mark.django_db
def test_set_flow_limit__refuses_nonsense_with_a_message_naming_it():
    with pytest.raises(durable.InvalidInput, match="clear"):
        durable.set_flow_limit("k", clear=["speed"])
    with pytest.raises(durable.InvalidInput, match="concurrency"):
        durable.set_flow_limit("k", concurrency=-1)


@pytest.mark.django_db
def test_dequeue__a_tenant_flood_delays_another_tenants_job_by_a_claim_or_two(kinds):
    """Fair claiming: tenant B's one job is claimed within two claims of its start, however
    many of tenant A's wait; priority still orders A's own jobs."""
    kinds.add("flow.fair", flow=durable.FlowControl(key="tenant"))
    durable.start_many([{"kind": "flow.fair"} for _ in range(2000)], scope="a")
    urgent = durable.start("flow.fair", scope="a", priority=5)
    for _ in range(5):
        _claim(1)  # A has been served for a while
    lone = durable.start("flow.fair", scope="b")

    claimed = [job.id for _ in range(2) for job in _claim(1)]

    assert lone.id in claimed
    assert (
        Job.objects.get(id=urgent.id).status == "running"
    )  # A's first claim took its priority-5 job


@pytest.mark.django_db
def test_cli__set_limit_and_limits_show_a_key_and_its_occupancy(limited):
    import io
    import json

    from django.core.management import call_command

    for _ in range(4):
        durable.start(limited, input={"account": 9})
    _claim(10)
    out = io.StringIO()
    call_command(
        "durable_jobs", "set-limit", "flow.limited:account=9", "--concurrency", "3", stdout=out
    )
    assert "concurrency 3" in out.getvalue()
    assert len(_claim(10)) == 1

    out = io.StringIO()
    call_command("durable_jobs", "limits", "--json", stdout=out)
    [key] = json.loads(out.getvalue())
    assert (key["key"], key["concurrency"], key["running"], key["waiting"]) == (
        "flow.limited:account=9",
        3,
        3,
        1,
    )
    assert key["changed_by"] == "cli"
    out = io.StringIO()
    call_command(
        "durable_jobs",
        "explain",
        str(Job.objects.filter(status="pending").get().id),
        "--json",
        stdout=out,
    )
    codes = [reason["code"] for reason in json.loads(out.getvalue())["reasons"]]
    assert "concurrency_full" in codes


@pytest.mark.django_db
def test_stats__show_each_key_s_occupancy(limited):
    from durable_jobs.console import stats

    for _ in range(3):
        durable.start(limited, input={"account": 5})
    _claim(10)

    figures = stats.collect()["flow_keys"]["flow.limited:account=5"]

    assert (figures["running"], figures["concurrency"], figures["waiting"]) == (2, 2, 1)


@pytest.mark.django_db
def test_the_default_claim_never_takes_a_keyed_job(limited):
    """Invariant 26: without ``flow`` the claim is DEQUEUE_OPEN, blind to keyed jobs."""
    keyed = durable.start(limited, input={"account": 3})
    free = durable.start("flow.free")

    assert [j.id for j in store.dequeue(["default"], "w", TTL_MS, kinds=None, limit=10)] == [
        free.id
    ]
    assert [j.id for j in _claim(10)] == [keyed.id]


@pytest.mark.django_db
def test_a_worker_claims_through_the_keys_only_while_keyed_jobs_wait(kinds):
    """The keyed claim is used while a keyed job waits in the worker's queues, whatever
    kinds have a policy here (another deploy's job, or one an operator limits)."""
    from tests.factories import JobFactory

    kinds.add("flow.plain")
    claims._looked.clear()
    assert claims.for_claim(["default"]) is None
    JobFactory(kind="flow.plain", flow_key="ops:limited")

    assert claims.for_claim(["default"]) is None  # the look is remembered a moment
    assert claims.keyed_work(["default"])  # a short claim looks again at once
    assert claims.for_claim(["default"]) is not None


@pytest.mark.django_db(transaction=True)
def test_dequeue__a_rate_limit_holds_under_a_burst_of_concurrent_claims(kinds):
    """Eight connections claim at once from a key allowed 3 starts a minute: 3 start."""
    kinds.add(
        "flow.burst", flow=durable.FlowControl(key="kind", rate=durable.Rate(limit=3, per=60))
    )
    durable.start_many([{"kind": "flow.burst"} for _ in range(40)])
    barrier = threading.Barrier(8)
    taken: list = []

    def burst() -> None:
        try:
            barrier.wait()
            taken.extend(_claim(5, owner=f"w{threading.get_ident()}"))
        finally:
            connection.close()

    threads = [threading.Thread(target=burst) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)

    assert len(taken) == 3
    assert Job.objects.filter(status="running").count() == 3


@pytest.mark.django_db
def test_dequeue__weights_share_the_claims_between_busy_tenants(kinds):
    """A tenant of weight 3 is claimed three times as often as one of weight 1."""
    kinds.add("flow.weighted", flow=durable.FlowControl(key="tenant"))
    durable.set_flow_limit("tenant:heavy", weight=3)
    durable.start_many([{"kind": "flow.weighted"} for _ in range(20)], scope="heavy")
    durable.start_many([{"kind": "flow.weighted"} for _ in range(20)], scope="light")

    tenants = [job.tenant_id for _ in range(12) for job in _claim(1)]

    assert tenants.count("heavy") == 9 and tenants.count("light") == 3, tenants


@pytest.mark.django_db
def test_a_spawned_child_counts_against_its_kind_s_flow_key(kinds):
    """Invariant 26 reaches workflows: a child gets its kind's flow key as a start does, so
    its kind's limit holds for spawned children too."""
    from durable_jobs import testing

    def parent(job):
        if not job.checkpoint:
            with job.fenced():
                job.spawn_many(
                    [{"kind": "flow.child", "key": f"c{i}", "input": {"i": i}} for i in range(3)]
                )
                job.save_checkpoint({"spawned": True})
            return job.wait_for_children()
        return durable.DONE

    kinds.add("flow.parent", parent)
    kinds.add("flow.child", flow=durable.FlowControl(key="kind", concurrency=1))
    root = durable.start("flow.parent", scope="acme")
    testing.run_jobs(max_slices=1)

    children = Job.objects.filter(parent_id=root.id)
    assert {c.flow_key for c in children} == {"kind:flow.child"}
    assert len(_claim(10)) == 1  # one permit for the three children


@pytest.mark.django_db
def test_flow_keys_setting__binds_the_claim_under_an_operator_s_limit(kinds, settings):
    """The limits in force, first to last: the operator's, the key's FLOW_KEYS entry, the
    kind's FlowControl. The kind allows 3 at once; FLOW_KEYS says 1 for one account."""
    kinds.add("flow.keyed", flow=durable.FlowControl(key="input:account", concurrency=3))
    settings.DURABLE_JOBS = {
        **settings.DURABLE_JOBS,
        "FLOW_KEYS": {"flow.keyed:account=1": {"concurrency": 1}},
    }
    for account in (1, 2):
        for _ in range(5):
            durable.start("flow.keyed", input={"account": account})

    taken = [job.flow_key for job in _claim(10)]

    assert taken.count("flow.keyed:account=1") == 1  # the setting, not the kind's 3
    assert taken.count("flow.keyed:account=2") == 3  # no entry: the kind's limit
    assert _claim(10) == []

    durable.set_flow_limit("flow.keyed:account=1", concurrency=2, by="ops")
    assert [job.flow_key for job in _claim(10)] == ["flow.keyed:account=1"]
    state = {s.key: s for s in durable.flow_keys()}["flow.keyed:account=1"]
    assert (state.concurrency, state.running, state.waiting) == (2, 2, 3)

    durable.set_flow_limit("flow.keyed:account=1", clear=["concurrency"])
    state = {s.key: s for s in durable.flow_keys()}["flow.keyed:account=1"]
    assert state.concurrency == 1  # the setting applies again
    assert _claim(10) == []


@pytest.mark.django_db
def test_metrics__the_flow_gauges_show_each_key_s_running_limit_and_waiting(limited, kinds, client):
    from django.contrib.auth.models import Permission, User

    kinds.add(
        "flow.rated_only",
        flow=durable.FlowControl(key="kind", rate=durable.Rate(limit=1, per=3600)),
    )
    for _ in range(5):
        durable.start(limited, input={"account": 4})
    durable.start("flow.rated_only")
    durable.start("flow.rated_only")
    _claim(10)
    durable.set_flow_limit("flow.limited:account=4", concurrency=3)  # lifted at runtime
    _claim(10)
    user = User.objects.create_user("scraper", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(user)

    text = client.get("/metrics/durable-jobs").content.decode()

    key = 'key="flow.limited:account=4"'
    assert f"durable_jobs_flow_running{{{key}}} 3.0" in text
    assert f"durable_jobs_flow_limit{{{key}}} 3.0" in text
    assert f"durable_jobs_flow_waiting{{{key}}} 2.0" in text
    rated = 'key="kind:flow.rated_only"'
    assert f"durable_jobs_flow_running{{{rated}}} 1.0" in text
    assert f"durable_jobs_flow_waiting{{{rated}}} 1.0" in text
    assert f"durable_jobs_flow_limit{{{rated}}}" not in text  # no concurrency limit anywhere


def _flow_admin_user(name: str, *perms: str):
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(name, password="pw", is_staff=True)
    for codename in ("view_flowkey", *perms):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def _flow_key_page(key: str) -> str:
    from django.contrib.admin.utils import quote
    from django.urls import reverse

    return reverse("admin:durable_jobs_flowkey_change", args=[quote(key)])


@pytest.mark.django_db
def test_admin__an_operator_changes_a_key_s_limit_in_force_at_the_next_claim(limited, client):
    for _ in range(5):
        durable.start(limited, input={"account": 8})
    assert len(_claim(10)) == 2
    client.force_login(_flow_admin_user("ops", "change_flow_limit"))

    page = client.get(_flow_key_page("flow.limited:account=8"))
    saved = client.post(
        _flow_key_page("flow.limited:account=8"),
        {"concurrency": "3", "rate": "", "rate_window_ms": "", "weight": "", "_save": "Save"},
    )

    assert page.status_code == 200
    assert saved.status_code == 302, saved.content.decode()[:2000]
    [state] = durable.flow_keys()
    assert (state.key, state.concurrency, state.changed_by) == ("flow.limited:account=8", 3, "ops")
    assert len(_claim(10)) == 1
    listing = client.get("/admin/durable_jobs/flowkey/").content.decode()
    assert "3 / 3" in listing  # running / limit

    client.post(
        _flow_key_page("flow.limited:account=8"),
        {"concurrency": "", "rate": "", "rate_window_ms": "", "weight": "", "_save": "Save"},
    )
    [state] = durable.flow_keys()
    assert (state.operator_concurrency, state.concurrency) == (None, 2)  # blank: the kind's again


@pytest.mark.django_db
def test_admin__a_user_without_the_permission_cannot_change_a_limit(limited, client):
    durable.start(limited, input={"account": 8})
    durable.set_flow_limit("flow.limited:account=8", concurrency=1, by="ops")
    client.force_login(_flow_admin_user("viewer"))

    refused = client.post(
        _flow_key_page("flow.limited:account=8"),
        {"concurrency": "50", "rate": "", "rate_window_ms": "", "weight": "", "_save": "Save"},
    )
    added = client.post(
        "/admin/durable_jobs/flowkey/add/",
        {"key": "tenant:new", "concurrency": "5", "_save": "Save"},
    )

    assert refused.status_code == 403
    assert added.status_code == 403
    assert [(s.key, s.concurrency, s.changed_by) for s in durable.flow_keys()] == [
        ("flow.limited:account=8", 1, "ops")
    ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("concurrency", "-1", "must be positive"),
        ("concurrency", "many", "Enter a whole number."),
        ("weight", "0", "must be a positive number"),
        ("rate", "0", "must be positive"),
    ],
)
def test_admin__bad_input_gets_a_one_line_error_and_changes_nothing(
    limited, client, field, value, message
):
    durable.start(limited, input={"account": 8})
    durable.set_flow_limit("flow.limited:account=8", concurrency=1, by="ops")
    client.force_login(_flow_admin_user("ops2", "change_flow_limit"))
    form = {"concurrency": "1", "rate": "", "rate_window_ms": "", "weight": "", "_save": "Save"}

    answer = client.post(_flow_key_page("flow.limited:account=8"), {**form, field: value})

    assert answer.status_code == 200  # the form again, not a redirect
    errors = answer.context["adminform"].form.errors
    assert list(errors) == [field] and len(errors[field]) == 1
    assert message in errors[field][0] and "\n" not in errors[field][0]
    assert message in answer.content.decode()
    [state] = durable.flow_keys()
    assert (state.operator_concurrency, state.operator_rate, state.operator_weight) == (
        1,
        None,
        None,
    )
    assert state.changed_by == "ops"
