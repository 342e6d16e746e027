"""The worker as a real process: crashes, stalls, signals, cut connections, wake-ups.

Handlers are the demo app's (testproject/demo/durable.py). `demo.import` writes one
`Effect` row per item inside `fenced()`, with no unique constraint, so a duplicated
write would show up as a second row rather than being refused.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.db.models import Count
from psycopg import conninfo

import durable_jobs as durable
from durable_jobs import conf, store
from testproject.demo.models import Effect, Report
from tests.acceptance import harness
from tests.acceptance.harness import backends_of, descendants, terminate_backends, wait_until
from tests.factories import reload

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def status_of(job) -> str:
    return reload(job).status


def effects_exactly_once(job, rows: int) -> None:
    items = list(
        Effect.objects.filter(job_id=job.id).values("item").annotate(n=Count("id")).order_by("item")
    )
    assert [row["item"] for row in items] == list(range(rows)), "every item written"
    assert all(row["n"] == 1 for row in items), f"an item was written twice: {items}"


def test_multi_slice_job_resumes_from_its_checkpoint_after_each_yield(processes):
    report = Report.objects.create(name="r")
    job = durable.start(
        "demo.import", input={"rows": 12, "batch": 1, "delay": 0.05}, subject=report
    )
    worker = processes.worker("--concurrency", "1", env={"DURABLE_JOBS_SLICE_BUDGET": "0.15"})
    wait_until(lambda: status_of(job) == "completed", message="the job to complete")
    final = reload(job)
    assert final.continuation_seq >= 2, "the job ran in several slices"
    assert final.consecutive_failures == 0 and final.interruptions == 0
    assert final.processed_count == 12 and final.result == {"rows": 12}
    effects_exactly_once(job, 12)
    report.refresh_from_db()
    assert report.status == "completed" and report.rows_written == 12, (
        "the mirror committed with the job"
    )
    assert final.domain_mirrored_at is not None
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_sigkilled_worker__orphan_is_redriven_and_resumes_from_its_checkpoint(processes):
    job = durable.start("demo.import", input={"rows": 20, "batch": 1, "delay": 0.1})
    first = processes.worker()
    wait_until(lambda: reload(job).processed_count >= 3, message="some committed progress")
    first.signal(signal.SIGKILL)
    first.wait()
    crashed = reload(job)
    assert crashed.status == "running" and crashed.lease_owner is not None
    done_before = crashed.processed_count

    settings = conf.get()
    grace_ms = conf.ms(settings.ORPHAN_GRACE)
    taken = wait_until(
        lambda: store.take_orphan(job.id, grace_ms=grace_ms, backoff_ms=0),
        message="the lease to expire so the orphan can be taken",
    )
    assert (
        taken.status == "pending"
        and taken.redrives == 1
        and taken.lease_epoch == crashed.lease_epoch + 1
    )

    processes.worker(app_name="durable-test-worker-2")
    wait_until(lambda: status_of(job) == "completed", message="the re-driven job to complete")
    effects_exactly_once(job, 20)
    later = Effect.objects.filter(job_id=job.id, item__gte=done_before + 1)
    assert all(e.epoch > crashed.lease_epoch for e in later), (
        "work after the crash ran under the new lease"
    )
    assert reload(job).redrives_since_commit == 0, "committed progress reset the poison budget"


def test_worker_stopped_past_its_lease_lands_nothing_after_it_continues(processes):
    job = durable.start("demo.import", input={"rows": 6, "batch": 1, "delay": 1.0})
    zombie = processes.worker(app_name="durable-test-zombie")
    wait_until(lambda: reload(job).processed_count >= 1, message="the first committed unit")
    zombie.signal(signal.SIGSTOP)
    stopped = reload(job)

    grace_ms = conf.ms(conf.get().ORPHAN_GRACE)
    wait_until(
        lambda: store.take_orphan(job.id, grace_ms=grace_ms, backoff_ms=0),
        timeout=30,
        message="the stopped worker's lease to expire",
    )
    rescuer = processes.worker(app_name="durable-test-rescuer")
    wait_until(
        lambda: status_of(job) == "completed", timeout=60, message="the rescuer to finish the job"
    )
    rescuer.signal(signal.SIGTERM)
    rescuer.wait()

    zombie.signal(signal.SIGCONT)
    wait_until(
        lambda: "outcome=lease_lost" in zombie.output() or "lease lost" in zombie.output(),
        timeout=20,
        message="the zombie to notice it lost the lease",
    )
    time.sleep(1.5)  # give the zombie every chance to (wrongly) write
    effects_exactly_once(job, 6)
    zombie_writes = Effect.objects.filter(job_id=job.id, epoch=stopped.lease_epoch)
    assert zombie_writes.count() == stopped.processed_count, (
        "nothing landed under the stale epoch after the stop"
    )
    assert reload(job).status == "completed"


def test_cancel_requested_mid_slice_ends_the_job_cancelled(processes):
    report = Report.objects.create(name="c")
    job = durable.start(
        "demo.import", input={"rows": 200, "batch": 1, "delay": 0.05}, subject=report
    )
    processes.worker()
    wait_until(lambda: reload(job).processed_count >= 2, message="the job to be under way")
    durable.cancel(job.id, by="tester")
    wait_until(lambda: status_of(job) == "cancelled", message="the worker to end the job cancelled")
    final = reload(job)
    assert final.cancelled_by == "tester" and final.processed_count < 200
    report.refresh_from_db()
    assert report.status == "cancelled", "the mirror saw the cancellation in the same commit"


def test_transient_errors_retry_then_succeed(processes):
    job = durable.start("demo.flaky", input={"failures": 2})
    processes.worker()
    wait_until(lambda: status_of(job) == "completed", message="the flaky job to succeed")
    final = reload(job)
    assert final.result == {"attempts": 3}
    assert final.error_code is None and final.status == "completed"


def test_consecutive_failures_end_failed_retry_exhausted(processes):
    job = durable.start("demo.always_fails")
    processes.worker(env={"DURABLE_JOBS_MAX_CONSECUTIVE_FAILURES": "3"})
    wait_until(lambda: status_of(job) == "failed", message="the verdict")
    final = reload(job)
    assert final.error_code == "retry_exhausted" and final.consecutive_failures == 3
    assert final.error_class == "transient" and "attempt 3 failed" in final.error_message


def test_a_committed_unit_between_failures_resets_the_count(processes):
    job = durable.start("demo.progress_then_fail", input={"steps": 6})
    processes.worker(env={"DURABLE_JOBS_MAX_CONSECUTIVE_FAILURES": "2"})
    wait_until(lambda: status_of(job) in ("completed", "failed"), message="the job to end")
    final = reload(job)
    assert final.status == "completed", (
        f"6 failures, each after progress, must not exhaust a budget of 2: {final.error_code}"
    )
    assert final.result == {"steps": 6}


def test_mirror_failure_rolls_back_the_completion_and_parks_after_its_budget(processes):
    report = Report.objects.create(name="m")
    job = durable.start("demo.import", input={"rows": 2, "batch": 2}, subject=report)
    processes.worker(
        env={
            "DEMO_FAIL_MIRROR": "1",
            "DURABLE_JOBS_MAX_MIRROR_ATTEMPTS": "3",
            "DURABLE_JOBS_MAX_CONSECUTIVE_FAILURES": "1",
        }
    )
    wait_until(lambda: status_of(job) == "failed", message="the job to be parked")
    final = reload(job)
    assert final.error_code == "mirror_failed" and final.parked_at is not None
    assert final.mirror_attempts == 3
    assert final.consecutive_failures == 0, "a mirror failure spends no retry budget"
    assert final.domain_mirrored_at is None
    report.refresh_from_db()
    assert report.status == "queued", "the mirror's write rolled back with the completion"
    effects_exactly_once(job, 2)


def test_sigterm_yields_interrupted_and_the_next_worker_finishes(processes):
    job = durable.start("demo.import", input={"rows": 30, "batch": 1, "delay": 0.1})
    first = processes.worker()
    wait_until(lambda: reload(job).processed_count >= 2, message="progress")
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=20) == 0, first.output()
    paused = reload(job)
    assert paused.status == "pending" and paused.interruptions == 1
    assert paused.consecutive_failures == 0 and paused.redrives == 0, (
        "an interruption spends no budget"
    )
    processes.worker(app_name="durable-test-worker-2")
    wait_until(lambda: status_of(job) == "completed", message="the next worker to finish")
    effects_exactly_once(job, 30)


def test_a_claim_that_comes_back_as_the_worker_stops_is_handed_back_not_left_to_its_lease(
    processes,
):
    """A SIGTERM that lands while a slot's dequeue is in flight: the job it brings back was
    never started, so the worker releases it on its way out, uncharged, for the next worker
    to run at once rather than after the lease expires (60 s here)."""
    worker = processes.worker(
        env={"DURABLE_JOBS_FAULTS": "claim_returned=pause:2", "DURABLE_JOBS_LEASE_TTL": "60"}
    )
    job = durable.start("demo.sleep", input={"seconds": 0.1})
    wait_until(lambda: "FAULT claim_returned" in worker.output(), message="the claim to return")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0, worker.output()
    after = reload(job)
    assert after.lease_owner is None, "handed back on the way out, not left to its lease"
    assert (after.redrives, after.consecutive_failures, after.interruptions) == (0, 0, 0), (
        "never started, so nothing spent and nothing interrupted"
    )
    processes.worker(app_name="durable-test-worker-2")
    wait_until(
        lambda: status_of(job) == "completed", timeout=20, message="the next worker to run it"
    )


def handed_back_uncharged(job) -> None:
    """The job's slice was handed back as an interruption at a stop, at once and charged
    to nothing (invariant 6)."""
    after = reload(job)
    assert (after.status, after.lease_owner, after.interruptions) == ("pending", None, 1), (
        "handed back at once"
    )
    assert (after.redrives, after.redrives_since_commit, after.consecutive_failures) == (0, 0, 0), (
        "nothing spent"
    )


def test_second_signal_exits_at_once_and_hands_the_slice_back_uncharged(processes):
    """Issue 9: a worker stopped at once used to leave its lease to expire, and the re-drive
    was charged to the poison budget. Now the slice is handed back as an interruption."""
    job = durable.start("demo.sleep", input={"seconds": 60, "stubborn": True})
    worker = processes.worker()
    wait_until(lambda: status_of(job) == "running", message="the slice to start")
    wait_until(worker.children, message="the handler's process")
    children = worker.children()
    worker.signal(signal.SIGTERM)
    time.sleep(0.5)
    assert worker.popen.poll() is None, (
        "a stubborn slice keeps the first signal waiting (grace is 10 s)"
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=8) == 1
    assert "stopping at once" in worker.output()
    handed_back_uncharged(job)
    wait_until(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in children),
        timeout=10,
        message="the handler's process to end with its worker",
    )


def test_a_slice_beginning_as_the_worker_stops_at_once_is_handed_back_uncharged(processes):
    """A slice its slot had begun but the heartbeat did not watch yet was missed by the hand-
    back at a second signal: its claim waited out its lease, and the re-drive counted against
    the job, or its handler process's kill was recorded as that process's death. Now the
    main thread hands back each slot's current slice as well, and a slice that begins after
    the hand-back has begun does not start.

    The fault pauses the slot between taking the slice's control and starting it."""
    job = durable.start("demo.sleep", input={"seconds": 60, "stubborn": True})
    worker = processes.worker(env={"DURABLE_JOBS_FAULTS": "slice_starting=pause:3@1"})
    wait_until(
        lambda: "FAULT slice_starting pause" in worker.output(), message="the slice to begin"
    )
    worker.signal(signal.SIGTERM)
    time.sleep(0.3)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 1
    assert "stopping at once" in worker.output()
    handed_back_uncharged(job)


