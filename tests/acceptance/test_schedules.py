"""Invariant 24 with real processes: three workers serve a schedule; the leader is SIGKILLed
between planning a tick and starting it, its successor is SIGSTOPped mid-tick past its lease
and woken after the third fired that tick; every tick has exactly one job. A leader
stopped inside a tick's transaction holds the schedule no longer than its lease."""

from __future__ import annotations

import json
import signal

import pytest

from durable_jobs import testing
from durable_jobs.models import Job, Leader, Schedule
from durable_jobs.schedules import ticks
from tests.acceptance.harness import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

NAME = "acceptance.tick"
# A yearly tick never comes by itself during the test: every tick is one the test made due.
ENV = {
    "DURABLE_JOBS_SCHEDULES": json.dumps(
        {NAME: {"kind": "demo.noop", "cron": "@yearly", "catch_up": "skip"}}
    ),
    # The scheduler's lease is three of these: a stopped leader loses it in 1.5 s.
    "DURABLE_JOBS_RECONCILE_INTERVAL": "0.5",
}


def leader_pid() -> int | None:
    row = Leader.objects.filter(name="scheduler", owner__isnull=False).first()
    return None if row is None else int(row.owner.split(":")[1])


def result_of_a_tick(name: str):
    """Wait for schedule ``name`` to be written (not removed), make a tick due, and return
    the result of the job that tick started, once it completed."""
    wait_until(
        lambda: Schedule.objects.filter(name=name, removed_at__isnull=True).exists(),
        message=f"schedule {name} written",
    )
    tick = testing.fast_forward_schedule(name)
    wait_until(
        lambda: Job.objects.filter(meta__tick=ticks.utc_iso(tick), status="completed").exists(),
        message="the tick's job to complete",
    )
    return Job.objects.get(meta__tick=ticks.utc_iso(tick)).result


def jobs_for(tick) -> list[Job]:
    return list(Job.objects.filter(meta__schedule=NAME, meta__tick=ticks.utc_iso(tick)))


def test_every_tick_starts_exactly_once_across_a_killed_and_a_stopped_leader(processes):
    a = processes.worker(
        app_name="durable-test-sched-a",
        env={**ENV, "DURABLE_JOBS_FAULTS": "scheduler_between=kill@1"},
    )
    wait_until(lambda: Schedule.objects.filter(name=NAME).exists(), message="the schedule synced")
    wait_until(lambda: leader_pid() == a.pid, message="worker A to lead the scheduler")
    b = processes.worker(
        app_name="durable-test-sched-b",
        env={**ENV, "DURABLE_JOBS_FAULTS": "scheduler_between=stop@1"},
    )

    fired = [testing.fast_forward_schedule(NAME)]
    # A plans the tick and is SIGKILLed before its transaction: nothing was started.
    assert a.wait(timeout=30) == -signal.SIGKILL
    assert "FAULT scheduler_between kill" in a.output()
    # B takes over once A's lease expires, plans the same tick and stops (SIGSTOP) mid-tick.
    wait_until(lambda: "FAULT scheduler_between stop" in b.output(), message="B to stop mid-tick")
    assert jobs_for(fired[0]) == []
    c = processes.worker(app_name="durable-test-sched-c", env=ENV)
    # C takes over once B's lease expires and fires the tick B is still holding a plan for.
    wait_until(lambda: jobs_for(fired[0]), message="C to fire the tick")
    assert leader_pid() == c.pid
    fired.append(testing.fast_forward_schedule(NAME))
    wait_until(lambda: jobs_for(fired[1]), message="the second tick")
    # B wakes with its stale plan: its compare-and-set finds the row moved; it starts nothing.
    b.signal(signal.SIGCONT)
    stale = f"tick {ticks.utc_iso(fired[0])} was fired (or the schedule paused) by another"
    wait_until(lambda: stale in b.output(), message="B to try its stale plan")
    for _ in range(3):
        fired.append(testing.fast_forward_schedule(NAME))
        wait_until(lambda: jobs_for(fired[-1]), message="a tick after B woke")
    wait_until(
        lambda: not Job.objects.filter(meta__schedule=NAME).exclude(status="completed").exists(),
        message="every tick's job to finish",
    )
    started = list(Job.objects.filter(meta__schedule=NAME))
    assert sorted(job.meta["tick"] for job in started) == sorted(map(ticks.utc_iso, fired))
    assert all(len(jobs_for(tick)) == 1 for tick in fired)
    assert Schedule.objects.get(name=NAME).last_tick_at == fired[-1]
    assert b.popen.poll() is None and c.popen.poll() is None, "B and C still serve"


