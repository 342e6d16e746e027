"""Workflows against the real store: children, fan-in, events, durable sleep (invariants 29, 30).

Slices run in-process through ``durable_jobs.testing.run_jobs``, one after another, so
each test reads like the life of a small tree of jobs.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

import durable_jobs as durable
from durable_jobs import store, testing
from durable_jobs.exceptions import InvalidInput, JobNotFound
from durable_jobs.models import Job
from durable_jobs.states import Delivery
from tests.factories import reload

pytestmark = pytest.mark.django_db

PARENT, CHILD = "tests.flow.parent", "tests.flow.child"


def children_of(job) -> list[Job]:
    return list(Job.objects.filter(parent_id=job.id).order_by("spawn_key"))


def summing_parent(policy="fail", count=3):
    """Spawn ``count`` children, wait for them, and finish with the sum of their results."""

    def parent(job):
        if not job.checkpoint:
            with job.fenced():
                job.spawn_many(
                    [{"kind": CHILD, "key": f"c{i}", "input": {"n": i}} for i in range(count)]
                )
                job.save_checkpoint({"spawned": True})
            return job.wait_for_children(policy=policy)
        outcomes = job.children()
        return durable.Done(
            {
                "sum": sum(c.result["n"] for c in outcomes if c.status == "completed"),
                "statuses": [c.status for c in outcomes],
            }
        )

    return parent


def test_parent__waits_for_its_children_and_reads_their_results(kinds):
    kinds.add(PARENT, summing_parent())
    kinds.add(CHILD, lambda job: durable.Done({"n": job.input["n"] * 10}))
    parent = durable.start(PARENT, scope=durable.Scope(tenant="acme", organization="north"))

    testing.run_jobs(max_slices=1)
    held = reload(parent)
    assert (held.status, held.lease_owner, held.next_run_at) == ("pending", None, None)
    assert [c.spawn_key for c in children_of(parent)] == ["c0", "c1", "c2"]
    assert {(c.tenant_id, c.organization_id) for c in children_of(parent)} == {("acme", "north")}

    testing.run_jobs()
    done = reload(parent)
    assert done.status == "completed"
    assert done.result == {"sum": 30, "statuses": ["completed"] * 3}


def test_spawn__outside_a_fenced_block_is_a_clear_error(kinds):
    def parent(job):
        job.spawn(CHILD, key="only")
        return durable.DONE

    kinds.add(PARENT, parent)
    job = durable.start(PARENT)
    testing.run_jobs()
    row = reload(job)
    assert row.status == "failed"
    assert "inside `with job.fenced():`" in row.error_message
    assert children_of(job) == []


def test_spawn__a_rerun_slice_finds_the_child_it_already_started(kinds):
    """Invariant 29: the second slice spawns the same keys again and adds nothing."""
    calls = []

    def parent(job):
        calls.append(1)
        with job.fenced():
            ids = job.spawn_many([{"kind": CHILD, "key": "a"}, {"kind": CHILD, "key": "b"}])
        if len(calls) == 1:
            raise RuntimeError("crash after the spawn committed, before the checkpoint")
        return durable.Done({"ids": [str(i) for i in ids]})

    kinds.add(PARENT, parent, max_consecutive_failures=3)
    kinds.add(CHILD)
    job = durable.start(PARENT)
    testing.run_jobs(max_slices=1)
    testing.fast_forward(job)
    testing.run_jobs()
    row = reload(job)
    assert row.status == "completed"
    assert sorted(row.result["ids"]) == sorted(str(c.id) for c in children_of(job))
    assert len(children_of(job)) == 2
    assert row.children_total == 2


def test_spawn__a_stale_epoch_starts_nothing(kinds):
    from tests.integration.support import claim, lease_of

    kinds.add(PARENT)
    job = durable.start(PARENT)
    row, lease = claim(job, scope=durable.Scope(tenant=job.tenant_id))
    stale = lease_of(row, epoch=row.lease_epoch - 1)
    rows = [{"id": "00000000-0000-0000-0000-000000000001", "kind": CHILD, "spawn_key": "k"}]
    assert store.spawn_children(stale, rows, notify_channel=None) is None
    assert children_of(job) == []


def test_wait_for_children__policy_fail_ends_the_parent_child_failed(kinds):
    kinds.add(PARENT, summing_parent(policy="fail"))

    def child(job):
        if job.input["n"] == 1:
            raise durable.TerminalError("bad chunk", code="bad_chunk")
        return durable.Done({"n": 1})

    kinds.add(CHILD, child)
    parent = durable.start(PARENT)
    testing.run_jobs()
    row = reload(parent)
    assert (row.status, row.error_code) == ("failed", "child_failed")


def test_wait_for_children__policy_cancel_fails_the_parent_and_cancels_live_siblings(kinds):
    from durable_jobs.runtime.reconciler import Reconciler

    def parent(job):
        if not job.checkpoint:
            with job.fenced():
                job.spawn(CHILD, key="bad")
                job.spawn_many([{"kind": "tests.flow.sleeper", "key": k} for k in ("s1", "s2")])
                job.save_checkpoint({"spawned": True})
            return job.wait_for_children(policy="cancel")
        return durable.Done("resumed")  # never: the policy ends it first

    def child(job):
        raise durable.TerminalError("bad chunk", code="bad_chunk")

    kinds.add(PARENT, parent)
    kinds.add(CHILD, child)
    kinds.add("tests.flow.sleeper", lambda job: job.sleep(timedelta(hours=1)))
    started = durable.start(PARENT)
    testing.run_jobs()
    row = reload(started)
    assert (row.status, row.error_code) == ("failed", "child_failed")
    assert "wait policy 'cancel'" in row.error_message
    siblings = [c for c in children_of(started) if c.spawn_key != "bad"]
    assert [c.cancelled_by for c in siblings] == [f"job:{started.id}"] * 2
    while Reconciler().run_pass().cancelled:
        pass
    assert [(c.spawn_key, c.status) for c in children_of(started)] == [
        ("bad", "failed"),
        ("s1", "cancelled"),
        ("s2", "cancelled"),
    ]


def test_wait_for_children__a_finished_waits_policy_never_fails_a_later_slice(kinds):
    """A parent whose fan-in (policy fail) ended cleanly, then spawns a child that fails and
    yields without waiting: the old wait's policy is not its policy any more."""

    def parent(job):
        step = (job.checkpoint or {}).get("step", 0)
        if step == 0:
            with job.fenced():
                job.spawn(CHILD, key="first", input={"fail": False})
                job.save_checkpoint({"step": 1})
            return job.wait_for_children(policy="fail")
        if step == 1:
            with job.fenced():
                job.spawn(CHILD, key="second", input={"fail": True})
                job.save_checkpoint({"step": 2})
            return durable.YIELD
        return durable.Done({"children": [c.status for c in job.children()]})

    def child(job):
        if job.input["fail"]:
            raise durable.TerminalError("bad chunk", code="bad_chunk")
        return durable.DONE

    kinds.add(PARENT, parent)
    kinds.add(CHILD, child)
    started = durable.start(PARENT)
    testing.run_jobs()
    row = reload(started)
    assert (row.status, row.error_code) == ("completed", None)
    assert sorted(row.result["children"]) == ["completed", "failed"]


