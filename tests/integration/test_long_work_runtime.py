"""The runtime pieces behind long work (issue 9 and review items 4, 6): the one-statement
heartbeat, the interruption charge, fenced writes as committed units, connection-loss
classification, time-limit policy and the worker's per-slot prefetch state."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import durable_jobs as durable
from durable_jobs import conf, registry, store, testing
from durable_jobs.db import is_connection_loss
from durable_jobs.exceptions import ConfigurationError
from durable_jobs.models import Job
from durable_jobs.runtime.heartbeat import Heartbeater, HeldLease
from tests.factories import reload, running
from tests.integration.support import (  # noqa: F401
    db_now,
    in_thread,
    lease_of,
    other_connection_fixture,
)

# ---------------------------------------------------------------------------------------
# heartbeat_leases: one statement, never waiting behind a locked row (invariants 5, 12)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_heartbeat_leases__skips_a_locked_row_and_beats_the_others(other_connection):
    """Invariant 5: one row locked by its own fence (another connection here) must not
    delay the others' beats; it is reported busy, not lost."""
    locked, free, cancelled = running(), running(), running(cancel_requested_at=-1)
    taken = running()
    stale = lease_of(taken, epoch=taken.lease_epoch - 1)  # someone claimed it since
    before = reload(free).lease_expires_at

    other_connection.execute("BEGIN")
    other_connection.execute("SELECT 1 FROM durable_jobs_job WHERE id = %s FOR UPDATE", [locked.id])
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")  # a wait would fail the test, not hang it
        answers = store.heartbeat_leases(
            [lease_of(locked), lease_of(free), lease_of(cancelled), stale]
        )
    finally:
        other_connection.execute("ROLLBACK")
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert answers == {
        locked.id: store.BUSY,
        free.id: store.BEATEN,
        cancelled.id: store.CANCEL_REQUESTED,
        taken.id: store.LOST,
    }
    assert reload(free).lease_expires_at > before
    assert reload(locked).lease_expires_at == locked.lease_expires_at, (
        "the busy row was not touched"
    )


@pytest.mark.django_db
def test_heartbeat_leases__finds_each_row_by_its_key_whatever_the_statistics_say():
    """Invariant 12's statement stays cheap with many leases: statistics taken while no row
    ran made the planner look the rows up in durable_jobs_leased (keyed on lease_epoch,
    which most running rows share), reading every running row once per lease. The lookup
    must go through the primary key, and every lease is still extended."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_jobs_job")  # taken while nothing runs
    jobs = [running() for _ in range(200)]  # all at epoch 1
    leases = json.dumps(
        [
            {"id": str(j.id), "owner": j.lease_owner, "epoch": j.lease_epoch, "ttl_ms": 60_000}
            for j in jobs
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + store.HEARTBEAT_LEASES, {"leases": leases})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "durable_jobs_leased" not in plan, plan
    answers = store.heartbeat_leases([lease_of(j) for j in jobs])
    assert set(answers.values()) == {store.BEATEN} and len(answers) == 200


@pytest.mark.django_db
def test_heartbeat_leases__refuses_a_lease_released_by_its_holder():
    """Invariant 4: a released lease (a failed slice) is no longer the holder's to extend."""
    job = running()
    lease = lease_of(job)
    store.release_lease(lease, delay_ms=0)
    assert store.heartbeat_leases([lease]) == {job.id: store.LOST}
    assert reload(job).lease_owner is None


