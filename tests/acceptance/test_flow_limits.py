"""Invariant 26 across processes: a concurrency limit of two on one key, claimed by three
worker processes of three slots each, never has three holders, while one worker is
SIGKILLed and another SIGSTOPped holding permits. The killed worker's permits come back
with the orphan take; the stopped one, continued after the takeover, lands no write."""

from __future__ import annotations

import signal
import threading

import psycopg
import pytest

import durable_jobs as durable
from durable_jobs.models import Job
from testproject.demo.models import Effect
from tests.acceptance.harness import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

KEY = "demo.limited:account=1"
ENV = {
    "DURABLE_JOBS_POLL_INTERVAL": "0.1",
    "DURABLE_JOBS_LEASE_TTL": "1.5",
    "DURABLE_JOBS_HEARTBEAT_INTERVAL": "0.3",
    "DURABLE_JOBS_ORPHAN_GRACE": "0.2",
    "DURABLE_JOBS_RECONCILE_INTERVAL": "0.3",
    # The stop usually lands just after a claim, inside the handler's first fenced(): the
    # stopped transaction holds the job's row lock and the orphan take (SKIP LOCKED) passes
    # the job by until the server ends that idle transaction. Keep that wait short.
    "DURABLE_JOBS_FENCED_IDLE_TIMEOUT": "2",
}
HOLDING = (
    "SELECT id, lease_owner, lease_epoch FROM durable_jobs_job"
    " WHERE flow_key = %s AND status = 'running' AND lease_owner IS NOT NULL"
)


class Sampler(threading.Thread):
    """Counts, every few milliseconds, the key's jobs holding a lease (expired or not)."""

    def __init__(self, db_url: str) -> None:
        super().__init__(daemon=True)
        self.conn = psycopg.connect(db_url, autocommit=True)
        self.most = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.01):
            held = self.conn.execute(HOLDING, [KEY]).fetchall()
            self.most = max(self.most, len(held))

    def holders(self) -> list[tuple]:
        return self.conn.execute(HOLDING, [KEY]).fetchall()


def _worker_of(owner: str, workers) -> object:
    pid = int(owner.split("/", 1)[0].split(":")[1])
    return next(w for w in workers if w.pid == pid)


@pytest.fixture
def sampler(db_url):
    sampler = Sampler(db_url)
    sampler.start()
    yield sampler
    sampler.stop.set()
    sampler.join(5)
    sampler.conn.close()  # a session left open would keep the test database from being dropped


def test_a_key_limited_to_two_never_has_three_holders_through_a_kill_and_a_stall(
    processes, sampler
):
    jobs = [durable.start("demo.limited", input={"account": 1, "seconds": 0.6}) for _ in range(8)]
    other = [durable.start("demo.limited", input={"account": 2, "seconds": 0.1}) for _ in range(2)]
    workers = [
        processes.worker("--concurrency", "3", app_name=f"durable-flow-{n}", env=ENV)
        for n in range(3)
    ]

    (victim_job, owner, epoch), *_ = wait_until(sampler.holders, message="a permit held")
    killed = _worker_of(owner, workers)
    killed.signal(signal.SIGKILL)
    wait_until(
        lambda: Job.objects.get(id=victim_job).lease_epoch > epoch,
        message="the orphan take to bump the killed worker's epoch",
    )

    stopped, (stalled_job, _, stalled_epoch) = _stall_a_holder(sampler, workers, killed)
    wait_until(
        lambda: Job.objects.get(id=stalled_job).lease_epoch > stalled_epoch,
        timeout=20,
        message="the stalled worker's lease to be taken over",
    )
    stopped.signal(signal.SIGCONT)

    wait_until(
        lambda: all(Job.objects.get(id=j.id).status == "completed" for j in jobs + other),
        timeout=60,
        message="every job to complete",
    )
    sampler.stop.set()
    sampler.join(5)

    assert sampler.most <= 2, f"{sampler.most} jobs held the key's two permits at once"
    assert sampler.most == 2, "the limit was reached (the test exercised it)"
    assert not Effect.objects.filter(job_id=stalled_job, epoch=stalled_epoch, item=1).exists(), (
        "the stalled worker landed no write after the takeover"
    )
    ends = Effect.objects.filter(item=1, job_id__in=[j.id for j in jobs])
    assert sorted(str(e.job_id) for e in ends) == sorted(str(j.id) for j in jobs), (
        "each job finished exactly once"
    )
    _assert_at_most_two_overlapping(jobs)


def _stall_a_holder(sampler: Sampler, workers, killed) -> tuple[object, tuple]:
    """SIGSTOP a live worker holding a permit; return it and a permit it still holds.

    A permit read just before the stop may be released before the stop lands (the 0.6 s
    slice ended): then the stopped worker holds nothing to take over, so it is continued
    and another holder is chosen.
    """
    for _ in range(10):
        (_, owner, _), *_ = wait_until(
            lambda: [h for h in sampler.holders() if _worker_of(h[1], workers) is not killed],
            message="a permit held",
        )
        stopped = _worker_of(owner, workers)
        stopped.signal(signal.SIGSTOP)
        held = [h for h in sampler.holders() if _worker_of(h[1], workers) is stopped]
        if held:
            return stopped, held[0]
        stopped.signal(signal.SIGCONT)
    raise AssertionError("no worker could be stopped while it held a permit")


def _assert_at_most_two_overlapping(jobs) -> None:
    """From the effects: the completed slices' [start, end] intervals never overlap by three."""
    spans = []
    for job in jobs:
        end = Effect.objects.get(job_id=job.id, item=1)
        start = Effect.objects.get(job_id=job.id, item=0, epoch=end.epoch)
        spans.append((start.created_at, end.created_at))
    for at, _ in spans:
        covering = sum(1 for s, e in spans if s <= at <= e)
        assert covering <= 2, f"{covering} slices of the key ran at once"
