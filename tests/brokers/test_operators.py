"""What an operator sees of a broker transport: ``stats``, the console, the metrics."""

from __future__ import annotations

import io
import re
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.urls import reverse

import durable_jobs as durable
from durable_jobs.console import stats
from durable_jobs.console.prometheus import DatabaseCollector
from durable_jobs.transports import publishing as transports
from tests.brokers.support import QUEUE
from tests.brokers.test_transports import backlog


def test_stats__report_each_broker_queues_health(brokered):
    durable.start("demo.noop", queue=QUEUE)
    backlog(settles_at=(1, 0))

    [found] = stats.collect()["transports"]
    out = io.StringIO()
    call_command("durable_jobs", "stats", stdout=out)

    assert (found["transport"], found["queue"], found["reachable"], found["backlog"]) == (
        brokered,
        QUEUE,
        True,
        1,
    )
    assert f"{brokered}/{QUEUE}: reachable, backlog 1" in out.getvalue()


def test_stats__say_when_a_broker_is_unreachable(brokered, settings):
    urls = {"rabbitmq": "amqp://guest:guest@127.0.0.1:1/%2F", "redis": "redis://127.0.0.1:1/0"}
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "BROKER_URLS": urls, "BROKER_TIMEOUT": 0.5}
    out = io.StringIO()
    call_command("durable_jobs", "stats", stdout=out)
    assert f"{brokered}/{QUEUE}: UNREACHABLE" in out.getvalue()


def test_metrics__export_the_backlog(brokered):
    for _ in range(2):
        durable.start("demo.noop", queue=QUEUE)
    backlog(settles_at=(2, 0))

    families = {family.name: family for family in DatabaseCollector().collect()}

    [sample] = families["durable_jobs_broker_backlog"].samples
    assert sample.labels == {"transport": brokered, "queue": QUEUE} and sample.value == 2
    [up] = families["durable_jobs_broker_up"].samples
    assert up.value == 1


def test_console__the_workers_page_shows_each_broker_queue(brokered, admin_client):
    durable.start("demo.noop", queue=QUEUE)
    backlog(settles_at=(1, 0))
    page = admin_client.get(reverse("admin:durable_jobs_workerprocess_changelist"))
    assert page.status_code == 200
    assert f"{brokered}/{QUEUE}: reachable, backlog 1" in page.content.decode().lower()


def test_stats__without_broker_queues_ask_no_broker(transactional_db):
    assert stats.collect()["transports"] == []


@pytest.mark.parametrize("brokered", ["redis"], indirect=True)
def test_health__redis_reports_backlog_delayed_unacked_and_the_oldest_age(
    brokered, settings, client
):
    """2 deliverable, 3 due later, 1 taken by a consumer that has not acked, the oldest
    at least 0.6 s old: stats, its JSON and the scrape view all say exactly that.
    (RabbitMQ has no unacked or delayed figure: docs/transports.rst.)"""
    began = time.monotonic()
    for _ in range(3):
        durable.start("demo.noop", queue=QUEUE)
    for _ in range(3):
        durable.start("demo.noop", queue=QUEUE, run_after=timedelta(minutes=5))
    assert transports.broker("redis").receive([QUEUE], wait=1.0) is not None  # never acked
    time.sleep(0.6)

    [found] = stats.collect()["transports"]
    out = io.StringIO()
    call_command("durable_jobs", "stats", stdout=out)
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "METRICS_TOKEN": "s3cret-token-0123456789"}
    scraped = client.get(
        "/metrics/durable-jobs", HTTP_AUTHORIZATION="Bearer s3cret-token-0123456789"
    ).content.decode()
    waited = time.monotonic() - began + 0.05  # the stats line rounds to a tenth

    figures = (found["backlog"], found["delayed"], found["unacked"])
    assert figures == (2, 3, 1)
    assert 0.6 <= found["oldest_age"] <= waited
    [line] = [x for x in out.getvalue().splitlines() if x.strip().startswith("redis/")]
    assert "redis/brokered: reachable, backlog 2, delayed 3, unacked 1, oldest " in line
    assert 0.6 <= float(re.search(r"oldest ([0-9.]+)s", line)[1]) <= waited
    labels = '{queue="brokered",transport="redis"}'
    for name, value in [("up", 1), ("backlog", 2), ("delayed", 3), ("unacked", 1)]:
        assert f"durable_jobs_broker_{name}{labels} {float(value)}" in scraped
    age = re.search(rf"durable_jobs_broker_oldest_message_seconds{labels} ([0-9.e+-]+)", scraped)
    assert age and 0.6 <= float(age[1]) <= waited