def test_a_slice_that_would_begin_once_the_hand_back_has_begun_hands_itself_back(processes):
    """The other order of the race above: the main thread has begun handing every lease
    back (and has not read the slots yet) when the slot reaches the start of the slice.
    The handler must not start, since its claim may be another worker's a moment later:
    the slot hands the claim back itself, uncharged, and the main thread then finds
    nothing of it left to hand back.

    Two faults pause the slot after its claim and the main thread once its hand-back has
    begun, so the slot reaches the slice's start between the two."""
    job = durable.start("demo.sleep", input={"seconds": 60, "stubborn": True})
    worker = processes.worker(
        env={"DURABLE_JOBS_FAULTS": "after_claim=pause:3@1,hand_back_begun=pause:6@1"}
    )
    wait_until(lambda: "FAULT after_claim pause" in worker.output(), message="the claim")
    worker.signal(signal.SIGTERM)
    time.sleep(0.3)
    worker.signal(signal.SIGTERM)
    wait_until(lambda: "FAULT hand_back_begun pause" in worker.output(), message="the hand-back")
    assert worker.wait(timeout=20) == 1
    output = worker.output()
    assert "outcome=abandoned" in output and "the worker is exiting" in output, output
    assert "handed back at shutdown" not in output, "the slot had handed it back already"
    handed_back_uncharged(job)