def test_claim__a_delivery_never_claims_a_job_held_by_a_workflow_wait(kinds):
    """Invariant 30 on the delivery path (store.claim, a broker's): a hold is not claimable,
    whatever (seq, redrives) a delivery carries."""
    kinds.add(PARENT, summing_parent())
    kinds.add(CHILD, lambda job: durable.Done({"n": 1}))
    parent = durable.start(PARENT)
    testing.run_jobs(max_slices=1)  # the parent's first slice: spawns, then holds
    held = reload(parent)
    assert (held.status, held.next_run_at, held.lease_owner) == ("pending", None, None)

    scope = durable.Scope(tenant=held.tenant_id, organization=held.organization_id)
    delivery = Delivery(seq=held.continuation_seq, redrives=held.redrives)
    assert store.claim(held.id, scope, delivery, "broker-consumer", 30_000) is None


def test_wait_for_children__policy_continue_resumes_with_every_outcome(kinds):
    kinds.add(PARENT, summing_parent(policy="continue"))

    def child(job):
        if job.input["n"] == 1:
            raise durable.TerminalError("bad chunk", code="bad_chunk")
        return durable.Done({"n": job.input["n"]})

    kinds.add(CHILD, child)
    parent = durable.start(PARENT)
    testing.run_jobs()
    row = reload(parent)
    assert row.status == "completed"
    assert row.result == {"sum": 2, "statuses": ["completed", "failed", "completed"]}


