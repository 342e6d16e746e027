"""Workflow races on two connections (invariant 30): wakes decided under a row lock.

Each test holds one side's transaction open on a raw second connection, so the other side
runs while the first is uncommitted: under READ COMMITTED each sees the other's work as
not yet done, which is exactly where a read-then-write wake loses (zero wakes) or doubles.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

import durable_jobs as durable
from durable_jobs import store, testing
from durable_jobs.models import Job
from durable_jobs.runtime import flow
from durable_jobs.states import Scope
from durable_jobs.workflows import Wait
from tests.factories import reload
from tests.integration.support import claim, in_thread

pytestmark = pytest.mark.django_db(transaction=True)

PARENT, CHILD = "tests.flow.parent", "tests.flow.child"


def held_parent(kinds, count=2):
    def parent(job):
        if not job.checkpoint:
            with job.fenced():
                job.spawn_many([{"kind": CHILD, "key": f"c{i}"} for i in range(count)])
                job.save_checkpoint({"spawned": True})
            return job.wait_for_children()
        return durable.Done({"resumed_with": [c.status for c in job.children()]})

    kinds.add(PARENT, parent)
    job = durable.start(PARENT)
    testing.run_jobs(max_slices=1)
    assert reload(job).next_run_at is None
    return job


def blocked_until(conn_pid_check, timeout=10.0):
    """Wait until some backend is waiting for a lock (the raced statement blocked)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if conn_pid_check():
            return
        time.sleep(0.02)
    raise AssertionError("the second statement never blocked on the row lock")


def lock_waiters(other_connection) -> bool:
    # Inside a transaction the activity view is a snapshot taken once: clear it each time.
    other_connection.execute("SELECT pg_stat_clear_snapshot()")
    return bool(
        other_connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ).fetchone()[0]
    )


def complete_params(lease):
    return {
        "id": lease.job_id,
        "owner": lease.owner,
        "epoch": lease.epoch,
        "ttl_ms": lease.ttl_ms,
        "result": None,
        "processed": None,
        "total": None,
    }


def test_last_two_children_ending_at_once_wake_the_parent_exactly_once(kinds, other_connection):
    kinds.add(CHILD)
    parent = held_parent(kinds)
    scope = Scope(tenant=parent.tenant_id)
    first, second = Job.objects.filter(parent_id=parent.id).order_by("spawn_key")
    _, lease_a = claim(first, scope=scope)
    _, lease_b = claim(second, scope=scope)

    with other_connection.transaction():
        assert other_connection.execute(store.COMPLETE, complete_params(lease_a)).fetchone()
        answers = []
        thread = in_thread(lambda: answers.append(store.complete(lease_b)))
        blocked_until(lambda: lock_waiters(other_connection))
    thread.join(10)

    assert answers and answers[0].status == "completed"
    woken = reload(parent)
    assert (woken.children_ended, woken.children_failed) == (2, 0)
    assert woken.next_run_at is not None, "never zero wakes"
    reports = testing.run_jobs()
    assert [r.job_id for r in reports] == [parent.id], "one resumed slice, never two"
    assert reload(parent).result == {"resumed_with": ["completed", "completed"]}


def test_an_event_sent_while_the_job_starts_waiting_wakes_it(kinds, other_connection):
    """The sender commits after the waiter's statement began: the lock makes it seen."""
    kinds.add("tests.flow.order")
    job = durable.start("tests.flow.order")
    row, lease = claim(job, scope=Scope(tenant=job.tenant_id))
    params = {"id": job.id, "tenant": job.tenant_id, "organization": None}
    with other_connection.transaction():
        other_connection.execute(store.SEND_EVENT, {**params, "name": "paid", "payload": "1"})
        answers = []
        wait = json.dumps(Wait.for_event("paid").as_json())

        def hold():
            try:
                answers.append(flow.hold(lease, wait, using="default"))
            except Exception as error:  # noqa: BLE001
                answers.append(error)

        thread = in_thread(hold)
        blocked_until(lambda: lock_waiters(other_connection))
    thread.join(10)
    assert answers == ["yielded"], "the event was seen: the job is due at once, not held"
    assert reload(job).next_run_at is not None


def test_an_event_sent_twice_at_once_is_kept_twice_in_order(kinds, other_connection):
    kinds.add("tests.flow.order")
    job = durable.start("tests.flow.order")
    params = {"id": job.id, "tenant": job.tenant_id, "organization": None, "name": "paid"}
    with other_connection.transaction():
        other_connection.execute(store.SEND_EVENT, {**params, "payload": '"first"'})
        thread = in_thread(lambda: durable.send_event(job, "paid", "second", scope=job.tenant_id))
        blocked_until(lambda: lock_waiters(other_connection))
    thread.join(10)
    payloads = [
        row[0]
        for row in other_connection.execute(
            "SELECT payload FROM durable_jobs_event WHERE job_id = %s ORDER BY id", [job.id]
        )
    ]
    assert payloads == ["first", "second"]


def test_a_dependency_ending_while_its_dependent_starts_never_strands_it(kinds, other_connection):
    kinds.add("tests.flow.extract")
    kinds.add("tests.flow.report")
    extract = durable.start("tests.flow.extract")
    _, lease = claim(extract, scope=Scope(tenant=extract.tenant_id))
    started = []
    with other_connection.transaction():
        assert other_connection.execute(store.COMPLETE, complete_params(lease)).fetchone()
        thread = in_thread(
            lambda: started.append(
                durable.start("tests.flow.report", after=[extract], scope=extract.tenant_id)
            )
        )
        blocked_until(lambda: lock_waiters(other_connection))
    thread.join(10)
    report = reload(started[0])
    assert (report.deps_total, report.deps_ended) == (1, 1)
    assert report.next_run_at is not None, "runnable: its dependency completed"
    testing.run_jobs()
    assert reload(report).status == "completed"


@pytest.mark.parametrize("ending", ["complete", "complete_many", "fail_terminal"])
def test_a_dependent_linked_while_its_dependency_ends_is_told(kinds, other_connection, ending):
    """The reverse of the race above: the dependent's start holds the dependency's row when
    the dependency's terminal statement runs. That statement's leaf form (for a row nobody
    waits on) must see the link once the lock is granted, and the dependent be told."""
    from django.db import transaction

    kinds.add("tests.flow.extract")
    kinds.add("tests.flow.report")
    extract = durable.start("tests.flow.extract")
    _, lease = claim(extract, scope=Scope(tenant=extract.tenant_id))
    linked, proceed, started, answers = threading.Event(), threading.Event(), [], []

    def start_dependent():
        with transaction.atomic():
            started.append(
                durable.start("tests.flow.report", after=[extract], scope=extract.tenant_id)
            )
            linked.set()
            proceed.wait(10)

    def end():
        if ending == "complete":
            answers.append(store.complete(lease))
        elif ending == "complete_many":
            answers.append(store.complete_many([(lease, None)]))
        else:
            answers.append(store.fail_terminal(lease, code="error", error_class="Boom"))

    starter = in_thread(start_dependent)
    assert linked.wait(10)
    ender = in_thread(end)
    blocked_until(lambda: lock_waiters(other_connection))
    proceed.set()
    starter.join(10)
    ender.join(10)

    assert answers and answers[0], "the dependency ended (its lease was still held)"
    report = reload(started[0])
    assert (report.deps_total, report.deps_ended) == (1, 1)
    assert report.deps_failed == (1 if ending == "fail_terminal" else 0)
    assert report.next_run_at is not None, "told: its dependency ended"