def test_a_claim_whose_slice_has_not_begun_as_the_worker_stops_at_once_is_released(processes):
    """From its claim until its slice began, a claim was held by nothing the main thread
    looks at, through the checks before the slice (a wait condition may read the database
    there): at a second signal it waited out its lease. Now it is among the slot's waiting
    claims until its slice begins, and a hard stop releases it like them.

    The fault pauses the slot after the claim, before anything of the slice."""
    job = durable.start("demo.sleep", input={"seconds": 60, "stubborn": True})
    worker = processes.worker(env={"DURABLE_JOBS_FAULTS": "after_claim=pause:3@1"})
    wait_until(lambda: "FAULT after_claim pause" in worker.output(), message="the claim")
    worker.signal(signal.SIGTERM)
    time.sleep(0.3)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 1
    after = reload(job)
    assert after.lease_owner is None, "released at once, not left to wait out its lease"
    assert after.next_run_at is not None, "deliverable again"
    assert (after.interruptions, after.redrives, after.consecutive_failures) == (0, 0, 0), (
        "never begun, so nothing is charged, not even an interruption"
    )


# A slot's thread supervising its handler process, and a kill of that process from
# another thread (the main thread, on a second signal). The first ``claims`` jobs are
# queued in the child; the slot's thread supervises the first, and the fault pauses it
# between seeing the pipe readable and reading it, while another thread kills the child.
KILL_FROM_ANOTHER_THREAD = """
import threading
from durable_jobs import registry, store
from durable_jobs.runtime.control import SliceControl
from durable_jobs.runtime.runner import ChildRunner
from durable_jobs.states import Lease

jobs = store.dequeue(["default"], "slot", 60_000, kinds=None, limit={claims})
claims = [
    (job, Lease(job_id=job.id, owner=job.lease_owner, epoch=job.lease_epoch, ttl_ms=60_000))
    for job in jobs
]
runner = ChildRunner(role="durable-child-test", stopping=threading.Event())
assert runner.send_ahead(claims), "queued in the child before the kill is armed"
threading.Timer(0.5, runner.kill_process).start()
first, lease = claims[0]
ran = runner.run(SliceControl(first, registry.get(first.kind), lease))
print("ENDED", first.kind, ran.end, ran.message)
"""