def test_wait_for_children__policy_wait_resumes_after_the_failed_child_is_redriven(kinds):
    kinds.add(PARENT, summing_parent(policy="wait", count=2))
    attempts = []

    def child(job):
        if job.input["n"] == 1 and not attempts:
            attempts.append(1)
            raise durable.TerminalError("flaky upstream", code="upstream")
        return durable.Done({"n": job.input["n"]})

    kinds.add(CHILD, child)
    parent = durable.start(PARENT)
    testing.run_jobs()
    assert reload(parent).status == "pending"  # still waiting: one child failed
    failed = [c for c in children_of(parent) if c.status == "failed"]
    assert len(failed) == 1
    durable.redrive(failed[0].id, scope=durable.Scope(tenant=parent.tenant_id))
    testing.run_jobs()
    row = reload(parent)
    assert row.status == "completed"
    assert row.result["statuses"] == ["completed", "completed"]


def test_wait_for_children__at_least_one_resumes_the_parent_early(kinds):
    def parent(job):
        if not job.checkpoint:
            with job.fenced():
                job.spawn(CHILD, key="fast", input={"n": 1})
                job.spawn("tests.flow.sleeper", key="never")
                job.save_checkpoint({"spawned": True})
            return job.wait_for_children(at_least=1)
        return durable.Done([c.status for c in job.children()])

    kinds.add(PARENT, parent)
    kinds.add(CHILD, lambda job: durable.Done({"n": 1}))
    kinds.add("tests.flow.sleeper", lambda job: job.sleep(timedelta(hours=1)))
    job = durable.start(PARENT)
    testing.run_jobs()
    assert reload(job).result == ["completed", "pending"]


def test_wait_for_children__each_wait_wakes_the_parent_exactly_once(kinds):
    """Two waits in a row: every wake comes from a child's end, never a spurious one."""
    wakes = []

    def parent(job):
        if not job.checkpoint:
            with job.fenced():
                job.spawn_many([{"kind": CHILD, "key": k} for k in ("a", "b")])
                job.save_checkpoint({"seen": 0})
            return job.wait_for_children(at_least=1)
        ended = sum(1 for c in job.children() if c.ended)
        wakes.append(ended)
        if ended < 2:
            with job.fenced():
                job.save_checkpoint({"seen": ended})
            return job.wait_for_children(at_least=ended + 1)
        return durable.DONE

    kinds.add(PARENT, parent)
    kinds.add(CHILD)
    job = durable.start(PARENT)
    testing.run_jobs()
    assert reload(job).status == "completed"
    assert wakes[-1] == 2 and wakes == sorted(wakes)


def test_children__are_cancelled_with_their_parent_in_bounded_batches(kinds):
    def parent(job):
        with job.fenced():
            job.spawn_many([{"kind": CHILD, "key": f"c{i:04d}"} for i in range(1_000)])
        return job.wait_for_children()

    kinds.add(PARENT, parent)
    kinds.add(CHILD)
    job = durable.start(PARENT)
    testing.run_jobs(max_slices=1)
    assert reload(job).children_total == 1_000
    durable.cancel(job.id, scope=durable.Scope(tenant=job.tenant_id))
    assert Job.objects.filter(parent_id=job.id, cancel_requested_at__isnull=True).count() == 0
    from durable_jobs.runtime.reconciler import Reconciler

    while Reconciler().run_pass().cancelled:
        pass
    assert Job.objects.filter(parent_id=job.id, status="cancelled").count() == 1_000
    assert reload(job).status == "cancelled"


def test_cancel__a_walk_stopped_part_way_is_finished_by_cancelling_again(kinds, monkeypatch):
    """A walk that asked the children and stopped before their own children (a lock
    timeout, a cut connection): cancelling again reaches the grandchildren, a page of one
    child per statement."""
    from durable_jobs import service
    from tests.integration.support import parent_with_live_children

    monkeypatch.setattr(service, "CANCEL_BATCH", 1)
    parent, children = parent_with_live_children(kinds, count=3)
    grandchildren = Job.objects.filter(parent_id__in=[c.id for c in children])
    scope = durable.Scope(tenant=parent.tenant_id)
    asked = store.request_cancel_children(parent.id, scope, by="ops", limit=10)
    assert sorted(child for child, _, now in asked if now) == sorted(c.id for c in children)
    assert grandchildren.filter(cancel_requested_at__isnull=True).count() == 3

    durable.cancel(parent.id, by="ops")

    assert grandchildren.filter(cancel_requested_at__isnull=True).count() == 0
    assert set(grandchildren.values_list("cancelled_by", flat=True)) == {"ops"}


