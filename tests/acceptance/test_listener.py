"""The wake-up listener: back off when its connection keeps dying, and never miss work
started while it was reconnecting (review item 5)."""

from __future__ import annotations

import time

import pytest

import durable_jobs as durable
from tests.acceptance.harness import backends_of, terminate_backends, wait_until
from tests.factories import reload

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

LISTENER = "durable-test-wake/durable-listener"


def test_work_started_while_the_listener_reconnects_runs_without_waiting_for_the_poll(processes):
    """A NOTIFY sent while no LISTEN is in place is lost; the worker makes one dequeue pass
    after every reconnect, so the job runs at once rather than at the next poll (120 s)."""
    processes.worker(app_name="durable-test-wake", env={"DURABLE_JOBS_POLL_INTERVAL": "120"})
    wait_until(lambda: backends_of(LISTENER), message="the listener's connection")
    time.sleep(0.5)  # the slot is asleep on its 120 s poll
    assert terminate_backends(LISTENER) == 1
    job = durable.start("demo.flaky", input={"failures": 0})  # its NOTIFY finds nobody listening
    wait_until(
        lambda: reload(job).status == "completed",
        timeout=15,
        message="the job to run after the reconnect",
    )


def test_a_listener_whose_connection_keeps_dying_backs_off(processes):
    """A LISTEN that succeeds on a connection that dies at once must not become a reconnect
    loop: the delay grows (0.4, 0.8, 1.6, 3.2 s ...) until a connection stays up."""
    processes.worker(app_name="durable-test-wake", env={"DURABLE_JOBS_POLL_INTERVAL": "120"})
    wait_until(lambda: backends_of(LISTENER), message="the listener's connection")
    seen: set[int] = set()
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        pids = backends_of(LISTENER)
        seen.update(pids)
        if pids:
            terminate_backends(LISTENER)
        time.sleep(0.05)
    # Without backoff growth: a reconnect every 0.4 s, about 15 in 6 s.
    assert len(seen) <= 6, f"{len(seen)} listener connections in 6 s"


def test_starts_arriving_faster_than_the_wake_up_cooldown_all_run_without_the_poll(processes):
    """Notifications inside the wake-up cooldown are folded into one wake-up when it ends,
    never dropped: 40 starts a few milliseconds apart, each its own transaction (its own
    NOTIFY, inside the cooldown of the wake-up before, after the woken slot has gone back
    to sleep), all run long before the 120 s poll. A second worker takes some of them, so
    both also back off after empty claims and must still answer the starts that follow."""
    for _ in range(2):
        processes.worker(app_name="durable-test-wake", env={"DURABLE_JOBS_POLL_INTERVAL": "120"})
    wait_until(lambda: len(backends_of(LISTENER)) == 2, message="both listeners' connections")
    time.sleep(0.5)  # every slot asleep on its 120 s poll
    for round_ in range(3):
        jobs = []
        for _ in range(40):
            jobs.append(durable.start("demo.flaky", input={"failures": 0}))
            time.sleep(0.006)
        wait_until(
            lambda jobs=jobs: all(reload(job).status == "completed" for job in jobs),
            timeout=30,
            message=f"round {round_}: every start to run without waiting for the poll",
        )
        time.sleep(0.3)  # quiet: the next round's first start finds the workers asleep
