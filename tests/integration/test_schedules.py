"""Periodic jobs against the real store: sync from code, fire once per tick, pause, resume,
run now, removal, the system check. Invariant 24: a tick starts once."""

from __future__ import annotations

import io
import json
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.core.management.base import SystemCheckError
from django.db import connection

import durable_jobs as durable
from durable_jobs import db, metrics, registry, store, testing
from durable_jobs.models import Job, Schedule
from durable_jobs.runtime import scheduler
from durable_jobs.schedules import api, declare, ticks
from tests.integration.test_races import race

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def declared(kinds):
    """``declared(kind, cron, **fields)``: declare a schedule (its kind registered) for one test."""
    names: list[str] = []

    def declare_one(kind: str, cron: str = "0 * * * *", **fields):
        if registry.get(kind) is None:
            kinds.add(kind)
        durable.schedule(kind, cron, **fields)
        names.append(fields.get("name") or kind)
        return names[-1]

    yield declare_one
    for name in names:
        declare.forget(name)


def row(name: str) -> Schedule:
    return Schedule.objects.get(name=name)


def jobs_of(name: str) -> list[Job]:
    return list(Job.objects.filter(meta__schedule=name).order_by("created_at"))


def hourly() -> str:
    """Hourly at the minute half an hour from the database's now: every tick is at least
    half an hour from now, so whether a tick is on time or missed never depends on the
    hour the test happens to run in (an ``@hourly`` tick falls within the grace of now
    for the first minute of every hour)."""
    return f"{(db.database_now().minute + 30) % 60} * * * *"