def test_cancel__a_descendant_held_past_the_lock_wait_is_busy_and_a_retry_finishes(
    kinds, other_connection, settings
):
    """A worker's transaction holding a child: the operator gets JobBusy instead of hanging
    behind it; the parent was asked, and cancelling again once it is free asks the rest."""
    from durable_jobs.exceptions import JobBusy
    from tests.integration.support import parent_with_live_children

    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "OPERATOR_LOCK_WAIT": 0.2}
    parent, children = parent_with_live_children(kinds, count=2)
    other_connection.execute("BEGIN")
    other_connection.execute(
        "SELECT 1 FROM durable_jobs_job WHERE id = %s FOR UPDATE", [children[0].id]
    )
    try:
        with pytest.raises(JobBusy):
            durable.cancel(parent.id, by="ops")
    finally:
        other_connection.execute("ROLLBACK")
    assert reload(parent).cancel_requested_at is not None
    assert reload(children[0]).cancel_requested_at is None

    durable.cancel(parent.id, by="ops")

    tree = Job.objects.filter(parent_id__in=[parent.id, *(c.id for c in children)])
    assert tree.count() == 4 and not tree.filter(cancel_requested_at__isnull=True).exists()


def test_cancel__reaches_grandchildren_and_cancel_tree_is_its_alias(kinds):
    from durable_jobs.runtime.reconciler import Reconciler
    from tests.integration.support import parent_with_live_children

    parent, children = parent_with_live_children(kinds, count=2)
    grandchildren = Job.objects.filter(parent_id__in=[c.id for c in children])
    assert grandchildren.count() == 2
    durable.cancel(parent.id, by="ops")
    tree = [parent.id, *(c.id for c in children), *grandchildren.values_list("id", flat=True)]
    assert (
        list(Job.objects.filter(id__in=tree).values_list("cancelled_by", flat=True)) == ["ops"] * 5
    )
    while Reconciler().run_pass().cancelled:
        pass
    assert set(Job.objects.filter(id__in=tree).values_list("status", flat=True)) == {"cancelled"}

    other, _ = parent_with_live_children(kinds, count=1, scope="tenant-b")
    assert durable.cancel_tree(other.id, scope="tenant-b").id == other.id
    assert Job.objects.filter(tenant_id="tenant-b", cancel_requested_at__isnull=True).count() == 0


def test_cancel__a_child_alone_does_not_cancel_its_parent(kinds):
    kinds.add(PARENT, summing_parent(policy="continue", count=2))
    kinds.add(CHILD, lambda job: durable.Done({"n": 1}))
    job = durable.start(PARENT)
    testing.run_jobs(max_slices=1)
    first = children_of(job)[0]
    durable.cancel(first.id, scope=durable.Scope(tenant=job.tenant_id))
    testing.run_jobs()
    from durable_jobs.runtime.reconciler import Reconciler

    Reconciler().run_pass()
    testing.run_jobs()
    row = reload(job)
    assert row.status == "completed"
    assert row.result["statuses"] == ["cancelled", "completed"]


def test_cancel__a_child_spawned_after_its_parent_was_asked_to_cancel_is_cancelled_too(kinds):
    """The request reaches a running parent before its slice sees it: what the slice
    spawns meanwhile is born asked to cancel, so no child escapes the parent's cancel."""
    ran = []

    def parent(job):
        durable.cancel(job.id, scope=durable.Scope(tenant=job.row.tenant_id), by="ops")
        with job.fenced():
            job.spawn(CHILD, key="late")
        return durable.DONE

    kinds.add(PARENT, parent)
    kinds.add(CHILD, lambda job: ran.append(job.id) or durable.DONE)
    job = durable.start(PARENT)
    testing.run_jobs(max_slices=1)
    [late] = children_of(job)
    assert late.cancel_requested_at is not None and late.cancelled_by == "ops"

    from durable_jobs.runtime.reconciler import Reconciler

    Reconciler().run_pass()
    testing.run_jobs()
    assert reload(late).status == "cancelled"
    assert ran == []


