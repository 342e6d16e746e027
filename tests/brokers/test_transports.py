"""Broker transports against the real RabbitMQ and Redis (invariant 31, DESIGN §6): publish
after commit, the fenced claim of each delivery, cancel, the lost publish re-driven."""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta

import pytest
import redis
from django.db import transaction

import durable_jobs as durable
from durable_jobs import conf, registry, store
from durable_jobs.runtime import intake
from durable_jobs.runtime.intake import Intake
from durable_jobs.runtime.reconciler import Reconciler
from durable_jobs.states import Delivery, Lease
from durable_jobs.transports import publishing as transports
from durable_jobs.transports import streams
from tests.brokers.support import QUEUE, URLS, black_hole
from tests.factories import reload
from tests.integration.support import fail

TTL_MS = 30_000


def backlog(queue: str = QUEUE, *, settles_at: tuple[int, int] | None = None) -> tuple[int, int]:
    """(deliverable now, taken and unacked) on the broker, as an operator reads them.

    RabbitMQ's queue counts trail a confirmed publish by a moment: with ``settles_at``,
    read again for up to two seconds until the figures reach it.
    """
    deadline = time.monotonic() + 2.0
    while True:
        [found] = transports.health([queue])
        assert found.reachable, found.error
        figures = (found.backlog or 0, found.unacked or 0)
        if settles_at is None or figures == settles_at or time.monotonic() > deadline:
            return figures
        time.sleep(0.05)


def take(worker: Intake, *, wait: float = 2.0) -> tuple[list, str]:
    return worker.claim("w", TTL_MS, limit=1, wait=wait)


def publish_first_pair_again(job) -> None:
    """A late copy of the job's first delivery, (seq 0, redrives 0), as a broker that
    redelivers or a slow publisher would leave it."""
    transports.publish_job(
        job.id,
        queue=QUEUE,
        kind=job.kind,
        tenant=job.tenant_id,
        organization=None,
        delivery=Delivery(seq=0, redrives=0),
    )


def lease(job) -> Lease:
    return Lease(job_id=job.id, owner=job.lease_owner, epoch=job.lease_epoch, ttl_ms=TTL_MS)


def test_start__publishes_after_commit_and_records_the_message(brokered):
    with transaction.atomic():
        job = durable.start("demo.noop", queue=QUEUE)
        assert backlog() == (0, 0)  # nothing before the commit (invariant 9)
    assert backlog(settles_at=(1, 0)) == (1, 0)
    assert reload(job).queue_job_id  # for the cancel


def test_start__rolled_back_publishes_nothing(brokered):
    with pytest.raises(RuntimeError), transaction.atomic():
        durable.start("demo.noop", queue=QUEUE)
        raise RuntimeError("the caller's transaction fails")
    assert backlog(settles_at=(0, 0)) == (0, 0)


def test_start__on_a_database_queue_adds_no_hook_and_no_statement(
    brokered, django_capture_on_commit_callbacks, django_assert_num_queries
):
    """A project moving one queue keeps every other queue's start exactly as it was."""
    with django_capture_on_commit_callbacks() as hooks:
        with django_assert_num_queries(1):  # the insert (its NOTIFY inside), nothing more
            durable.start("demo.noop", queue="default")
    assert hooks == []


def test_start_many__publishes_each_broker_queue_job_after_commit(brokered):
    durable.start_many([{"kind": "demo.noop", "queue": QUEUE}] * 3 + [{"kind": "demo.noop"}])
    assert backlog(settles_at=(3, 0)) == (3, 0)


def test_consume__claims_through_the_fence_and_a_duplicate_claims_nothing(brokered):
    job = durable.start("demo.noop", queue=QUEUE)
    assert transports.publish_row(reload(job))  # a duplicate delivery of the same pair
    worker = Intake([QUEUE])

    claimed, _ = take(worker)
    again, then = take(worker)

    assert [j.id for j in claimed] == [job.id] and claimed[0].status == "running"
    assert (again, then) == ([], intake.AGAIN)  # acked and dropped
    assert backlog(settles_at=(0, 0)) == (0, 0)


