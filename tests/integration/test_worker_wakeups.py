"""One committed start wakes one idle slot, not all of them (issue #14: no thundering herd
on NOTIFY), and a transaction that starts many jobs (one folded notification) still gets
them all run without waiting for the poll interval."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from django.db import transaction

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.models import Job
from durable_jobs.runtime.worker import Worker
from tests.integration.support import wait_until as _wait

pytestmark = pytest.mark.django_db(transaction=True)

POLL = 60.0  # far longer than any wait below: only a notification can explain a prompt run


@dataclasses.dataclass
class Dequeues:
    """What the worker's slots asked of the queue since they all fell asleep."""

    claimed: list[int] = dataclasses.field(default_factory=list)  # rows each dequeue claimed
    asked: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (slot thread, limit)
    # Seconds a dequeue that claimed rows takes to return to any slot but the first to
    # claim (0: none): holds back the wake-ups that slot's full claim passes on.
    hold_others: float = 0.0
    first: int | None = None


@pytest.fixture
def idle_worker(settings, monkeypatch):
    """A 4-slot worker (thread execution) asleep on a long poll, watching its dequeues.

    Asleep is what the database sees: the LISTEN is in place and no slot has claimed
    (dequeued) for a while, after every slot looked at least once."""
    settings.DURABLE_JOBS = {
        **settings.DURABLE_JOBS,
        "POLL_INTERVAL": POLL,
        "NOTIFY_CHANNEL": "durable_jobs",
    }
    seen = Dequeues()
    real_dequeue = store.dequeue_from  # the worker's claim

    def watched(*args, **kwargs):
        claimed = real_dequeue(*args, **kwargs)
        thread = threading.get_ident()
        seen.claimed.append(len(claimed))
        seen.asked.append((thread, kwargs["limit"]))
        if claimed and seen.first is None:
            seen.first = thread
        if claimed and seen.hold_others and thread != seen.first:
            time.sleep(seen.hold_others)
        return claimed

    monkeypatch.setattr(store, "dequeue_from", watched)
    worker = Worker(concurrency=4, execution="thread", reconcile=False)
    exit_code: list[int] = []
    thread = threading.Thread(target=lambda: exit_code.append(worker.run()), daemon=True)
    thread.start()
    _wait(lambda: len(seen.claimed) >= 4 and _listening(), "every slot to look once and a LISTEN")
    _wait_quiet(seen.claimed, "the wake-up pass after LISTEN to end")
    seen.claimed.clear()
    seen.asked.clear()
    yield seen
    worker.stop()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert exit_code == [0], "the worker stopped cleanly"


def test_one_start_wakes_one_slot(idle_worker):
    calls = idle_worker.claimed
    job = durable.start("demo.noop")
    _wait(lambda: Job.objects.get(id=job.id).status == "completed", "the job to run")
    time.sleep(0.3)  # any other slot woken by the same notification would have dequeued by now
    # The woken slot claims the job and looks once more before sleeping; its full claim (one
    # of one) passes the wake-up on to one more slot, which finds nothing. Waking every slot
    # would make five dequeues.
    assert sum(1 for n in calls if n) == 1
    assert len(calls) <= 3, f"{len(calls)} dequeues for one start: every slot woke"
    # And the woken slots went back to sleep instead of polling on: no more dequeues.
    looked = len(calls)
    _wait_quiet(calls, "the woken slots to go back to sleep")
    assert len(calls) == looked, "a woken slot kept looking for work"


def test_one_transaction_of_many_starts_runs_them_all_without_the_poll(idle_worker):
    calls = idle_worker.claimed
    with transaction.atomic():  # its identical notifications reach the worker as one
        ids = [durable.start("demo.noop").id for _ in range(40)]
    _wait(
        lambda: Job.objects.filter(id__in=ids, status="completed").count() == 40,
        "all 40 jobs to run",
        timeout=20,
    )
    assert sum(calls) == 40


def _listening() -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN %%'")
        return cursor.fetchone()[0] > 0


def _wait_quiet(calls: list[int], message: str, quiet: float = 0.3) -> None:
    """Wait until no slot has dequeued for ``quiet`` seconds: every slot is asleep."""
    last = {"count": -1, "since": 0.0}

    def settled() -> bool:
        now = time.monotonic()
        if len(calls) != last["count"]:
            last.update(count=len(calls), since=now)
        return now - last["since"] >= quiet

    _wait(settled, message)


def test_a_slot_woken_by_a_full_claim_starts_from_that_claims_batch(idle_worker):
    """A full claim says the queue holds more and its slices were quick: the slot it wakes
    claims that many at once instead of growing its own batch from one (a burst of 5,000
    no-op jobs before 64 slots was gone before their batches grew). A notification says
    neither: the slot it wakes starts from its own batch.

    The first slot to claim runs on at its own pace (1, 4, 8: thread execution's
    ceiling) while the others' claims are held back, so the slots its later full claims
    wake are still asleep when it does."""
    seen = idle_worker
    seen.hold_others = 0.5
    with transaction.atomic():  # one notification for them all
        ids = [durable.start("demo.noop").id for _ in range(60)]
    _wait(
        lambda: Job.objects.filter(id__in=ids, status="completed").count() == 60,
        "all 60 jobs to run",
        timeout=30,
    )
    firsts: dict[int, int] = {}  # each slot's first dequeue after the start: how many it asked
    for thread, limit in seen.asked:
        firsts.setdefault(thread, limit)
    woken_by_the_notification = firsts.pop(seen.first)
    assert woken_by_the_notification == 1, "a notification passes no batch on"
    # The first slot's claim of one woke a second slot, which starts at one; its claims of
    # four and eight, made while that slot's claim was held, woke the other two.
    assert sorted(firsts.values()) == [1, 4, 8], seen.asked