@pytest.mark.django_db
def test_heartbeater__a_beat_takes_along_leases_due_soon_and_stays_fenced_by_epoch():
    """Invariants 4 and 12: the leases due within a quarter of their interval are extended
    by the due lease's own statement; a lease whose epoch moved on (the job was claimed
    again) is reported lost and its row left alone; a lease due later waits its turn."""
    due, soon, later, taken = running(), running(), running(), running()
    leases = {
        due.id: (lease_of(due), -0.1),
        soon.id: (lease_of(soon), 2.0),
        later.id: (lease_of(later), 5.0),
        taken.id: (lease_of(taken, epoch=taken.lease_epoch - 1), 1.0),
    }
    beater = Heartbeater()  # not started: beat_due() runs on this thread
    holders = {}
    for job in (due, soon, later, taken):
        lease, offset = leases[job.id]
        holders[job.id] = holder = HeldLease(job, lease, 10.0)
        beater.track(holder)
        beater._held[id(holder)] = (holder, time.monotonic() + offset)  # its beat's moment
    before = {job.id: reload(job).heartbeat_at for job in (due, soon, later, taken)}

    with CaptureQueriesContext(connection) as queries:
        beater.beat_due()

    assert len(queries) == 1, "one statement for every lease it took along"
    assert reload(due).heartbeat_at > before[due.id]
    assert reload(soon).heartbeat_at > before[soon.id], "due within 2.5 s: taken along"
    assert reload(later).heartbeat_at == before[later.id], "due in 5 s: not yet"
    assert reload(taken).heartbeat_at == before[taken.id], "an older epoch extends nothing"
    assert holders[taken.id].lease_lost and not holders[soon.id].lease_lost
    next_beats = {holder: at for holder, at in beater._held.values()}
    assert next_beats[holders[soon.id]] == pytest.approx(next_beats[holders[due.id]], abs=0.5), (
        "the lease taken along now shares the due lease's beat"
    )


# ---------------------------------------------------------------------------------------
# charge_interruption: a crash the worker lived to report (invariant 14a)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_charge_interruption__redrives_on_the_poison_budget_not_the_failure_count():
    job = running(consecutive_failures=1, redrives_since_commit=0)
    row = store.charge_interruption(
        lease_of(job), reason="interrupted: connection lost", backoff_ms=0, max_redrives=3
    )
    assert (row.status, row.lease_owner, row.lease_epoch) == ("pending", None, job.lease_epoch + 1)
    assert (row.redrives, row.redrives_since_commit, row.consecutive_failures) == (1, 1, 1)
    assert row.error_message == "interrupted: connection lost"


@pytest.mark.django_db
def test_charge_interruption__parks_poison_past_the_budget():
    job = running(redrives_since_commit=2)
    row = store.charge_interruption(
        lease_of(job), reason="interrupted: the process died", backoff_ms=0, max_redrives=2
    )
    assert (row.status, row.error_code) == ("failed", "poison")
    assert row.parked_at is not None and "the process died" in row.error_message


@pytest.mark.django_db
def test_charge_interruption__is_fenced_on_owner_and_epoch():
    job = running()
    assert (
        store.charge_interruption(
            lease_of(job, owner="someone-else"), reason="x", backoff_ms=0, max_redrives=5
        )
        is None
    )
    assert (
        store.charge_interruption(
            lease_of(job, epoch=job.lease_epoch - 1), reason="x", backoff_ms=0, max_redrives=5
        )
        is None
    )
    assert reload(job).status == "running" and reload(job).redrives == 0


# ---------------------------------------------------------------------------------------
# fenced(): a committed unit (review item 4, invariant 7)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_fenced_write_is_a_committed_unit_that_forgives_failures(kinds, settings):
    """Invariant 7. Every try makes one fenced write, then fails. A fenced write resets
    the failure count, so with a budget of two the job is never exhausted, and
    ``last_committed_at`` records the unit. (It was: three writes landed, then
    ``retry_exhausted`` with ``last_committed_at`` still null.)"""
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "MAX_CONSECUTIVE_FAILURES": 2}
    writes = []

    def handler(job):
        with job.fenced():
            writes.append(job.attempt)
        if len(writes) < 4:
            raise durable.TransientError("fails after its write")
        return durable.DONE

    kinds.add("tests.fenced_then_fails", handler)
    job = durable.start("tests.fenced_then_fails")
    outcomes = [report.outcome for report in testing.run_jobs(fast_forward=True)]
    assert outcomes == ["retrying", "retrying", "retrying", "completed"]
    final = reload(job)
    assert final.status == "completed" and final.last_committed_at is not None
    assert writes == [1, 2, 2, 2], "each try saw only the failure since its last unit"