def _kill_from_another_thread(processes, db_url: str, *, claims: int) -> str:
    """Run KILL_FROM_ANOTHER_THREAD in its own process; return its output (it must exit 0)."""
    shell = harness.Process(
        ["shell", "-c", KILL_FROM_ANOTHER_THREAD.replace("{claims}", str(claims))],
        db_url=db_url,
        app_name="durable-test-kill-race",
        env={"DURABLE_JOBS_FAULTS": "answers_readable=pause:1@*"},
    )
    processes.started.append(shell)
    assert shell.wait(timeout=60) == 0, shell.output()
    return shell.output()


def test_a_kill_from_another_thread_ends_the_slot_s_run_as_its_process_death(processes, db_url):
    """The kill at a second signal comes from the main thread while each slot's thread reads
    its handler process's pipe. It used to close that pipe too: a CI run saw the slot's read
    fail, the slice recorded as failed bookkeeping, and its hand-back at the stop lost.
    Now the slot reads the end of file and records the death, as for any other."""
    durable.start("demo.sleep", input={"seconds": 30, "stubborn": True})
    output = _kill_from_another_thread(processes, db_url, claims=1)
    # The first pause is the child's "ready" at its start; the second, the kill's end of file.
    assert "FAULT answers_readable pause (hit 2)" in output, "the pause after the kill"
    assert (
        "ENDED demo.sleep interrupted interrupted: the process running the handler died (signal 9)"
    ) in output