def jump_database_clock(name: str, seconds: float) -> None:
    """As if the database's clock jumped ``seconds`` forward past the schedule's next tick:
    move the tick back instead (the server's clock itself is not the test's to change)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE durable_jobs_schedule SET next_tick_at = next_tick_at - %s * interval '1 second'"
            " WHERE name = %s",
            [seconds, name],
        )


# --- sync from code ----------------------------------------------------------------------


def test_sync_writes_each_declared_schedule_with_its_next_tick_on_the_database_clock(declared):
    declared("tests.report", "0 6 * * *", tz="Europe/Berlin", input={"full": True}, priority=5)
    assert durable.sync_schedules() == (1, 0)
    stored = row("tests.report")
    now = db.database_now()
    assert stored.kind == "tests.report" and stored.zone == "Europe/Berlin"
    assert stored.input == {"full": True} and stored.priority == 5
    assert now < stored.next_tick_at <= now + timedelta(days=1)
    assert stored.next_tick_at.astimezone(ticks.zone("Europe/Berlin")).hour == 6


def test_a_second_sync_keeps_the_next_tick_and_a_changed_expression_recomputes_it(declared):
    declared("tests.report", "0 6 * * *", tz="UTC")
    durable.sync_schedules()
    jump_database_clock("tests.report", 3600)  # mark the stored value so we can tell
    kept = row("tests.report").next_tick_at
    durable.sync_schedules()
    assert row("tests.report").next_tick_at == kept, "a restart neither skips nor repeats a tick"
    declare.forget("tests.report")
    declared("tests.report", "30 7 * * *", tz="UTC")
    durable.sync_schedules()
    assert row("tests.report").next_tick_at.minute == 30


def test_several_schedules_of_one_kind_each_have_their_own_name(declared):
    declared("tests.report", "@daily", name="report.daily")
    declared("tests.report", hourly(), name="report.hourly")
    durable.sync_schedules()
    assert sorted(s.name for s in durable.list_schedules()) == ["report.daily", "report.hourly"]


def test_schedules_declared_in_settings_are_synced_too(kinds, settings):
    kinds.add("tests.cleanup")
    settings.DURABLE_JOBS = {
        **settings.DURABLE_JOBS,
        "SCHEDULES": {
            "cleanup.nightly": {"kind": "tests.cleanup", "cron": "0 3 * * *", "catch_up": "skip"}
        },
    }
    durable.sync_schedules()
    assert row("cleanup.nightly").catch_up == "skip"


def test_a_schedule_declared_next_to_its_handler_is_synced(kinds):
    kinds.add("tests.beside", schedule=durable.Schedule("@hourly", name="tests.beside.hourly"))
    try:
        durable.sync_schedules()
        assert row("tests.beside.hourly").kind == "tests.beside"
    finally:
        declare.forget("tests.beside.hourly")


# --- firing: exactly one start per tick ---------------------------------------------------


def test_a_due_tick_starts_one_job_keyed_by_the_schedule_and_the_tick(declared):
    declared("tests.report", hourly(), input={"n": 1}, queue="reports", priority=3)
    durable.sync_schedules()
    tick = testing.fast_forward_schedule("tests.report")
    assert testing.fire_schedules() == 1
    (job,) = jobs_of("tests.report")
    assert job.idempotency_key == api.tick_key("tests.report", tick)
    assert job.input == {"n": 1} and job.queue_name == "reports" and job.priority == 3
    stored = row("tests.report")
    assert stored.last_tick_at == tick and stored.last_job_id == job.id
    assert stored.next_tick_at > db.database_now()
    assert testing.fire_schedules() == 0, "the next tick is not due"


def test_two_leaders_firing_one_tick_on_two_connections_start_one_job(declared):
    """Invariant 24: two leaders (one stalled past its lease, one its successor) race on one tick."""
    declared("tests.report", hourly())
    durable.sync_schedules()
    for _ in range(10):
        testing.fast_forward_schedule("tests.report")
        before = len(jobs_of("tests.report"))
        results = race(scheduler.fire_due, scheduler.fire_due)
        assert len(jobs_of("tests.report")) == before + 1
        assert sorted(r.started for r in results) == [0, 1]


def test_a_leader_that_planned_a_tick_before_its_successor_fired_it_starts_nothing(declared):
    """A leader SIGSTOPped between planning a tick and firing it wakes after its successor:
    its compare-and-set finds the row moved, and its transaction (job included) rolls back."""
    declared("tests.report", hourly())
    durable.sync_schedules()
    testing.fast_forward_schedule("tests.report")
    stale = store.select_due_schedules(kinds=["tests.report"], limit=10)[
        0
    ]  # what the stopped leader had read
    assert testing.fire_schedules() == 1  # its successor fires the tick
    assert scheduler.fire(stale) is None
    assert len(jobs_of("tests.report")) == 1


def test_a_leader_stopped_for_a_whole_tick_neither_repeats_the_old_tick_nor_takes_the_new(declared):
    """The stale leader wakes when the row's *next* tick is due as well: its compare-and-set
    is on the tick it planned, so it cannot fire the new tick under the old one's plan."""
    declared("tests.report", hourly())
    durable.sync_schedules()
    testing.fast_forward_schedule("tests.report")
    stale = store.select_due_schedules(kinds=["tests.report"], limit=10)[0]
    assert testing.fire_schedules() == 1  # the successor fires the old tick
    jump_database_clock("tests.report", 3600 + 5)  # the next tick is due by now too
    assert scheduler.fire(stale) is None
    assert testing.fire_schedules() == 1, "the new tick is still there for the leader"
    assert len({job.idempotency_key for job in jobs_of("tests.report")}) == 2


def test_a_leader_that_cannot_run_a_kind_leaves_its_tick_due_for_one_that_can(declared, kinds):
    """As a worker claims only kinds it can run (invariant 14b): a leader from an older
    deploy neither fails the tick nor counts it missed; a leader that knows the kind fires it."""
    declared("tests.report", hourly())
    durable.sync_schedules()
    tick = testing.fast_forward_schedule("tests.report")
    registry.unregister("tests.report")
    assert testing.fire_schedules() == 0
    assert row("tests.report").next_tick_at == tick
    kinds.add("tests.report")
    assert testing.fire_schedules() == 1
    assert jobs_of("tests.report")[0].idempotency_key == api.tick_key("tests.report", tick)