# ---------------------------------------------------------------------------------------
# Connection loss is an interruption; a statement's own error is not (issue 9 item 5)
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_is_connection_loss__a_terminated_backend_is_a_loss(other_connection):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    cut = threading.Timer(
        0.3, lambda: other_connection.execute("SELECT pg_terminate_backend(%s)", [pid])
    )
    cut.start()
    with pytest.raises(Exception) as raised:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(10)")
    cut.join()
    connection.close()
    assert is_connection_loss(raised.value)


@pytest.mark.django_db(transaction=True)
def test_is_connection_loss__deadlocks_timeouts_and_constraint_errors_are_the_work_s_own():
    for sql in (
        "SET LOCAL statement_timeout = '10ms'; SELECT pg_sleep(1)",
        "SELECT 1/0",
        "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40P01'; END $$",
        "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40001'; END $$",
    ):
        with pytest.raises(Exception) as raised:
            with connection.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute(sql)
        connection.close()
        assert not is_connection_loss(raised.value), sql
    assert is_connection_loss(psycopg.OperationalError("server closed the connection unexpectedly"))


# ---------------------------------------------------------------------------------------
# Policy: the time limit and the execution mode
# ---------------------------------------------------------------------------------------


def test_time_limit__defaults_to_twice_the_budget_and_a_kind_may_set_its_own(kinds):
    assert kinds.add("tests.tl_default", slice_budget=4).time_limit_seconds() == 8
    assert kinds.add("tests.tl_own", slice_budget=4, time_limit=30).time_limit_seconds() == 30


def test_time_limit__must_exceed_the_budget(kinds):
    with pytest.raises(ConfigurationError, match="time_limit .* must exceed slice_budget"):
        registry.handler("tests.tl_bad", slice_budget=10, time_limit=5)(lambda job: "done")
    assert registry.get("tests.tl_bad") is None


def test_settings__execution_is_process_or_thread():
    assert conf.load({}).EXECUTION == "process"
    assert conf.load({"EXECUTION": "thread"}).EXECUTION == "thread"
    with pytest.raises(ConfigurationError, match="EXECUTION.*'process', 'thread'.*'fork'"):
        conf.load({"EXECUTION": "fork"})
    with pytest.raises(ConfigurationError, match="TIME_LIMIT"):
        conf.load({"TIME_LIMIT": -1})


# ---------------------------------------------------------------------------------------
# Process execution hands the claimed row to its child: it must arrive unchanged
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_row_sent_to_a_handler_process_arrives_as_it_was_claimed():
    import json

    from durable_jobs.models import Job
    from durable_jobs.runtime.child_runs import decode_row, encode_row

    job = running(
        input={"n": [1, 2, {"deep": "ü"}]},
        checkpoint={"at": 3},
        cancel_requested_at=-5,
        total_count=10,
        processed_count=4,
        organization_id="org-1",
    )
    row = reload(job)
    arrived = decode_row(json.loads(json.dumps(encode_row(row))), "default")
    for field in Job._meta.concrete_fields:
        assert getattr(arrived, field.attname) == getattr(row, field.attname), field.attname


