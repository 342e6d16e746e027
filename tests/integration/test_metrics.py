"""The metrics hook, the Prometheus sink and the scrape view, and the signals."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from prometheus_client import CollectorRegistry

import durable_jobs as durable
from durable_jobs import metrics, signals, testing
from durable_jobs.console.prometheus import PrometheusSink
from tests.factories import JobFactory, running

pytestmark = pytest.mark.django_db


@pytest.fixture
def sink():
    registry = CollectorRegistry()
    sink = PrometheusSink(registry)
    metrics.add_sink(sink)
    yield registry
    metrics.remove_sink(sink)


def test_counters_follow_what_the_worker_did(sink):
    durable.start("demo.flaky", input={"failures": 1})
    durable.start("demo.always_fails")
    testing.run_jobs(fast_forward=True)
    assert sink.get_sample_value("durable_jobs_jobs_started_total", {"kind": "demo.flaky"}) == 1
    assert sink.get_sample_value("durable_jobs_jobs_completed_total", {"kind": "demo.flaky"}) == 1
    assert (
        sink.get_sample_value("durable_jobs_jobs_failed_total", {"kind": "demo.always_fails"}) == 1
    )
    assert (
        sink.get_sample_value(
            "durable_jobs_slices_total", {"kind": "demo.flaky", "outcome": "retrying"}
        )
        == 1
    )
    assert (
        sink.get_sample_value(
            "durable_jobs_slice_seconds_count", {"kind": "demo.flaky", "outcome": "completed"}
        )
        == 1
    )


def test_a_raising_sink_never_breaks_a_job():
    def broken(*args):
        raise RuntimeError("sink down")

    metrics.add_sink(broken)
    try:
        job = durable.start("demo.flaky", input={"failures": 0})
        testing.run_jobs()
    finally:
        metrics.remove_sink(broken)
    assert durable.get(job.id).status == "completed"


def test_the_scrape_view_refuses_strangers_and_a_wrong_token(client, settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "METRICS_TOKEN": "s3cret-token-0123456789"}
    assert client.get("/metrics/durable-jobs").status_code == 401
    wrong = client.get("/metrics/durable-jobs", HTTP_AUTHORIZATION="Bearer not-the-token-at-all")
    assert wrong.status_code == 401 and b"durable_jobs_jobs" not in wrong.content
    user = User.objects.create_user("nobody", password="pw")
    client.force_login(user)
    assert client.get("/metrics/durable-jobs").status_code == 401, "logged in, but without view_job"


def test_the_scrape_view_answers_the_bearer_token(client, settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "METRICS_TOKEN": "s3cret-token-0123456789"}
    JobFactory(kind="demo.flaky")
    running(kind="demo.flaky", lease_owner=None, lease_expires_at=None, next_run_at=30)
    text = client.get(
        "/metrics/durable-jobs", HTTP_AUTHORIZATION="Bearer s3cret-token-0123456789"
    ).content.decode()
    assert 'durable_jobs_jobs{kind="demo.flaky",status="pending"} 1.0' in text
    # A failed slice waiting out its backoff holds no lease: waiting, not running.
    assert 'durable_jobs_jobs{kind="demo.flaky",status="waiting"} 1.0' in text
    assert 'status="running"' not in text


def test_the_scrape_view_reports_database_gauges(client):
    user = User.objects.create_user("viewer", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(user)
    JobFactory(kind="demo.flaky")
    running(kind="demo.flaky", lease_expires_at=-60)
    JobFactory(
        kind="demo.flaky",
        status="failed",
        parked_at=-1,
        finished_at=-1,
        error_code="poison",
        pending_since=None,
    )
    text = client.get("/metrics/durable-jobs").content.decode()
    assert 'durable_jobs_jobs{kind="demo.flaky",status="pending"} 1.0' in text
    assert "durable_jobs_running_expired_leases 1.0" in text
    assert 'durable_jobs_parked{reason="poison"} 1.0' in text


def test_signals_fire_with_send_robust():
    seen = []

    def receiver(sender, job, outcome=None, **kwargs):
        seen.append((job.kind, outcome))
        raise RuntimeError("a broken receiver must not fail the job")

    signals.job_finished.connect(receiver)
    try:
        job = durable.start("demo.flaky", input={"failures": 0})
        testing.run_jobs()
    finally:
        signals.job_finished.disconnect(receiver)
    assert seen == [("demo.flaky", "completed")]
    assert durable.get(job.id).status == "completed"
