"""Broker transports under faults, against real brokers: a broker restarted mid-run, a
consumer SIGKILLed before its ack (invariant 31: nothing lost, nothing run twice)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import pytest
from django.db import transaction

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.runtime import intake
from durable_jobs.runtime.intake import Intake
from durable_jobs.runtime.reconciler import Reconciler
from durable_jobs.runtime.worker import Worker
from durable_jobs.states import Scope
from durable_jobs.transports import publishing as transports
from durable_jobs.transports import streams
from tests.brokers.support import (
    QUEUE,
    TRANSPORTS,
    URLS,
    broker_settings,
    delete_names,
    own_broker,
    unique_prefix,
)
from tests.factories import reload


def wait_until(check, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds}s: {what}")
        time.sleep(0.1)


def all_completed(jobs) -> bool:
    return all(reload(j).status == "completed" for j in jobs)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_broker_restart_mid_run__loses_no_job(transport, settings, caplog):
    """The broker dies under a running worker and comes back: jobs started before, during
    and after all complete; the outage is one WARNING and its end one INFO."""
    with own_broker(transport) as server:
        settings.DURABLE_JOBS = {
            **broker_settings(
                settings.DURABLE_JOBS, transport, unique_prefix(), urls={transport: server.url}
            ),
            "EXECUTION": "thread",
            "PENDING_TTL": 1.0,
            "RECONCILE_INTERVAL": 0.2,
            "BROKER_TIMEOUT": 1.0,
        }
        worker = Worker(queues=[QUEUE], concurrency=2)
        running = threading.Thread(target=worker.run, daemon=True)
        running.start()
        try:
            with caplog.at_level(logging.INFO, logger="durable_jobs.transports"):
                before = [durable.start("demo.noop", queue=QUEUE) for _ in range(5)]
                wait_until(lambda: all_completed(before), 20, "the jobs started before")
                server.kill()
                during = [durable.start("demo.noop", queue=QUEUE) for _ in range(5)]
                wait_until(lambda: all_completed(during), 20, "the jobs started while it was down")
                server.start()
                after = [durable.start("demo.noop", queue=QUEUE) for _ in range(5)]
                wait_until(lambda: all_completed(after), 20, "the jobs started after")
        finally:
            worker.stop()
            running.join(20)
            transports.close_all()
    said = [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == "durable_jobs.transports"
    ]
    assert [level for level, _ in said if level == "WARNING"] == ["WARNING"], said
    assert sum("reachable again" in text for _, text in said) == 1, said
    assert all(reload(j).redrives == 0 for j in before + after)


CONSUMER = """
import sys
from durable_jobs.transports.{module} import {cls}
broker = {cls}({url!r}, prefix={prefix!r}, timeout=5)
received = broker.receive([{queue!r}], wait=5)
print(received.message.job_id if received and received.message else "none", flush=True)
sys.stdin.read()  # holds the message, unacked, until it is killed
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("claimed_before_death", [False, True])
def test_a_consumer_sigkilled_before_its_ack(
    transport, claimed_before_death, settings, monkeypatch
):
    """Killed before claiming: the broker redelivers and another consumer claims the job.
    Killed after claiming, before acking: the redelivery claims nothing and is dropped."""
    monkeypatch.setattr(streams, "REDELIVER_AFTER_MS", 0)  # Redis: reclaim at once
    monkeypatch.setattr(streams, "RECLAIM_EVERY", 0.0)
    prefix = unique_prefix()
    settings.DURABLE_JOBS = broker_settings(settings.DURABLE_JOBS, transport, prefix)
    job = durable.start("demo.noop", queue=QUEUE)
    module, cls = ("amqp", "RabbitMQ") if transport == "rabbitmq" else ("streams", "RedisStreams")
    consumer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CONSUMER.format(
                module=module, cls=cls, url=URLS[transport], prefix=prefix, queue=QUEUE
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert consumer.stdout.readline().strip() == str(job.id)
        if claimed_before_death:
            assert (
                store.claim(
                    job.id,
                    Scope(tenant=job.tenant_id),
                    store_delivery(job),
                    "the-consumer:x",
                    30_000,
                )
                is not None
            )
        consumer.kill()  # SIGKILL: no ack, no goodbye
        consumer.wait(10)

        claimed, then = [], intake.REST
        worker = Intake([QUEUE])
        deadline = time.monotonic() + 5
        while not claimed and then != intake.AGAIN and time.monotonic() < deadline:
            claimed, then = worker.claim("w", 30_000, limit=1, wait=1.0)
    finally:
        if consumer.poll() is None:
            consumer.kill()
        transports.close_all()
        delete_names(transport, prefix)

    row = reload(job)
    if claimed_before_death:
        assert (claimed, then) == ([], intake.AGAIN)  # redelivered, refused, dropped
        assert row.lease_owner == "the-consumer:x" and row.lease_epoch == 1
    else:
        assert [j.id for j in claimed] == [job.id]
        assert row.lease_owner == f"w:{job.id}" and row.lease_epoch == 1


def store_delivery(job):
    from durable_jobs.states import Delivery

    return Delivery(seq=job.continuation_seq, redrives=job.redrives)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_connection_cut_between_commit_and_publish__is_re_driven(transport, settings):
    """The publisher's connection is up when the start commits and gone when it publishes:
    the job waits, pending, until the broker is back, and the stale-pending pass re-drives
    it under a new pair; a worker then claims it once."""
    with own_broker(transport) as server:
        settings.DURABLE_JOBS = {
            **broker_settings(
                settings.DURABLE_JOBS, transport, unique_prefix(), urls={transport: server.url}
            ),
            "BROKER_TIMEOUT": 1.0,
        }
        warm_up = durable.start("demo.noop", queue=QUEUE)  # the publisher's connection is warm
        with transaction.atomic():
            transaction.on_commit(server.kill)  # runs first: after the commit, before the publish
            job = durable.start("demo.noop", queue=QUEUE)
        assert reload(job).queue_job_id is None  # the publish found the connection cut
        server.start()

        settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "PENDING_TTL": 0.001}
        broker = transports.broker(transport)
        # The warm-up's message may have come back with the broker (RabbitMQ keeps a durable
        # message it confirmed, though a SIGKILLed node can still lose the last one) or not
        # (Redis here runs without persistence). A consumer claims whatever came back; the
        # stale pass leaves a queue alone while it holds messages, and re-drives the rest.
        drained = []
        while (received := broker.receive([QUEUE], wait=2.0)) is not None:
            message = received.message
            assert store.claim(message.job_id, message.scope, message.delivery, "w", 30_000)
            drained.append(message.job_id)
            broker.ack(received)
        # RabbitMQ's queue count trails the ack by a moment: a pass that still sees the
        # message leaves the queue alone, and the next one re-drives.
        redriven = 0
        deadline = time.monotonic() + 5
        while not redriven and time.monotonic() < deadline:
            redriven = Reconciler().run_pass().lost_deliveries
            time.sleep(0.1)
        published = []
        while (received := broker.receive([QUEUE], wait=1.0)) is not None:
            published.append(received.message)
            broker.ack(received)
        transports.close_all()

    assert drained in ([], [str(warm_up.id)])  # the cut-off job was never on the broker
    lost = {str(warm_up.id), str(job.id)} - set(drained)
    assert redriven == len(lost)  # every job whose delivery was lost, and only those
    assert sorted(m.job_id for m in published) == sorted(lost)  # each published once
    assert (str(job.id), 0, 1) in {(m.job_id, m.seq, m.redrives) for m in published}
    assert reload(job).redrives == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_connection_the_broker_dropped_while_idle__reconnects_without_an_outage(
    transport, settings, caplog
):
    """A web thread's or a slot's connection, idle for an hour, may be gone: the next
    publish reconnects once, quietly, instead of logging an outage and leaving the start
    to the stale-pending pass."""
    with own_broker(transport) as server:
        settings.DURABLE_JOBS = broker_settings(
            settings.DURABLE_JOBS, transport, unique_prefix(), urls={transport: server.url}
        )
        durable.start("demo.noop", queue=QUEUE)  # this thread's connection is made
        server.kill()
        server.start()  # the broker is back; this thread's connection is not
        with caplog.at_level(logging.WARNING, logger="durable_jobs.transports"):
            job = durable.start("demo.noop", queue=QUEUE)
        recorded = reload(job).queue_job_id
        transports.close_all()

    assert recorded is not None
    assert [r for r in caplog.records if r.name == "durable_jobs.transports"] == []