@pytest.mark.django_db
def test_a_sent_timestamp_keeps_its_instant_its_microseconds_and_its_zone():
    """UTC timestamps cross as microseconds since the epoch; the others as text. Either
    way the handler reads the very value the worker held, far past and far future too."""
    import datetime
    import json

    from durable_jobs.runtime.child_runs import decode_row, encode_row

    row = reload(running())
    plus_five = datetime.timezone(datetime.timedelta(hours=5, minutes=30))
    cases = {
        "started_at": datetime.datetime(1901, 3, 4, 5, 6, 7, 999_999, tzinfo=datetime.UTC),
        "next_run_at": datetime.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=datetime.UTC),
        "heartbeat_at": datetime.datetime(2026, 12, 7, 10, 0, 0, 1, tzinfo=plus_five),
        "lease_expires_at": datetime.datetime(2026, 12, 7, 10, 0, 0, 500_000),  # naive
    }
    for name, value in cases.items():
        setattr(row, name, value)
    arrived = decode_row(json.loads(json.dumps(encode_row(row))), "default")
    for name, value in cases.items():
        got = getattr(arrived, name)
        assert (got, got.utcoffset()) == (value, value.utcoffset()), name
        assert got.tzinfo == value.tzinfo, name


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("own_ttl", [timedelta(seconds=90), None])
def test_a_kind_with_its_own_lease_ttl_holds_that_lease_while_its_handler_runs(kinds, own_ttl):
    """The claim takes every lease for DURABLE_JOBS' LEASE_TTL (3 s in the test project);
    a kind that sets its own has its lease extended to it before its handler starts, so a
    slice that outlasts the default is not taken over. A kind without one keeps the
    claim's lease as it is."""
    seen = []

    def handler(job):
        row = Job.objects.get(id=job.row.id)
        seen.append((row.lease_expires_at - db_now()).total_seconds())
        return durable.DONE

    policy = {} if own_ttl is None else {"lease_ttl": own_ttl}
    kinds.add("tests.own_lease_ttl", handler, **policy)
    job = durable.start("tests.own_lease_ttl")
    assert [report.outcome for report in testing.run_jobs(max_slices=1)] == ["completed"]
    expected = 90.0 if own_ttl is not None else conf.get().LEASE_TTL
    assert seen and expected - 2 < seen[0] <= expected, seen
    assert reload(job).status == "completed"


@pytest.mark.django_db
def test_a_handler_raising_a_base_exception_fails_its_slice_instead_of_killing_the_slot(kinds):
    """asyncio.CancelledError (a BaseException) used to escape the executor and kill the
    slot thread, and with it the worker."""
    import asyncio

    def handler(job):
        raise asyncio.CancelledError("cancelled inside the handler's own event loop")

    kinds.add("tests.base_exception", handler)
    job = durable.start("tests.base_exception")
    assert [report.outcome for report in testing.run_jobs(max_slices=1)] == ["retrying"]
    assert reload(job).error_code == "CancelledError"


@pytest.mark.django_db(transaction=True)
def test_process_execution__claims_waiting_behind_a_slow_slice_are_handed_back_at_once(kinds):
    """A slot's batch is claimed while slices are quick; when one turns out slow, the jobs
    queued behind it go back to the queue while it runs, not after."""
    from durable_jobs.runtime.runner import ChildRunner
    from durable_jobs.runtime.worker import SlotState, Worker

    slow = durable.start("demo.sleep", input={"seconds": 3}, priority=10)
    quick = [durable.start("demo.noop") for _ in range(2)]
    worker = Worker(concurrency=1, execution="process")
    slot = SlotState(number=0, generation=0, owner="slot")
    claimed = store.dequeue(["default"], slot.owner, 60_000, kinds=None, limit=3)
    assert [job.id for job in claimed][0] == slow.id and len(claimed) == 3
    runner = ChildRunner(role="durable-child-test", stopping=worker.stopping)
    released = []

    def watch():
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            if all(reload(job).lease_owner is None for job in quick):
                released.append(reload(slow).status)
                return
            time.sleep(0.05)

    watcher = in_thread(watch)
    try:
        worker._run_claimed(slot, claimed, 60_000, runner)
    finally:
        runner.close()
        watcher.join()
    assert released == ["running"], "handed back while the slow slice still ran"
    assert reload(slow).status == "completed"
    assert all(reload(job).status == "running" and reload(job).redrives == 0 for job in quick), (
        "released uncharged, deliverable again"
    )


# ---------------------------------------------------------------------------------------
# Process execution queues a batch's runs in the child: each is started or taken back,
# never both, and never run twice (issue #14)
# ---------------------------------------------------------------------------------------