def test_a_leader_stopped_inside_a_tick_holds_the_schedule_no_longer_than_its_lease(processes):
    """The leader is SIGSTOPped inside a tick's transaction (the schedule advanced, the
    tick's job inserted, nothing committed), holding the schedule's row. The server ends
    its session once it has sat idle as long as the scheduler's lease, so the successor
    fires the tick instead of waiting on the row for as long as the leader stays stopped;
    the old leader, woken, finds its transaction gone and has started nothing."""
    a = processes.worker(
        app_name="durable-test-sched-inside-a",
        env={**ENV, "DURABLE_JOBS_FAULTS": "scheduler_inside=stop@1"},
    )
    wait_until(lambda: Schedule.objects.filter(name=NAME).exists(), message="the schedule synced")
    wait_until(lambda: leader_pid() == a.pid, message="worker A to lead the scheduler")
    b = processes.worker(app_name="durable-test-sched-inside-b", env=ENV)

    tick = testing.fast_forward_schedule(NAME)
    wait_until(lambda: "FAULT scheduler_inside stop" in a.output(), message="A to stop mid-tick")
    assert jobs_for(tick) == [], "A's tick is not committed"
    wait_until(lambda: jobs_for(tick), message="B to fire the tick A holds")
    assert leader_pid() == b.pid
    a.signal(signal.SIGCONT)
    wait_until(
        lambda: "scheduler: database unavailable" in a.output(),
        message="A to find its tick's transaction ended",
    )
    following = testing.fast_forward_schedule(NAME)
    wait_until(lambda: jobs_for(following), message="the next tick")
    wait_until(
        lambda: not Job.objects.filter(meta__schedule=NAME).exclude(status="completed").exists(),
        message="every tick's job to finish",
    )
    assert [len(jobs_for(fired)) for fired in (tick, following)] == [1, 1]
    assert Schedule.objects.get(name=NAME).last_tick_at == following
    assert a.popen.poll() is None and b.popen.poll() is None, "A and B still serve"


def test_a_worker_refuses_to_start_with_a_schedule_the_check_refuses(processes):
    bad = {"nightly": {"kind": "demo.noop", "cron": "0 25 * * *"}}
    worker = processes.worker(
        app_name="durable-test-sched-bad", env={"DURABLE_JOBS_SCHEDULES": json.dumps(bad)}
    )
    assert worker.wait(timeout=60) != 0
    assert "durable_jobs.E004" in worker.output() and "schedule 'nightly'" in worker.output()
    assert not Schedule.objects.exists(), "nothing was written"


def test_a_workers_periodic_task_is_written_before_anything_imported_the_task(processes):
    """A task's schedule is declared when its module is imported (the backend's OPTIONS,
    or @task): the worker imports the apps' tasks modules before it writes its schedules,
    so the task's schedule is written, not marked removed, and its tick runs the task."""
    name = "task:testproject.demo.tasks.add"
    env = {
        "DURABLE_TASKS_SCHEDULES": json.dumps(
            {"testproject.demo.tasks.add": {"cron": "@yearly", "input": {"a": 2, "b": 3}}}
        ),
        "DURABLE_JOBS_RECONCILE_INTERVAL": "0.5",
    }
    processes.worker(app_name="durable-test-sched-task", env=env)
    assert result_of_a_tick(name) == 5


def test_a_tasks_own_schedule_is_written_by_a_worker_that_had_not_imported_it_yet(processes):
    """``@task(schedule=...)`` is declared when the task's module is imported: the worker
    imports the apps' tasks modules before it writes its schedules (else it would mark the
    task's schedule removed)."""
    name = "task:testproject.demo.tasks.periodic"
    env = {"DURABLE_DEMO_TASK_SCHEDULE": "@yearly", "DURABLE_JOBS_RECONCILE_INTERVAL": "0.5"}
    processes.worker(app_name="durable-test-sched-task-own", env=env)
    assert result_of_a_tick(name) == "ran on its tick"