# --- events -----------------------------------------------------------------------


def event_waiter(name="paid", timeout=None):
    def handler(job):
        with job.fenced():
            event = job.received(name)
            if event is not None:
                job.save_checkpoint(
                    {"got": [*(job.checkpoint or {}).get("got", []), event.payload]}
                )
        got = (job.checkpoint or {}).get("got", [])
        if len(got) >= job.input.get("want", 1):
            return durable.Done(got)
        if job.continuation and event is None and timeout is not None:
            return durable.Done({"timed_out": True})
        return job.wait_for_event(name, timeout=timeout)

    return handler


def test_event__wakes_a_waiting_job_and_is_delivered_once(kinds):
    kinds.add("tests.flow.order", event_waiter())
    job = durable.start("tests.flow.order", input={})
    testing.run_jobs()
    held = reload(job)
    assert (held.status, held.next_run_at, held.lease_owner) == ("pending", None, None)
    assert durable.send_event(job.id, "paid", {"amount": 5}, scope=job.tenant_id)
    testing.run_jobs()
    assert reload(job).result == [{"amount": 5}]


def test_event__sent_before_the_wait_is_kept(kinds):
    kinds.add("tests.flow.order", event_waiter())
    job = durable.start("tests.flow.order", input={})
    durable.send_event(job, "paid", {"early": True}, scope=job.tenant_id)
    testing.run_jobs()
    assert reload(job).result == [{"early": True}]


def test_event__a_rolled_back_send_sends_nothing(kinds):
    kinds.add("tests.flow.order", event_waiter())
    job = durable.start("tests.flow.order", input={})
    testing.run_jobs()
    with pytest.raises(RuntimeError), transaction.atomic():
        durable.send_event(job, "paid", {"amount": 1}, scope=job.tenant_id)
        raise RuntimeError("the view failed")
    assert reload(job).next_run_at is None
    assert testing.run_jobs() == []


def test_event__two_of_one_name_are_kept_in_order(kinds):
    kinds.add("tests.flow.order", event_waiter())
    job = durable.start("tests.flow.order", input={"want": 2})
    durable.send_event(job, "paid", 1, scope=job.tenant_id)
    durable.send_event(job, "paid", 2, scope=job.tenant_id)
    testing.run_jobs()
    assert reload(job).result == [1, 2]


def test_event__by_idempotency_key_and_refused_across_scopes(kinds):
    kinds.add("tests.flow.order", event_waiter())
    job = durable.start("tests.flow.order", input={}, idempotency_key="order-7", scope="acme")
    assert durable.send_event("order-7", "paid", {"ok": 1}, scope="acme")
    with pytest.raises(JobNotFound):
        durable.send_event(job.id, "paid", {}, scope="someone-else")
    with pytest.raises(InvalidInput):
        durable.send_event(job.id, "bad name!", {}, scope="acme")


def test_event__to_a_finished_job_is_not_kept(kinds):
    kinds.add("tests.flow.order", event_waiter())
    job = durable.start("tests.flow.order", input={})
    durable.send_event(job, "paid", 1, scope=job.tenant_id)
    testing.run_jobs()
    assert reload(job).status == "completed"
    assert durable.send_event(job, "paid", 2, scope=job.tenant_id) is False


def test_event__its_timeout_ends_the_wait_on_the_database_clock(kinds):
    kinds.add("tests.flow.order", event_waiter(timeout=timedelta(hours=1)))
    job = durable.start("tests.flow.order", input={})
    testing.run_jobs()
    held = reload(job)
    assert held.status == "pending" and held.next_run_at is not None
    assert testing.run_jobs() == []  # not due yet
    testing.fast_forward(job)
    testing.run_jobs()
    assert reload(job).result == {"timed_out": True}


# --- sleep ------------------------------------------------------------------------


def test_sleep__holds_no_lease_until_its_wake_up_time(kinds):
    def napper(job):
        if not job.checkpoint:
            with job.fenced():
                job.save_checkpoint({"slept": True})
            return job.sleep(timedelta(minutes=10))
        return durable.DONE

    kinds.add("tests.flow.nap", napper)
    job = durable.start("tests.flow.nap")
    testing.run_jobs()
    row = reload(job)
    assert (row.status, row.lease_owner) == ("pending", None)
    assert (row.next_run_at - row.updated_at) >= timedelta(minutes=9)
    assert testing.run_jobs() == []
    testing.fast_forward(job)
    testing.run_jobs()
    assert reload(job).status == "completed"


