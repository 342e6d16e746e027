"""The scheduler inside a worker: it writes the declared schedules when the worker starts,
and a NOTIFY that the schedules changed wakes its leader, which otherwise sleeps until the
earliest tick or its lease's renewal."""

from __future__ import annotations

import threading
import time

import pytest

import durable_jobs as durable
from durable_jobs import testing
from durable_jobs.models import Job, Leader, Schedule
from durable_jobs.runtime.worker import Worker
from durable_jobs.schedules import declare, ticks

pytestmark = pytest.mark.django_db(transaction=True)

#: The leader renews its lease (and looks at the schedules) this often: far longer than
#: any wait below, so only the NOTIFY can explain a tick fired in time.
RENEWAL = 600.0


def _wait(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def worker(settings):
    settings.DURABLE_JOBS = {
        **settings.DURABLE_JOBS,
        "RECONCILE_INTERVAL": RENEWAL,
        "NOTIFY_CHANNEL": "durable_jobs",
    }
    durable.schedule("demo.noop", "@yearly", name="worker.yearly")
    running = Worker(concurrency=1, execution="thread", reconcile=False)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    yield running
    running.stop()
    thread.join(timeout=30)
    declare.forget("worker.yearly")
    assert not thread.is_alive()


def test_a_worker_writes_its_schedules_and_fires_a_tick_a_notify_announces(worker):
    _wait(lambda: Schedule.objects.filter(name="worker.yearly").exists(), "the sync")
    # The leader's first turn found the next tick a year away: it sleeps RENEWAL seconds.
    _wait(
        lambda: Leader.objects.filter(name="scheduler", owner=worker.identity).exists(),
        "the worker to lead the scheduler",
    )
    time.sleep(0.3)  # let that first turn end and the leader fall asleep
    tick = testing.fast_forward_schedule("worker.yearly")  # commits with a NOTIFY
    _wait(
        lambda: Job.objects.filter(meta__tick=ticks.utc_iso(tick), status="completed").exists(),
        "the tick's job to run",
    )