def test_consume__a_straggler_of_an_earlier_pair_claims_nothing(brokered):
    """The slice yielded (seq + 1): a late copy of the first delivery must not run it again."""
    job = durable.start("demo.noop", queue=QUEUE)
    worker = Intake([QUEUE])
    [first] = take(worker)[0]
    assert store.yield_slice(lease(first)) == Delivery(seq=1, redrives=0)
    worker.after_slice(first)  # publishes (seq 1, redrives 0)
    publish_first_pair_again(job)  # the straggler: (seq 0, redrives 0)

    claims = [take(worker)[0], take(worker)[0]]

    assert sorted(len(c) for c in claims) == [0, 1]
    assert reload(job).continuation_seq == 1 and reload(job).status == "running"
    assert backlog(settles_at=(0, 0)) == (0, 0)


def test_consume__a_stale_delivery_is_dropped_with_one_debug_line(brokered, caplog):
    """Issue item 3: acked and dropped, logged at debug; an operator sees no warning."""
    job = durable.start("demo.noop", queue=QUEUE)
    worker = Intake([QUEUE])
    [first] = take(worker)[0]
    assert store.yield_slice(lease(first)) == Delivery(seq=1, redrives=0)
    publish_first_pair_again(job)  # only a late copy of the first pair is in the broker

    with caplog.at_level(logging.DEBUG, logger="durable_jobs.worker"):
        assert take(worker) == ([], intake.AGAIN)

    said = [r for r in caplog.records if r.name == "durable_jobs.worker"]
    assert [(r.levelname, r.getMessage().split(":")[0]) for r in said] == [
        ("DEBUG", f"job {job.id}")
    ]
    assert "delivery (seq 0, redrives 0) claims nothing" in said[0].getMessage()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert backlog(settles_at=(0, 0)) == (0, 0)  # acked: gone from the broker
    assert reload(job).continuation_seq == 1


def test_consume__a_retry_is_published_with_its_backoff(brokered):
    job = durable.start("demo.noop", queue=QUEUE)
    worker = Intake([QUEUE])
    [claimed] = take(worker)[0]
    assert fail(lease(claimed), backoff_base_ms=300, backoff_max_ms=300)
    worker.after_slice(claimed)

    assert take(worker, wait=0.0)[0] == []  # not before its backoff (0.15-0.3 s)
    retried, _ = take(worker, wait=3.0)
    if not retried:  # a delayed Redis message moves in at the next read
        retried, _ = take(worker, wait=1.0)
    assert [j.id for j in retried] == [job.id]


def test_cancel__the_claim_refuses_what_the_broker_cannot_take_back(brokered):
    job = durable.start("demo.noop", queue=QUEUE)
    durable.cancel(job.id)
    worker = Intake([QUEUE])

    assert take(worker, wait=0.5)[0] == []
    assert backlog(settles_at=(0, 0)) == (
        0,
        0,
    )  # Redis removed it at the cancel; RabbitMQ's was dropped
    Reconciler().run_pass()
    assert reload(job).status == "cancelled"


@pytest.fixture
def on_redis(brokered, settings):
    """A client of the real Redis the queue lives on, and the queue's stream name there."""
    client = redis.Redis.from_url(URLS["redis"])
    yield client, f"{settings.DURABLE_JOBS['BROKER_PREFIX']}.{QUEUE}"
    client.close()


@pytest.mark.parametrize("brokered", ["redis"], indirect=True)
def test_cancel__redis_takes_a_ready_message_back_from_its_stream(on_redis):
    client, stream = on_redis
    job = durable.start("demo.noop", queue=QUEUE)
    other = durable.start("demo.noop", queue=QUEUE)
    assert client.xlen(stream) == 2

    durable.cancel(job.id)

    [(_, fields)] = client.xrange(stream)  # what is left: the other job's message
    assert json.loads(fields[b"m"])["job_id"] == str(other.id)
    assert transports.health()[0].backlog == 1