def _slice_of(job):
    from durable_jobs.runtime.control import SliceControl
    from durable_jobs.states import Lease

    return SliceControl(
        job,
        registry.get(job.kind),
        Lease(job_id=job.id, owner=job.lease_owner, epoch=job.lease_epoch, ttl_ms=60_000),
    )


def _ttl():
    return conf.ms(conf.get().LEASE_TTL)


def _claim(count):
    claimed = store.dequeue(["default"], "slot", _ttl(), kinds=None, limit=count)
    assert len(claimed) == count
    return claimed


@pytest.mark.django_db(transaction=True)
def test_process_execution__a_run_queued_behind_a_slice_past_its_time_limit_goes_back_unstarted(
    settings,
):
    """The queued claim goes back to the queue while the slow slice runs; the time limit
    kills the slow one only, and the queued one never started in the child."""
    from durable_jobs.runtime.runner import ChildRunner
    from durable_jobs.runtime.worker import SlotState, Worker

    settings.DURABLE_JOBS = {**getattr(settings, "DURABLE_JOBS", {}), "TIME_LIMIT": 1.0}
    slow = durable.start("demo.sleep", input={"seconds": 30, "stubborn": True}, priority=10)
    queued = durable.start("demo.progress_then_fail", input={"steps": 1})
    worker = Worker(concurrency=1, execution="process")
    slot = SlotState(number=0, generation=0, owner="slot")
    runner = ChildRunner(role="durable-child-test", stopping=worker.stopping)
    try:
        worker._run_claimed(slot, _claim(2), _ttl(), runner)
        assert not runner.holds_any()
    finally:
        runner.close()
    assert reload(slow).error_code == "time_limit"
    row = reload(queued)
    assert row.lease_owner is None and row.redrives == 0 and row.consecutive_failures == 0, (
        "released uncharged"
    )
    assert row.checkpoint is None, "it never started in the child"


@pytest.mark.django_db(transaction=True)
def test_process_execution__a_shutdown_takes_back_the_runs_queued_in_the_child():
    from durable_jobs.runtime.runner import ChildRunner

    running_one, queued = (
        durable.start("demo.sleep", input={"seconds": 30}, priority=10),
        durable.start("demo.progress_then_fail", input={"steps": 1}),
    )
    stopping = threading.Event()
    runner = ChildRunner(role="durable-child-test", stopping=stopping)
    first, second = _claim(2)
    assert first.id == running_one.id
    try:
        assert runner.send_ahead(
            [(first, _slice_of(first).lease), (second, _slice_of(second).lease)]
        )
        timer = threading.Timer(0.3, stopping.set)
        timer.start()
        ran = runner.run(_slice_of(first))
        timer.join()
        assert (ran.end, ran.interrupted) == ("yield", True)
        assert not runner.holds(second.id), "withdrawn by the child on the stop"
    finally:
        runner.close()
    assert reload(queued).checkpoint is None, "it never started"


@pytest.mark.django_db(transaction=True)
def test_process_execution__a_child_killed_with_a_run_queued_charges_the_running_one_only():
    """The killed child's running slice is charged; the run queued behind it never started
    there, and runs exactly once in the next child."""
    from durable_jobs.runtime.runner import ChildRunner

    durable.start("demo.sleep", input={"seconds": 30, "stubborn": True}, priority=10)
    queued = durable.start("demo.progress_then_fail", input={"steps": 1})
    runner = ChildRunner(role="durable-child-test", stopping=threading.Event())
    first, second = _claim(2)
    try:
        assert runner.send_ahead(
            [(first, _slice_of(first).lease), (second, _slice_of(second).lease)]
        )
        pid = runner.pid
        timer = threading.Timer(0.3, lambda: os.killpg(pid, signal.SIGKILL))
        timer.start()
        ran = runner.run(_slice_of(first))
        timer.join()
        assert ran.end == "interrupted" and "signal 9" in ran.message
        assert not runner.holds(second.id), "it never started: sent again to the next child"
        assert reload(queued).checkpoint is None
        again = runner.run(_slice_of(second))
        assert runner.pid != pid
    finally:
        runner.close()
    assert (again.end, again.code) == ("failed", "after_progress")
    assert reload(queued).checkpoint == {"step": 1}, "ran exactly once"


