"""Issue 25's promise: a tree of jobs survives SIGKILL (invariants 29 and 30).

A ``demo.tree`` parent spawns ``demo.leaf`` children in fenced batches, each batch's
checkpoint in its own transaction, waits for them with no lease, and writes one summary.
Every leaf writes one effect, so a lost child shows as a missing effect and a leaf's
write landing twice as a repeated one; the child-key index refuses a duplicate child,
and the count of children says none is missing.
"""

from __future__ import annotations

import signal

import pytest
from django.db.models import Count

import durable_jobs as durable
from durable_jobs.models import Job
from testproject.demo.models import Effect
from tests.acceptance.harness import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = {
    "DURABLE_JOBS_RECONCILE_INTERVAL": "0.3",
    "DURABLE_JOBS_MAX_CONSECUTIVE_FAILURES": "5",
}


def assert_tree_intact(parent, children: int) -> None:
    row = Job.objects.get(id=parent.id)
    assert row.status == "completed", (row.status, row.error_code, row.error_message)
    assert row.result == {"children": children, "completed": children}
    kids = Job.objects.filter(parent_id=parent.id)
    assert kids.count() == children, "no child lost, none duplicated"
    assert kids.filter(status="completed").count() == children
    assert row.children_total == row.children_ended == children
    leaves = Effect.objects.filter(job_id__in=kids.values("id"))
    repeated = leaves.values("job_id", "item").annotate(n=Count("id")).filter(n__gt=1)
    assert not repeated.exists(), f"written twice: {list(repeated[:5])}"
    assert leaves.count() == children
    summary = Effect.objects.filter(job_id=parent.id)
    assert list(summary.values_list("item", flat=True)) == [-1], "one summary"
    # A parent never resumes before what it waits for has ended: its summary was written
    # after the last child's effect.
    assert summary.get().created_at >= leaves.order_by("-created_at").first().created_at


def finish(processes, jobs, *, timeout=180):
    survivor = processes.worker(
        "--concurrency", "4", "--reconcile", app_name="durable-test-survivor", env=FAST
    )
    wait_until(
        lambda: (
            not Job.objects.filter(
                id__in=[j.id for j in jobs], status__in=["pending", "running"]
            ).exists()
        ),
        timeout=timeout,
        message="the tree to finish",
    )
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0


def test_a_parent_with_1000_children_survives_sigkill_of_every_worker(processes):
    parent = durable.start(
        "demo.tree", input={"children": 1000, "batch": 100, "leaf": {"delay": 0.002}}
    )
    first = [
        processes.worker("--concurrency", "4", app_name=f"durable-test-doomed-{n}", env=FAST)
        for n in range(2)
    ]
    wait_until(
        lambda: Job.objects.filter(parent_id=parent.id, status="completed").count() >= 200,
        timeout=90,
        message="children to be under way",
    )
    for worker in first:
        worker.signal(signal.SIGKILL)
    for worker in first:
        worker.wait()
    assert Job.objects.filter(parent_id=parent.id, status__in=["pending", "running"]).exists()
    finish(processes, [parent])
    assert_tree_intact(parent, 1000)


@pytest.mark.parametrize(
    "fault",
    [
        # the first fenced commit is the first batch's spawn: killed right after it
        # committed, before the checkpoint that records it
        "domain_after_commit=kill@1",
        # the third is the second batch's spawn: killed before it commits
        "domain_before_commit=kill@3",
    ],
)
def test_sigkill_between_a_spawn_and_its_checkpoint_loses_and_duplicates_no_child(processes, fault):
    parent = durable.start("demo.tree", input={"children": 50, "batch": 10})
    doomed = processes.worker(
        "--concurrency",
        "1",
        app_name="durable-test-doomed",
        env={**FAST, "DURABLE_JOBS_FAULTS": fault, "DURABLE_JOBS_EXECUTION": "thread"},
    )
    assert doomed.wait(timeout=60) == -signal.SIGKILL, "the fault killed the worker"
    finish(processes, [parent])
    assert_tree_intact(parent, 50)


def test_the_parents_worker_killed_while_children_run_resumes_once(processes):
    parent = durable.start("demo.tree", input={"children": 20, "batch": 20, "leaf": {"delay": 0.3}})
    first = processes.worker("--concurrency", "4", app_name="durable-test-doomed", env=FAST)
    wait_until(
        lambda: Job.objects.filter(id=parent.id, flow_wait__on="children").exists(),
        timeout=60,
        message="the parent to wait for its children",
    )
    first.signal(signal.SIGKILL)
    first.wait()
    held = Job.objects.get(id=parent.id)
    assert held.lease_owner is None, "waiting holds no lease: nothing to re-drive"
    finish(processes, [parent])
    assert_tree_intact(parent, 20)
    assert Job.objects.get(id=parent.id).redrives == 0