@pytest.mark.parametrize("brokered", ["redis"], indirect=True)
def test_cancel__redis_takes_a_delayed_message_back_from_its_scheduled_set(on_redis):
    client, stream = on_redis
    job = durable.start("demo.noop", queue=QUEUE, run_after=timedelta(minutes=5))
    later = durable.start("demo.noop", queue=QUEUE, run_after=timedelta(minutes=5))
    assert client.zcard(f"{stream}.scheduled") == 2

    durable.cancel(job.id)

    [member] = client.zrange(f"{stream}.scheduled", 0, -1)
    assert json.loads(member)["job_id"] == str(later.id)
    assert transports.health()[0].delayed == 1
    assert client.xlen(stream) == 0


def test_a_kind_with_flow_control__is_refused_on_a_broker_queue_in_one_line(brokered, kinds):
    """Invariant 26 is decided by the database's keyed claim; a broker delivery claims one
    job with no permit to grant, so a keyed start there is refused and stores nothing."""
    kinds.add("tests.limited", flow=durable.FlowControl(key="kind", concurrency=1))

    with pytest.raises(durable.InvalidInput, match="only the database transport") as refused:
        durable.start("tests.limited", queue=QUEUE)

    assert "\n" not in str(refused.value)
    assert durable.list_jobs(kind="tests.limited")[1] == 0
    assert durable.start("tests.limited").flow_key  # on a database queue it is limited


def test_workflows__are_refused_on_a_broker_queue_in_one_line(brokered, kinds):
    """A workflow's wake-ups are decided in terminal and sending statements that publish
    nothing: a job started after others, or a child, on a broker queue is refused."""
    from durable_jobs.runtime import flow

    kinds.add("tests.brokered_child", queue=QUEUE)
    dependency = durable.start("demo.noop")

    with pytest.raises(durable.InvalidInput, match="delivered by a broker") as refused:
        durable.start("demo.noop", queue=QUEUE, after=[dependency])
    assert "\n" not in str(refused.value)
    assert durable.list_jobs(kind="demo.noop")[1] == 1  # the dependency alone

    with pytest.raises(durable.InvalidInput, match="workflows .* run on database queues"):
        flow.child_rows(dependency.id, [{"kind": "tests.brokered_child", "key": "a"}])


def test_a_kind_this_worker_cannot_run__is_left_for_another(brokered, kinds, monkeypatch):
    """Invariant 14b: not claimed, not charged, not lost."""
    monkeypatch.setattr(streams, "REDELIVER_AFTER_MS", 0)
    monkeypatch.setattr(streams, "RECLAIM_EVERY", 0.0)
    kinds.add("tests.later")
    job = durable.start("tests.later", queue=QUEUE)
    registry.unregister("tests.later")
    old_deploy = Intake([QUEUE])

    assert take(old_deploy, wait=0.5) == ([], intake.REST)
    assert reload(job).status == "pending" and reload(job).redrives == 0

    kinds.add("tests.later")
    new_deploy = Intake([QUEUE])
    claimed, _ = take(new_deploy)
    assert [j.id for j in claimed] == [job.id]


def test_paused_queue__its_messages_stay_unread_in_the_broker_until_the_resume(brokered):
    """Invariant 27 on a broker queue: not claimed, not charged, not lost."""
    job = durable.start("demo.noop", queue=QUEUE)
    durable.pause_queue(QUEUE, reason="incident")
    worker = Intake([QUEUE])

    assert take(worker, wait=0.5) == ([], intake.REST)
    assert backlog(settles_at=(1, 0)) == (1, 0)  # still deliverable, nobody read it
    durable.resume_queue(QUEUE)
    claimed, _ = take(worker)

    assert [j.id for j in claimed] == [job.id]
    row = reload(job)
    assert (row.redrives, row.consecutive_failures, row.interruptions) == (0, 0, 0)