def test_answers_the_child_wrote_for_runs_a_kill_forgot_are_dropped(processes, db_url):
    """A kill from another thread forgets the runs queued behind the one the child had
    started, as never started. Answers the child wrote for them before it died may still
    be in the pipe; the slot's thread reads them after the kill and must drop them, not
    take them for answers out of order (which failed the slice's bookkeeping).

    Two quick runs, then one that sleeps: the slot's thread pauses on the first answer
    while the child answers the second and starts the third; then the kill comes."""
    durable.start("demo.noop", priority=10)
    durable.start("demo.noop", priority=10)
    durable.start("demo.sleep", input={"seconds": 30, "stubborn": True})
    output = _kill_from_another_thread(processes, db_url, claims=3)
    assert "ENDED demo.noop done" in output, "the first run's own answer still counts"


def test_terminated_slot_connections_are_survived(processes):
    job = durable.start("demo.import", input={"rows": 15, "batch": 1, "delay": 0.1})
    processes.worker(app_name="durable-test-cut")
    wait_until(lambda: reload(job).processed_count >= 2, message="progress")
    assert terminate_backends("durable-test-cut") >= 1
    wait_until(
        lambda: status_of(job) == "completed",
        timeout=60,
        message="the job to complete after the cut",
    )
    effects_exactly_once(job, 15)
    after = durable.start("demo.flaky", input={"failures": 0})
    wait_until(
        lambda: status_of(after) == "completed", message="the worker to keep taking new work"
    )


def test_a_start_wakes_an_idle_worker_before_the_poll_interval(processes):
    processes.worker(app_name="durable-test-listener", env={"DURABLE_JOBS_POLL_INTERVAL": "120"})
    # Wait until the listener connection exists (it is the one that ran LISTEN).
    wait_until(
        lambda: len(backends_of("durable-test-listener")) >= 2, message="the worker's connections"
    )
    time.sleep(0.5)
    job = durable.start("demo.flaky", input={"failures": 0})
    # Polling alone would take 120 s; the notification makes it prompt.
    wait_until(
        lambda: status_of(job) == "completed", timeout=30, message="the woken worker to run the job"
    )