def test_the_advance_is_a_compare_and_set_on_the_next_tick(declared):
    declared("tests.report", hourly())
    durable.sync_schedules()
    due = testing.fast_forward_schedule("tests.report")
    later = due + timedelta(hours=1)
    assert not store.advance_schedule(
        "tests.report", due=later, following=later, last_tick=None, missed=0
    )
    assert store.advance_schedule("tests.report", due=due, following=later, last_tick=due, missed=0)
    assert not store.advance_schedule(
        "tests.report", due=due, following=later, last_tick=due, missed=0
    )


def test_a_tick_not_yet_due_by_the_database_clock_cannot_be_advanced(declared):
    declared("tests.report", hourly())
    durable.sync_schedules()
    due = row("tests.report").next_tick_at
    assert not store.advance_schedule(
        "tests.report", due=due, following=due + timedelta(hours=1), last_tick=due, missed=0
    )


def test_a_ticks_key_answers_a_second_start_with_the_first_job(declared):
    """Should two compare-and-sets ever both pass, the idempotency index still allows one job per tick."""
    declared("tests.report", hourly())
    durable.sync_schedules()
    tick = testing.fast_forward_schedule("tests.report")
    first = api.start_for(
        row("tests.report"), key=api.tick_key("tests.report", tick), tick=tick, using="default"
    )
    again = api.start_for(
        row("tests.report"), key=api.tick_key("tests.report", tick), tick=tick, using="default"
    )
    assert again.id == first.id and len(jobs_of("tests.report")) == 1


def test_a_worker_whose_clock_is_a_day_fast_fires_nothing_early(declared, monkeypatch):
    declared("tests.report", hourly())
    durable.sync_schedules()
    lie = time.time() + 86400
    monkeypatch.setattr(time, "time", lambda: lie)
    monkeypatch.setattr("django.utils.timezone.now", lambda: db.database_now() + timedelta(days=1))
    assert testing.fire_schedules() == 0
    durable.sync_schedules()
    assert row("tests.report").next_tick_at <= db.database_now() + timedelta(hours=1)
    assert jobs_of("tests.report") == []


@pytest.mark.parametrize(
    ("catch_up", "started", "missed"), [("skip", 0, 5), ("once", 1, 4), (3, 3, 2)]
)
def test_a_database_clock_jump_follows_the_catch_up_policy(declared, catch_up, started, missed):
    declared("tests.report", hourly(), catch_up=catch_up)
    durable.sync_schedules()
    # The next tick is within the hour; five hours on, five ticks have been missed.
    jump_database_clock("tests.report", 5 * 3600)
    assert testing.fire_schedules() == started
    assert len(jobs_of("tests.report")) == started
    stored = row("tests.report")
    assert stored.missed_ticks == missed
    assert stored.next_tick_at > db.database_now()
    keys = {job.idempotency_key for job in jobs_of("tests.report")}
    assert len(keys) == started, "each caught-up tick has its own key"


# --- operators ----------------------------------------------------------------------------


def test_started_and_missed_ticks_are_counted_for_the_metrics(declared):
    declared("tests.report", hourly(), catch_up="once")
    durable.sync_schedules()
    seen: list[tuple[str, float, dict]] = []

    def sink(kind, name, value, labels):
        if name.startswith("schedule_"):
            seen.append((name, value, labels))

    metrics.add_sink(sink)
    try:
        jump_database_clock("tests.report", 5 * 3600)
        testing.fire_schedules()
    finally:
        metrics.remove_sink(sink)
    assert sorted(seen) == [
        ("schedule_ticks_missed", 4, {"schedule": "tests.report"}),
        ("schedule_ticks_started", 1, {"schedule": "tests.report"}),
    ]


