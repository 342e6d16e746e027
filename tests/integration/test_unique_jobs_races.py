"""Invariant 25 under real concurrency: two starts with one unique key on two connections,
a rolled-back unique start, and ``start_many`` racing a start. The indexes decide; the
loser gets the holder back in a transaction it can still use."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import transaction

import durable_jobs as durable
from durable_jobs.models import Job
from testproject.demo.models import Report
from tests.integration.support import in_thread, job_count

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "tests.unique_race"


@pytest.fixture
def kind(kinds):
    kinds.add(KIND, unique=True)
    return KIND


class Rollback(Exception):
    pass


def _hold_a_start(start, *, roll_back: bool = False):
    """Run ``start()`` in a transaction on another connection and keep it open until told;
    return (the started job holder dict, the 'holding' event, the 'release' event, thread)."""
    holding, release = threading.Event(), threading.Event()
    started: dict[str, Job] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                started["job"] = start()
                holding.set()
                release.wait(5)
                if roll_back:
                    raise Rollback
        except Rollback:
            pass

    thread = in_thread(first)
    assert holding.wait(5)
    return started, release, thread


def test_two_starts_on_two_connections_make_one_job_and_the_loser_gets_it_flagged(kind):
    """The second start's lookup cannot see the first's uncommitted row, so its insert
    waits on the unique index, fails when the first commits, and answers with the winner
    from a savepoint: its own transaction carries on and commits."""
    started, release, thread = _hold_a_start(lambda: durable.start(kind, input={"n": 1}))
    timer = threading.Timer(0.3, release.set)
    timer.start()
    began = time.monotonic()
    with transaction.atomic():
        Report.objects.create(name="before")
        second = durable.start(kind, input={"n": 1})
        waited = time.monotonic() - began
        Report.objects.create(name="after: the transaction is still usable")
    thread.join(5)

    assert waited >= 0.25, "the insert should have waited on the winner's uncommitted row"
    assert second.id == started["job"].id and second.deduplicated
    assert not started["job"].deduplicated
    assert Job.objects.count() == 1 and Report.objects.count() == 2


def test_a_rolled_back_unique_start_never_blocks_the_key(kind, other_connection):
    """oban#1093's trap: the key belongs to a row, so a start that rolls back takes its
    key with it; the start waiting on it creates its own job."""
    started, release, thread = _hold_a_start(
        lambda: durable.start(kind, input={"n": 1}), roll_back=True
    )
    threading.Timer(0.3, release.set).start()
    mine = durable.start(kind, input={"n": 1})
    thread.join(5)

    assert mine.id != started["job"].id and not mine.deduplicated
    assert list(Job.objects.values_list("id", flat=True)) == [mine.id]
    assert job_count(other_connection) == 1


def test_racing_starts_with_a_period_make_one_job(kind):
    hourly = durable.Unique(period=3600)
    started, release, thread = _hold_a_start(
        lambda: durable.start(kind, input={"n": 1}, unique=hourly)
    )
    threading.Timer(0.3, release.set).start()
    second = durable.start(kind, input={"n": 1}, unique=hourly)
    thread.join(5)
    assert second.id == started["job"].id and second.deduplicated


def test_start_many_racing_a_start_answers_the_held_row_with_the_winner(kind):
    """The batch's insert waits on the index for the start holding one of its keys, then
    plans again from a fresh look: the held row answers with the winner, the others are
    created, all in one go."""
    started, release, thread = _hold_a_start(lambda: durable.start(kind, input={"n": 2}))
    threading.Timer(0.3, release.set).start()
    with transaction.atomic():
        ids = durable.start_many([{"kind": kind, "input": {"n": n}} for n in (1, 2, 3)])
        Report.objects.create(name="still usable")
    thread.join(5)

    assert ids[1] == started["job"].id
    assert len(set(ids)) == 3 and Job.objects.count() == 3


def test_two_batches_racing_with_overlapping_keys_agree_on_every_row(kind):
    started, release, thread = _hold_a_start(
        lambda: durable.start_many([{"kind": kind, "input": {"n": n}} for n in (1, 2)])
    )
    threading.Timer(0.3, release.set).start()
    mine = durable.start_many([{"kind": kind, "input": {"n": n}} for n in (2, 3, 1)])
    thread.join(5)

    first = started["job"]
    assert (mine[0], mine[2]) == (first[1], first[0])
    assert Job.objects.count() == 3