def test_a_long_computation_keeps_its_lease_through_the_background_heartbeat(processes):
    job = durable.start("demo.sleep", input={"seconds": 5})  # the lease is 3 s
    processes.worker("--reconcile", env={"DURABLE_JOBS_RECONCILE_INTERVAL": "0.3"})
    wait_until(lambda: status_of(job) == "completed", message="the long slice to finish")
    final = reload(job)
    assert final.redrives == 0 and final.lease_epoch == 1, "never taken for an orphan"


def test_a_handler_that_never_returns_is_killed_at_its_time_limit_and_fails_with_advice(processes):
    """Issue 9: a stuck handler used to keep its slot and loop through re-drives. Process
    execution kills it at the time limit (twice the budget), charges a time_limit failure
    with backoff, and the job ends failed with a message saying what to change; the slot
    keeps serving other jobs all along."""
    job = durable.start("demo.sleep", input={"seconds": 120, "stubborn": True})
    healthy = durable.start("demo.flaky", input={"failures": 0}, run_after=2)
    worker = processes.worker(
        "--concurrency",
        "1",
        env={
            "DURABLE_JOBS_SLICE_BUDGET": "0.5",
            "DURABLE_JOBS_MAX_CONSECUTIVE_FAILURES": "3",
        },
    )
    wait_until(lambda: status_of(job) == "failed", timeout=60, message="the stuck job to fail")
    final = reload(job)
    assert (final.error_code, final.consecutive_failures, final.redrives) == (
        "retry_exhausted",
        3,
        0,
    )
    assert "time limit of 1s" in final.error_message and "raise time_limit" in final.error_message
    assert final.parked_at is None, "a verdict, not a park: the handler's own behaviour"
    wait_until(
        lambda: status_of(healthy) == "completed",
        message="other jobs to keep flowing on the one slot",
    )
    assert worker.output().count("outcome=retrying") == 2
    assert worker.popen.poll() is None, "the worker itself never wedged"


def test_sigkilled_worker__its_zygote_and_handler_processes_leave_with_it(processes):
    """The handler processes are the zygote's children, not the worker's: once the worker
    is SIGKILLed the zygote sees end of file on its socket and each child on its command
    pipe, so neither the zygote nor a handler runs on unsupervised."""
    job = durable.start("demo.sleep", input={"seconds": 60, "stubborn": True})
    worker = processes.worker("--concurrency", "2")
    wait_until(lambda: status_of(job) == "running", message="the slice to start")
    below = wait_until(
        lambda: (lambda found: found if len(found) >= 3 else None)(descendants(worker.pid)),
        message="the zygote and two handler processes",
    )
    zygotes = [pid for pid in below if _parent_of(pid) == worker.pid]
    assert len(zygotes) == 1, "one zygote under the worker; the handler processes under it"
    assert {_parent_of(pid) for pid in below if pid not in zygotes} == set(zygotes)
    worker.signal(signal.SIGKILL)
    wait_until(
        lambda: not any(_alive(pid) for pid in below),
        timeout=15,
        message="the zygote and the handler processes to end",
    )


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_outage_past_a_lease_ends_a_burst_run_with_1_and_a_standing_worker_outlives_it(
    processes, db_url
):
    # A standing worker retries through an outage; a burst run (a script's "drain, then
    # exit") stops once it has not been able to claim for LEASE_TTL (3 s here).
    job = durable.start("demo.import", input={"rows": 30, "batch": 1, "delay": 0.1})
    burst = processes.worker("--burst", app_name="durable-test-outage-burst")
    wait_until(lambda: reload(job).processed_count >= 2, message="progress before the outage")
    standing = processes.worker(app_name="durable-test-outage-standing")
    wait_until(
        lambda: backends_of("durable-test-outage-standing"),
        message="the standing worker to connect",
    )
    # The outage: the database refuses new connections (said from another database: a
    # server refuses it from inside), and both workers' connections are cut.
    database = connection.settings_dict["NAME"]
    maintenance = psycopg.connect(
        conninfo.make_conninfo(db_url, dbname="postgres"), autocommit=True
    )
    maintenance.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
    try:
        assert terminate_backends("durable-test-outage-%", like=True) >= 2
        began = time.monotonic()
        assert burst.wait(timeout=60) == 1, "the burst run gave up, non-zero"
        waited = time.monotonic() - began
        assert standing.popen.poll() is None, "the standing worker is still retrying"
    finally:
        maintenance.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        maintenance.close()
    output = burst.output()
    assert "burst run stopped" in output and "could not claim" in output, output[-3000:]
    assert waited >= conf.get().LEASE_TTL, "it retried for a whole lease before giving up"
    # Nothing committed was lost, and the job is not stuck: the standing worker finishes it.
    assert reload(job).processed_count >= 2
    wait_until(
        lambda: status_of(job) == "completed",
        timeout=60,
        message="the job to complete after the outage",
    )
    effects_exactly_once(job, 30)
    assert "burst run stopped" not in standing.output()


