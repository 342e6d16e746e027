"""Fault injection on trees of jobs (invariants 29 and 30), checked over the recorded
history: no child lost, no duplicate child, a parent never resumes before its children."""

from __future__ import annotations

import signal

import pytest

import durable_jobs as durable
from durable_jobs.models import Job
from tests.acceptance.harness import wait_until
from tests.chaos.conftest import assert_invariants

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

RESCUE = {"DURABLE_JOBS_RECONCILE_INTERVAL": "0.3"}


def rescue(processes, jobs, *, timeout: float = 90) -> None:
    processes.worker("--concurrency", "4", "--reconcile", app_name="durable-rescuer", env=RESCUE)
    wait_until(
        lambda: (
            not Job.objects.filter(
                id__in=[j.id for j in jobs], status__in=["pending", "running"]
            ).exists()
        ),
        timeout=timeout,
        message="the trees to finish after the fault",
    )


@pytest.mark.parametrize(
    "point",
    # A no-mirror kind's completions are batched: terminal_after and
    # before_batched_completion are its terminal transaction's points.
    ["domain_before_commit", "domain_after_commit", "before_batched_completion", "terminal_after"],
)
def test_sigkill_at_a_named_point_in_a_tree(recorded, processes, point):
    trees = [
        durable.start("demo.tree", input={"children": 30, "batch": 10, "leaf": {"delay": 0.01}})
        for _ in range(2)
    ]
    victim = processes.worker(
        "--concurrency",
        "2",
        app_name="durable-victim",
        env={"DURABLE_JOBS_FAULTS": f"{point}=kill@5", "DURABLE_JOBS_EXECUTION": "thread"},
    )
    victim.wait(timeout=60)
    assert victim.popen.returncode == -signal.SIGKILL, victim.output()
    rescue(processes, trees)
    for tree in Job.objects.filter(id__in=[t.id for t in trees]):
        assert tree.status == "completed" and tree.result == {"children": 30, "completed": 30}
    assert_invariants(recorded, processes)


def test_a_child_stuck_past_its_time_limit_is_charged_and_its_parent_still_resumes(
    recorded, processes
):
    """The child's slices end at the time limit and fail; its parent resumes with it failed."""
    tree = durable.start(
        "demo.tree",
        input={"children": 3, "batch": 3, "leaf": {"delay": 30}, "policy": "continue"},
    )
    processes.worker(
        "--concurrency",
        "4",
        "--reconcile",
        app_name="durable-worker",
        env={
            **RESCUE,
            "DURABLE_JOBS_SLICE_BUDGET": "0.5",
            "DURABLE_JOBS_TIME_LIMIT": "1",
            "DURABLE_JOBS_MAX_CONSECUTIVE_FAILURES": "2",
            "DURABLE_JOBS_RETRY_BACKOFF_BASE": "0.1",
            "DURABLE_JOBS_RETRY_BACKOFF_MAX": "0.2",
        },
    )
    wait_until(
        lambda: Job.objects.filter(id=tree.id, status__in=["completed", "failed"]).exists(),
        timeout=90,
        message="the parent to end",
    )
    children = Job.objects.filter(parent_id=tree.id)
    assert {(c.status, c.error_code) for c in children} == {("failed", "retry_exhausted")}
    assert Job.objects.get(id=tree.id).result == {"children": 3, "completed": 0}
    assert_invariants(recorded, processes)