def test_waits__bad_arguments_are_refused_with_one_line():
    from durable_jobs.workflows import Wait

    with pytest.raises(InvalidInput, match="policy"):
        Wait.children(policy="maybe")
    with pytest.raises(InvalidInput, match="sleep"):
        Wait.sleep(timedelta(days=90))
    with pytest.raises(InvalidInput, match="at_least"):
        Wait.children(at_least=0)


# --- dependencies ------------------------------------------------------------------


def test_after__a_job_runs_only_when_its_dependencies_completed(kinds):
    ran = []
    kinds.add("tests.flow.extract", lambda job: ran.append(job.input) or durable.DONE)
    kinds.add("tests.flow.report", lambda job: ran.append("report") or durable.DONE)
    a = durable.start("tests.flow.extract", input="a")
    b = durable.start("tests.flow.extract", input="b", run_after=timedelta(hours=1))
    report = durable.start("tests.flow.report", after=[a, b.id])
    assert reload(report).next_run_at is None
    testing.run_jobs()
    assert ran == ["a"] and reload(report).status == "pending"
    testing.fast_forward(b)
    testing.run_jobs()
    assert ran == ["a", "b", "report"]


def test_after__the_dependent_reads_its_dependency_s_result_once_it_runs(kinds):
    def report(job):
        extract = durable.get(job.input["extract"])
        return durable.Done({"extract_status": extract.status, "total": extract.result["rows"] * 2})

    kinds.add("tests.flow.extract", lambda job: durable.Done({"rows": 7}))
    kinds.add("tests.flow.report", report)
    a = durable.start("tests.flow.extract", run_after=timedelta(hours=1))
    dependent = durable.start("tests.flow.report", input={"extract": str(a.id)}, after=[a])
    assert testing.run_jobs() == [], "neither may run yet"
    testing.fast_forward(a)
    testing.run_jobs()
    row = reload(dependent)
    assert (row.status, row.error_message) == ("completed", None)
    assert row.result == {"extract_status": "completed", "total": 14}


def test_after__a_failed_dependency_fails_the_job_with_its_own_code(kinds):
    def extract(job):
        raise durable.TerminalError("source gone", code="gone")

    kinds.add("tests.flow.extract", extract)
    kinds.add("tests.flow.report")
    a = durable.start("tests.flow.extract")
    report = durable.start("tests.flow.report", after=[a])
    testing.run_jobs()
    row = reload(report)
    assert (row.status, row.error_code) == ("failed", "dependency_failed")


def test_after__policy_run_runs_anyway(kinds):
    def extract(job):
        raise durable.TerminalError("source gone", code="gone")

    kinds.add("tests.flow.extract", extract)
    kinds.add("tests.flow.report")
    a = durable.start("tests.flow.extract")
    testing.run_jobs()
    report = durable.start("tests.flow.report", after=[a], after_policy="run")
    assert reload(report).next_run_at is not None  # already ended: runnable at once
    testing.run_jobs()
    assert reload(report).status == "completed"


def test_after__names_only_existing_jobs_of_its_scope(kinds):
    kinds.add("tests.flow.report")
    other = durable.start("tests.flow.report", scope="tenant-b")
    with pytest.raises(JobNotFound):
        durable.start("tests.flow.report", scope="tenant-a", after=[other.id])
    with pytest.raises(InvalidInput, match="after_policy"):
        durable.start("tests.flow.report", after=[other.id], after_policy="maybe")
    assert Job.objects.filter(tenant_id="tenant-a").count() == 0


def test_spawn__an_unregistered_kind_is_refused_like_a_start(kinds):
    def parent(job):
        with job.fenced():
            job.spawn("tests.flow.nobody_runs_this", key="x")
        return durable.DONE

    kinds.add(PARENT, parent)
    job = durable.start(PARENT)
    testing.run_jobs()
    row = reload(job)
    assert (row.status, row.error_code) == ("failed", "terminal")
    assert "no handler is registered for 'tests.flow.nobody_runs_this'" in row.error_message
    assert children_of(job) == []