def test_paused_queue__a_message_read_as_the_pause_commits_goes_back_to_its_broker(
    brokered, monkeypatch
):
    """The pause lands between the claim step's read of the paused queues and its claim:
    the claim refuses the job (the dequeue's own predicate) and the message is handed
    back, so the resume finds it."""
    monkeypatch.setattr(streams, "REDELIVER_AFTER_MS", 0)
    monkeypatch.setattr(streams, "RECLAIM_EVERY", 0.0)
    job = durable.start("demo.noop", queue=QUEUE)
    worker = Intake([QUEUE])
    real_claim = store.claim

    def claim_as_the_pause_commits(*args, **kwargs):
        durable.pause_queue(QUEUE, reason="landed mid-step")  # autocommit: committed now
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(store, "claim", claim_as_the_pause_commits)
    assert take(worker, wait=0.5) == ([], intake.REST)
    monkeypatch.setattr(store, "claim", real_claim)
    assert reload(job).status == "pending" and reload(job).redrives == 0

    durable.resume_queue(QUEUE)
    claimed, _ = take(worker)
    assert [j.id for j in claimed] == [job.id]


def test_lost_publish__is_re_driven_by_the_stale_pending_pass(brokered, settings, caplog):
    """A broker that is down at commit loses nothing: one WARNING, then the reconciler's
    stale-pending pass re-drives the job under (seq, redrives + 1) and publishes again."""
    working = settings.DURABLE_JOBS
    down = {
        **working["BROKER_URLS"],
        "rabbitmq": "amqp://guest:guest@127.0.0.1:1/%2F",
        "redis": "redis://127.0.0.1:1/0",
    }
    settings.DURABLE_JOBS = {**working, "BROKER_URLS": down, "BROKER_TIMEOUT": 0.5}
    with caplog.at_level(logging.WARNING, logger="durable_jobs.transports"):
        jobs = [durable.start("demo.noop", queue=QUEUE) for _ in range(3)]
    assert [r.levelname for r in caplog.records].count("WARNING") == 1
    assert all(reload(j).queue_job_id is None for j in jobs)

    settings.DURABLE_JOBS = {**working, "PENDING_TTL": 0.001}
    report = Reconciler().run_pass()

    assert report.lost_deliveries == 3
    assert {reload(j).redrives for j in jobs} == {1}
    worker = Intake([QUEUE])
    claimed = [take(worker)[0] for _ in jobs]
    assert {c[0].id for c in claimed} == {j.id for j in jobs}


def test_a_publish_that_times_out__commits_the_start_and_is_re_driven(brokered, settings, caplog):
    """A broker that accepts the connection and never answers: the publish gives up after
    BROKER_TIMEOUT, the start stays committed, one WARNING line says so, and the
    stale-pending pass publishes the job once the broker answers."""
    working = settings.DURABLE_JOBS
    with black_hole() as port:
        hanging = {
            "rabbitmq": f"amqp://guest:guest@127.0.0.1:{port}/%2F",
            "redis": f"redis://127.0.0.1:{port}/0",
        }
        settings.DURABLE_JOBS = {**working, "BROKER_URLS": hanging, "BROKER_TIMEOUT": 0.5}
        with caplog.at_level(logging.DEBUG, logger="durable_jobs.transports"):
            began = time.monotonic()
            with transaction.atomic():
                job = durable.start("demo.noop", queue=QUEUE)
            took = time.monotonic() - began

    assert 0.4 <= took < 1.5  # it waited for the broker, for about BROKER_TIMEOUT
    row = reload(job)
    assert (row.status, row.queue_job_id, row.redrives) == ("pending", None, 0)
    [said] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    line = said.getMessage()
    assert said.levelname == "WARNING" and "\n" not in line and said.exc_info is None
    assert f"the {brokered} broker is unreachable" in line
    assert "re-driven as stale pending once it is back" in line

    settings.DURABLE_JOBS = {**working, "PENDING_TTL": 0.001}
    assert Reconciler().run_pass().lost_deliveries == 1
    assert reload(job).redrives == 1
    assert backlog(settles_at=(1, 0)) == (1, 0)
    [claimed] = take(Intake([QUEUE]))[0]
    assert (claimed.id, claimed.redrives) == (job.id, 1)


