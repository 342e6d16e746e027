"""Live workers: each worker process is listed while its beat is fresh, with what it serves
and runs now, and ``explain`` reads the list ("no live worker serves queue 'reprots'")."""

from __future__ import annotations

import pytest
from django.db import connection

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.console import explain, workers
from durable_jobs.models import WorkerProcess
from tests.factories import live_worker

pytestmark = pytest.mark.django_db


def register(identity: str, *, queues=("default",), kinds=("tests.live",)) -> None:
    live_worker(identity, queues=tuple(queues), kinds=tuple(kinds), slots=4)


def age_beat(identity: str, seconds: float) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE durable_jobs_worker SET beat_at = clock_timestamp() - %s * interval '1 second'"
            " WHERE identity = %s",
            [seconds, identity],
        )


@pytest.fixture
def kind(kinds):
    kinds.add("tests.live")
    return "tests.live"


def test_a_registered_worker_is_listed_with_what_it_serves_until_it_unregisters():
    register("host-a:4242:aaaaaa", queues=("reports", "default"))
    [live] = workers.live_workers()
    assert (live.identity, live.queues, live.kinds, live.slots) == (
        "host-a:4242:aaaaaa",
        ["default", "reports"],
        ["tests.live"],
        4,
    )
    assert store.beat_worker("host-a:4242:aaaaaa", kinds=["tests.live", "tests.more"])
    assert workers.live_workers()[0].kinds == ["tests.live", "tests.more"]
    store.unregister_worker("host-a:4242:aaaaaa")
    assert workers.live_workers() == []
    assert not store.beat_worker("host-a:4242:aaaaaa", kinds=[]), "a beat of a removed row says so"


def test_a_worker_whose_beat_expired_is_not_listed_and_the_next_start_prunes_it():
    register("host-a:1:dead00")
    age_beat("host-a:1:dead00", 60)
    assert workers.live_workers() == [], "LEASE_TTL (3 s here) past its beat: not live"
    register("host-b:2:fresh0")
    assert list(WorkerProcess.objects.values_list("identity", flat=True)) == ["host-b:2:fresh0"]


def test_what_a_worker_runs_now_is_read_from_the_leases(kind):
    register("host-a:4242:aaaaaa")
    register("host-b:7:bbbbbb")
    durable.start(kind)
    durable.start(kind)
    store.dequeue(["default"], "host-a:4242:aaaaaa/0", 60_000, kinds=[kind], limit=2)
    running = {w.identity: w.running for w in workers.live_workers()}
    assert running == {"host-a:4242:aaaaaa": {kind: 2}, "host-b:7:bbbbbb": {}}


def test_explain_names_the_queues_live_workers_serve_when_none_serves_the_jobs(kind):
    register("host-a:4242:aaaaaa", queues=("default", "reports"))
    job = durable.start(kind, queue="reprots")
    reasons = explain.explain(job)
    assert "No live worker serves queue 'reprots'; workers serve 'default', 'reports'." in reasons


def test_explain_says_when_no_live_worker_can_run_the_kind(kind):
    register("host-a:4242:aaaaaa", kinds=("tests.other",))
    job = durable.start(kind)
    assert any(
        "No live worker serving 'default' can run kind 'tests.live'" in r
        for r in explain.explain(job)
    )


def test_explain_says_when_no_worker_is_running_at_all(kind):
    job = durable.start(kind)
    assert any("No live worker is running" in r for r in explain.explain(job))


def test_the_worker_list_is_read_only_through_the_orm():
    register("host-a:4242:aaaaaa")
    from durable_jobs.models import ReadOnlyJobRow

    with pytest.raises(ReadOnlyJobRow):
        WorkerProcess.objects.all().delete()


def test_the_workers_command_lists_each_live_worker_in_one_line(kind):
    import json
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("durable_jobs", "workers", stdout=out)
    assert out.getvalue().strip() == "no live worker (none has beaten within LEASE_TTL)"
    register("host-a:4242:aaaaaa", queues=("default", "reports"))
    durable.start(kind)
    store.dequeue(["default"], "host-a:4242:aaaaaa/0", 60_000, kinds=[kind])
    out = StringIO()
    call_command("durable_jobs", "workers", stdout=out)
    [line] = out.getvalue().strip().splitlines()
    assert line.startswith("host-a:4242:aaaaaa  version 0.1.0, 4 slot(s), process;")
    assert "queues default,reports" in line and line.endswith("running: tests.live x1")
    out = StringIO()
    call_command("durable_jobs", "workers", "--json", stdout=out)
    [listed] = json.loads(out.getvalue())
    assert listed["identity"] == "host-a:4242:aaaaaa" and listed["running"] == {"tests.live": 1}