@pytest.mark.django_db(transaction=True)
def test_process_execution__a_quick_batch_queued_in_the_child_completes_each_job_once():
    from durable_jobs.runtime.runner import ChildRunner
    from durable_jobs.runtime.worker import SlotState, Worker

    jobs = [durable.start("demo.noop") for _ in range(6)]
    worker = Worker(concurrency=1, execution="process")
    slot = SlotState(number=0, generation=0, owner="slot")
    runner = ChildRunner(role="durable-child-test", stopping=worker.stopping)
    try:
        worker._run_claimed(slot, _claim(6), _ttl(), runner)
        assert not runner.holds_any()
    finally:
        runner.close()
    rows = [reload(job) for job in jobs]
    # On a loaded machine a slice may take longer than QUICK_SLICE: the rest are then
    # handed back unstarted, deliverable at once. Either way each job ran at most once,
    # under its one claim, and none is left holding a lease.
    assert all(row.lease_owner is None for row in rows)
    assert all(row.lease_epoch == 1 and row.redrives == 0 for row in rows)
    completed = [row for row in rows if row.status == "completed"]
    handed_back = [row for row in rows if row.status != "completed"]
    assert completed, "the batch ran"
    assert all(row.next_run_at is not None and row.consecutive_failures == 0 for row in handed_back)


@pytest.mark.django_db(transaction=True)
def test_process_execution__a_run_the_child_withdraws_late_is_handed_back_not_waited_for():
    """A withdrawal the child answers after ``take_back`` stopped waiting must not wedge the slot.

    The child is stopped (SIGSTOP) while the run is queued and the withdrawal sent, so
    ``take_back`` gives up; once the child resumes it reads both and withdraws the run
    before starting it. The slot supervising that run then sees it withdrawn and hands
    it back, instead of waiting for an answer that never comes. (Should the child start
    it first, it runs exactly once; either way the call returns.)
    """
    from durable_jobs.runtime import executor
    from durable_jobs.runtime.runner import ChildRunner

    outcome: dict = {}
    # The scenario needs the withdrawal to go unanswered while the child is stopped. On a
    # loaded machine the stop can land after the child already answered; then the setup
    # is tried again with a fresh child (a few times at most: it must happen).
    unanswered = False
    for _attempt in range(3):
        job = durable.start("demo.progress_then_fail", input={"steps": 1})
        runner = ChildRunner(role="durable-child-test", stopping=threading.Event())
        [claimed] = _claim(1)
        context = _slice_of(claimed)
        runner.ensure_started()
        os.kill(runner.pid, signal.SIGSTOP)
        assert runner.send_ahead([(claimed, _slice_of(claimed).lease)])
        runner.take_back(timeout=0.2)
        unanswered = runner.holds(claimed.id)
        if unanswered:
            break
        os.kill(runner.pid, signal.SIGCONT)
        runner.kill()
    assert unanswered, "no answer yet: the child is stopped (in 3 tries)"
    try:
        os.kill(runner.pid, signal.SIGCONT)
        supervisor = threading.Thread(
            target=lambda: outcome.update(ran=runner.run(context)), daemon=True
        )
        supervisor.start()
        supervisor.join(20)
        assert not supervisor.is_alive(), "the slot waits forever for a run the child withdrew"
    finally:
        runner.kill()
    ran, row = outcome["ran"], reload(job)
    if ran.end == "withdrawn":
        assert row.checkpoint is None, "withdrawn: it never started"
        assert executor.record(context, ran) == ("handed_back", None)
        row = reload(job)
        assert row.lease_owner is None and row.next_run_at is not None, (
            "released: deliverable again"
        )
        assert (row.redrives, row.consecutive_failures, row.interruptions) == (0, 0, 0), (
            "nothing charged"
        )
    else:
        assert (ran.end, ran.code, row.checkpoint) == ("failed", "after_progress", {"step": 1})


