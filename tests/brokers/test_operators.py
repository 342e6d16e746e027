"""What an operator sees of a broker transport: ``stats``, the console, the metrics."""

from __future__ import annotations

import io

from django.core.management import call_command
from django.urls import reverse

import durable_jobs as durable
from durable_jobs.console import stats
from durable_jobs.console.prometheus import DatabaseCollector
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