def test_stale_pass__leaves_a_job_whose_message_waits_behind_others(brokered, settings):
    """A message waiting in a backlog is not lost: re-driving it would spend its budget."""
    job = durable.start("demo.noop", queue=QUEUE)
    assert backlog(settles_at=(1, 0)) == (1, 0)
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "PENDING_TTL": 0.001}

    assert Reconciler().run_pass().lost_deliveries == 0
    assert reload(job).redrives == 0


def test_stale_pass__parks_a_job_whose_delivery_keeps_getting_lost(brokered, settings):
    """14a: the seed's budget bounds re-drives without a committed unit."""
    job = durable.start("demo.noop", queue=QUEUE)
    [taken] = take(Intake([QUEUE]))[0]  # consume its message and hand the job back
    store.yield_slice(lease(taken))
    settings.DURABLE_JOBS = {
        **settings.DURABLE_JOBS,
        "PENDING_TTL": 0.001,
        "MAX_REDRIVES_WITHOUT_COMMIT": 1,
    }
    Reconciler().run_pass()  # lost once: re-driven (and published)
    take(Intake([QUEUE]))  # its message is consumed again, the slice lost again
    again = reload(job)
    store.yield_slice(lease(again))

    Reconciler().run_pass()

    row = reload(job)
    assert (row.status, row.error_code) == ("failed", "poison")
    assert "delivery was lost 2 times" in row.error_message


def test_health__counts_the_backlog(brokered):
    for _ in range(2):
        durable.start("demo.noop", queue=QUEUE)
    assert backlog(settles_at=(2, 0)) == (2, 0)
    [found] = transports.health()
    assert (found.transport, found.queue, found.reachable) == (brokered, QUEUE, True)
    assert found.oldest_age is not None and found.oldest_age >= 0


def test_the_worker__runs_broker_jobs_to_completion(brokered, settings, kinds):
    """Slices, yields and retries over the broker: every job ends completed."""
    from durable_jobs.runtime.worker import Worker

    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "EXECUTION": "thread"}

    def twice(job):
        if (job.checkpoint or {}).get("n", 0) < 2:
            with job.fenced():
                job.save_checkpoint({"n": (job.checkpoint or {}).get("n", 0) + 1})
            return durable.YIELD
        return durable.DONE

    kinds.add("tests.twice", twice)
    jobs = [durable.start("demo.noop", queue=QUEUE) for _ in range(4)]
    jobs += [durable.start("tests.twice", queue=QUEUE)]
    jobs += [durable.start("demo.flaky", input={"failures": 1}, queue=QUEUE)]

    code = Worker(
        queues=[QUEUE], concurrency=2, burst=True, wait_for_retries=True, reconcile=False
    ).run()

    assert code == 0
    assert {reload(j).status for j in jobs} == {"completed"}
    assert reload(jobs[4]).continuation_seq == 2
    assert backlog(settles_at=(0, 0)) == (0, 0)
    assert conf.transport_of(QUEUE, conf.get()) == brokered


def test_start__a_job_due_later_is_never_delivered_early(brokered):
    """A claim reads no run time (the seed's reason), so the message itself waits."""
    job = durable.start("demo.noop", queue=QUEUE, run_after=timedelta(seconds=1.5))
    worker = Intake([QUEUE])

    assert take(worker, wait=0.5)[0] == []
    deadline = time.monotonic() + 5
    claimed: list = []
    while not claimed and time.monotonic() < deadline:
        claimed, _ = take(worker, wait=0.5)
    assert [j.id for j in claimed] == [job.id]
    row = reload(job)
    assert row.started_at >= row.created_at + timedelta(seconds=1.5)