@pytest.mark.django_db(transaction=True)
def test_process_execution__a_stop_after_an_unanswered_hand_back_runs_no_more_of_the_batch():
    """A batch's one hand-back can go unanswered: the child is stopped (SIGSTOP) with the
    batch queued, so ``take_back`` gives up after ``WITHDRAW_TIMEOUT`` and the child keeps
    its queue. The slot does not hand back again before each slice left; the stop it sends
    the slice it then supervises withdraws the rest. Resumed, the child starts at most the
    first run: the others are handed back uncharged, not run on the way out."""
    from durable_jobs.runtime.runner import WITHDRAW_TIMEOUT, ChildRunner
    from durable_jobs.runtime.worker import SlotState, Worker

    jobs = [durable.start("demo.progress_then_fail", input={"steps": 1}) for _ in range(4)]
    worker = Worker(concurrency=1, execution="process")
    slot = SlotState(number=0, generation=0, owner="slot")
    runner = ChildRunner(role="durable-child-test", stopping=worker.stopping)
    runner.ensure_started()
    os.kill(runner.pid, signal.SIGSTOP)
    resume = threading.Timer(WITHDRAW_TIMEOUT + 1, os.kill, (runner.pid, signal.SIGCONT))
    resume.start()
    worker.stopping.set()  # the worker begins to stop as the batch arrives
    claimed = _claim(4)
    try:
        slot_thread = in_thread(lambda: worker._run_claimed(slot, claimed, _ttl(), runner))
        slot_thread.join(WITHDRAW_TIMEOUT + 20)
        assert not slot_thread.is_alive(), "the batch's slot never returned"
    finally:
        resume.cancel()
        os.kill(runner.pid, signal.SIGCONT)
        runner.close()
    rows = [reload(job) for job in jobs]
    started = [row for row in rows if row.checkpoint is not None]
    assert len(started) <= 1, "the stop ran the queue instead of handing it back"
    assert all(row.lease_owner is None for row in rows), "none left to wait out its lease"
    for row in rows:
        if row.checkpoint is None:
            assert row.next_run_at is not None, "handed back: deliverable again"
            assert (row.redrives, row.consecutive_failures, row.interruptions) == (0, 0, 0), (
                "nothing charged"
            )


def test_process_execution__every_way_a_slice_ends_crosses_the_pipe_unchanged():
    """What a handler process answers (``Ran.as_dict``, only the fields set) is read back by
    the worker (``Ran.from_dict``) as the same ``Ran``; an end it does not know is a
    transient ``child_error``, never a transition nobody wrote."""
    import json

    from durable_jobs.runtime.invoke import Ran
    from durable_jobs.states import SliceEnd

    ends = [
        Ran(end=SliceEnd.DONE, result_json='{"rows": 3}'),
        Ran(end=SliceEnd.YIELD),
        Ran(end=SliceEnd.YIELD, interrupted=True),
        Ran(
            end=SliceEnd.FAILED,
            error_class="permanent",
            code="bad_input",
            message="row 7: no id",
        ),
        Ran(end=SliceEnd.INTERRUPTED, message="interrupted: database connection lost"),
        Ran(end=SliceEnd.CANCEL),
        Ran(end=SliceEnd.LEASE_LOST),
    ]
    for ran in ends:
        back = Ran.from_dict(json.loads(json.dumps(ran.as_dict())))
        assert back == ran and back.end is ran.end
    assert Ran(end=SliceEnd.YIELD).as_dict() == {"end": "yield"}, "unset fields stay off the pipe"
    odd = Ran.from_dict({"end": "exploded"})
    assert (odd.end, odd.error_class, odd.code) == ("failed", "transient", "child_error")