def test_a_paused_schedule_does_not_fire_and_resumes_from_its_next_tick(declared):
    declared("tests.report", hourly())
    durable.sync_schedules()
    durable.pause_schedule("tests.report")
    jump_database_clock("tests.report", 5 * 3600)
    assert testing.fire_schedules() == 0
    assert durable.pause_schedule("tests.report").paused_at is not None, "pausing twice is harmless"
    resumed = durable.resume_schedule("tests.report")
    assert resumed.paused_at is None and resumed.next_tick_at > db.database_now()
    assert testing.fire_schedules() == 0, "ticks that fell while paused are not caught up"
    assert row("tests.report").missed_ticks == 0


def test_a_pause_survives_a_restart_sync(declared):
    declared("tests.report", hourly())
    durable.sync_schedules()
    durable.pause_schedule("tests.report")
    durable.sync_schedules()
    assert row("tests.report").paused_at is not None


def test_run_now_starts_one_job_under_a_key_that_never_collides_with_a_tick(declared):
    declared("tests.report", hourly())
    durable.sync_schedules()
    durable.pause_schedule("tests.report")
    first = durable.run_schedule("tests.report")
    second = durable.run_schedule("tests.report")
    assert first.id != second.id
    assert first.idempotency_key.startswith("schedule:tests.report:run:")
    assert row("tests.report").last_job_id == second.id
    durable.resume_schedule("tests.report")
    tick = testing.fast_forward_schedule("tests.report")
    assert testing.fire_schedules() == 1
    assert {j.idempotency_key for j in jobs_of("tests.report")} >= {
        api.tick_key("tests.report", tick)
    }


def test_a_schedule_removed_from_code_stops_and_its_jobs_stay(declared):
    declared("tests.report", hourly())
    declared("tests.other", hourly())
    durable.sync_schedules()
    testing.fast_forward_schedule("tests.report")
    testing.fire_schedules()
    (job,) = jobs_of("tests.report")
    declare.forget("tests.report")
    assert durable.sync_schedules() == (1, 1)
    jump_database_clock("tests.report", 5 * 3600)
    assert testing.fire_schedules() == 0
    (view,) = [s for s in durable.list_schedules() if s.name == "tests.report"]
    assert view.state == "removed" and view.last_job_id == job.id
    assert Job.objects.filter(id=job.id).exists()
    with pytest.raises(durable.ScheduleRemoved, match="removed from code"):
        durable.run_schedule("tests.report")
    with pytest.raises(durable.ScheduleRemoved):
        durable.resume_schedule("tests.report")


def test_an_unknown_schedule_is_not_found():
    with pytest.raises(durable.ScheduleNotFound, match="no schedule 'nope'"):
        durable.pause_schedule("nope")
    with pytest.raises(durable.InvalidInput):
        durable.run_schedule("no spaces allowed")


def test_the_list_shows_next_and_last_run_the_last_outcome_and_missed_ticks(declared, kinds):
    declared("tests.report", hourly(), catch_up="skip")
    durable.sync_schedules()
    testing.fast_forward_schedule("tests.report")
    testing.fire_schedules()
    testing.run_jobs()
    jump_database_clock("tests.report", 3 * 3600)
    testing.fire_schedules()
    (view,) = durable.list_schedules()
    assert view.last_job_status == "completed"
    assert view.missed_ticks == 3
    assert view.state == "active" and view.next_tick_at > view.last_tick_at
    assert view.as_dict()["state"] == "active"


def test_a_schedule_nobody_fires_shows_as_overdue(declared):
    declared("tests.report", hourly())
    durable.sync_schedules()
    jump_database_clock("tests.report", 2 * 3600)
    (view,) = durable.list_schedules()
    assert view.state == "overdue"