def test_a_burst_run_says_what_still_waits_out_a_backoff_and_can_wait_for_it(processes):
    """``--burst`` ends once nothing is due, and says how many jobs still wait out a retry
    backoff (they are not lost); ``--wait-for-retries`` sleeps until they are due and runs
    them to their end."""
    slow_retry = {"DURABLE_JOBS_RETRY_BACKOFF_BASE": "2", "DURABLE_JOBS_RETRY_BACKOFF_MAX": "2"}
    job = durable.start("demo.flaky", input={"failures": 1})
    first = processes.worker("--burst", env=slow_retry)
    assert first.wait(timeout=60) == 0
    assert status_of(job) == "running" and reload(job).lease_owner is None, "waiting for its retry"
    assert "burst run ended with 1 job(s) still waiting out a retry backoff" in first.output()

    second = processes.worker("--burst", "--wait-for-retries", env=slow_retry)
    assert second.wait(timeout=60) == 0
    assert status_of(job) == "completed" and reload(job).result == {"attempts": 2}
    assert "still waiting out a retry backoff" not in second.output()


def test_a_worker_is_listed_while_it_lives_and_gone_after_a_stop_or_a_kill(processes):
    """``durable_jobs workers`` lists each worker process with its queues and slots, and
    what it runs now; a stopped worker leaves the list at once, a SIGKILLed one once its
    beat is older than LEASE_TTL (3 s here)."""
    from durable_jobs.console import workers

    def listed() -> dict[str, workers.LiveWorker]:
        return {w.identity: w for w in workers.live_workers()}

    job = durable.start("demo.sleep", input={"seconds": 30})
    first = processes.worker("--concurrency", "2", "--queues", "default,reports")
    second = processes.worker(app_name="durable-test-worker-2")
    wait_until(lambda: len(listed()) == 2, message="both workers to register")
    by_pid = {w.pid: w for w in listed().values()}
    assert by_pid[first.pid].queues == ["default", "reports"] and by_pid[first.pid].slots == 2
    assert "demo.sleep" in by_pid[first.pid].kinds
    wait_until(
        lambda: sum(w.running.get("demo.sleep", 0) for w in listed().values()) == 1,
        message="the sleeping job to show as running on one of them",
    )
    holder = next(w for w in listed().values() if w.running)
    other, stopped_first = (second, first) if holder.pid == first.pid else (first, second)
    other.signal(signal.SIGTERM)
    assert other.wait(timeout=30) == 0
    assert other.pid not in {w.pid for w in listed().values()}, "a clean stop unregisters"
    stopped_first.signal(signal.SIGKILL)
    stopped_first.wait(timeout=30)
    assert stopped_first.pid in {w.pid for w in listed().values()}, "listed until its beat expires"
    wait_until(lambda: not listed(), timeout=15, message="the killed worker's beat to expire")
    assert reload(job).status == "running", "its job is the reconciler's to re-drive, by its lease"