# --- the system check ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "cron", "fields", "says"),
    [
        (
            "tests.unregistered",
            "@hourly",
            {},
            "schedule 'tests.unregistered' (code): its kind 'tests.unregistered' has no registered handler",
        ),
        (
            "tests.report",
            "61 * * * *",
            {"name": "bad.minute"},
            "schedule 'bad.minute' (code): cron expression '61 * * * *': Bad minute",
        ),
        (
            "tests.report",
            "@hourly",
            {"name": "bad.zone", "tz": "Mars/Olympus"},
            "schedule 'bad.zone' (code): time zone 'Mars/Olympus'",
        ),
        (
            "tests.report",
            "@hourly",
            {"name": "bad.catchup", "catch_up": "always"},
            "schedule 'bad.catchup' (code): catch_up 'always'",
        ),
    ],
)
def test_the_system_check_names_a_schedule_it_refuses(kinds, kind, cron, fields, says):
    kinds.add("tests.report")
    durable.schedule(kind, cron, **fields)
    try:
        with pytest.raises(SystemCheckError, match="durable_jobs.E004") as raised:
            call_command("check")
        assert says in str(raised.value)
        with pytest.raises(durable.ConfigurationError, match="schedule"):
            durable.sync_schedules()
    finally:
        declare.forget(fields.get("name", kind))


def test_the_system_check_names_a_settings_schedule_with_a_bad_kind(settings):
    settings.DURABLE_JOBS = {
        **settings.DURABLE_JOBS,
        "SCHEDULES": {"nightly": {"kind": "tests.gone", "cron": "@daily"}},
    }
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    assert (
        "schedule 'nightly' (DURABLE_JOBS['SCHEDULES']['nightly']): its kind 'tests.gone'"
        in str(raised.value)
    )


def test_a_name_declared_twice_is_refused(kinds):
    kinds.add("tests.report")
    durable.schedule("tests.report", "@hourly", name="twice")
    durable.schedule("tests.report", "@daily", name="twice")
    try:
        with pytest.raises(SystemCheckError, match="declared twice"):
            call_command("check")
    finally:
        declare.forget("twice")


# --- manage.py durable_jobs schedules | schedule-pause | schedule-resume | schedule-run -----


def cli(*args: str) -> str:
    out = io.StringIO()
    call_command("durable_jobs", *args, stdout=out)
    return out.getvalue()


def test_operators_list_pause_resume_and_run_a_schedule_from_the_command_line(declared):
    declared("tests.report", "@hourly", tz="Europe/Berlin", catch_up="skip")
    durable.sync_schedules()
    text = cli("schedules")
    assert "tests.report" in text and "active" in text and "@hourly" in text
    assert "paused" in cli("schedule-pause", "tests.report")
    (listed,) = json.loads(cli("--json", "schedules"))
    assert listed["state"] == "paused" and listed["zone"] == "Europe/Berlin"
    assert listed["catch_up"] == "skip" and listed["missed_ticks"] == 0
    assert "resumed; next run" in cli("schedule-resume", "tests.report")
    started = json.loads(cli("schedule-run", "tests.report", "--json"))
    (listed,) = json.loads(cli("schedules", "--json"))
    assert listed["last_job_id"] == started["id"] and listed["last_job_status"] == "pending"


def test_the_command_line_refuses_an_unknown_schedule(declared):
    with pytest.raises(CommandError, match="no schedule 'nope'") as raised:
        cli("schedule-pause", "nope")
    assert raised.value.returncode == 1


def test_the_orm_refuses_to_write_a_schedule_row(declared):
    """Invariant 1: schedule rows, like job rows, are written by store.py only."""
    from durable_jobs.models import ReadOnlyJobRow

    declared("tests.report", hourly())
    durable.sync_schedules()
    with pytest.raises(ReadOnlyJobRow):
        Schedule.objects.filter(name="tests.report").update(paused_at=None)
    with pytest.raises(ReadOnlyJobRow):
        row("tests.report").save()
