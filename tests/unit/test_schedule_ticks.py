"""Tick arithmetic (durable_jobs.schedules.ticks): expressions, zones, DST, catch-up. Invariant 24."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from durable_jobs.exceptions import ConfigurationError
from durable_jobs.schedules import ticks

UTC = timezone.utc
BERLIN = "Europe/Berlin"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("alias", "expanded"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_aliases_expand_to_their_five_fields(alias, expanded):
    assert ticks.expand(alias) == expanded


def test_an_alias_ticks_like_its_expansion():
    assert ticks.next_tick("@hourly", "UTC", utc(2026, 5, 1, 10, 17)) == utc(2026, 5, 1, 11, 0)


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("61 * * * *", "Bad minute"),
        ("* * * *", "five fields"),
        ("0 0 * * * *", "five fields"),
        ("@fortnightly", "unknown alias"),
        ("", "non-empty"),
        ("0 25 * * *", "Bad hour"),
        ("0 0 32 * *", "Bad day-of-month"),
    ],
)
def test_a_bad_expression_is_refused_saying_what_is_wrong(expression, says):
    with pytest.raises(ConfigurationError, match=says):
        ticks.expand(expression)


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../etc/passwd", 5])
def test_an_unknown_zone_is_refused(name):
    with pytest.raises(ConfigurationError, match="zone"):
        ticks.zone(name)


def test_ticks_are_computed_in_the_schedules_zone_and_given_in_utc():
    # 06:00 in Berlin in summer is 04:00 UTC, in winter 05:00 UTC.
    assert ticks.next_tick("0 6 * * *", BERLIN, utc(2026, 7, 1, 0)) == utc(2026, 7, 1, 4)
    assert ticks.next_tick("0 6 * * *", BERLIN, utc(2026, 1, 10, 0)) == utc(2026, 1, 10, 5)


def test_the_next_tick_is_strictly_after_the_instant():
    assert ticks.next_tick("0 * * * *", "UTC", utc(2026, 5, 1, 10)) == utc(2026, 5, 1, 11)


def test_a_tick_in_a_spring_forward_gap_runs_once_at_the_next_valid_instant():
    # Berlin, 2026-03-29: 02:00 jumps to 03:00, so 02:30 does not exist that day.
    found = ticks.ticks_between(
        "30 2 * * *", BERLIN, utc(2026, 3, 28, 0), utc(2026, 3, 31, 0), limit=10
    )
    assert found == [
        utc(2026, 3, 28, 1, 30),  # 02:30 CET
        utc(2026, 3, 29, 1, 0),  # the gap: once, at 03:00 CEST
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
    ]


def test_a_tick_in_a_fall_back_repeat_runs_once():
    # Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET, so 02:30 happens twice.
    found = ticks.ticks_between(
        "30 2 * * *", BERLIN, utc(2026, 10, 24, 0), utc(2026, 10, 27, 0), limit=10
    )
    assert found == [
        utc(2026, 10, 24, 0, 30),
        utc(2026, 10, 25, 0, 30),  # the first 02:30 (CEST) only
        utc(2026, 10, 26, 1, 30),
    ]


def test_a_wildcard_hour_runs_in_both_passes_of_a_repeated_hour_as_distinct_instants():
    found = ticks.ticks_between(
        "0,30 * * * *", BERLIN, utc(2026, 10, 24, 23, 59), utc(2026, 10, 25, 2, 1), limit=10
    )
    assert found == [utc(2026, 10, 25, 0), utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1),
                     utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 2)]  # fmt: skip
    assert len(set(found)) == len(found)


def test_new_york_has_both_a_gap_and_a_repeat_too():
    gap = ticks.ticks_between(
        "30 2 * * *", "America/New_York", utc(2026, 3, 6, 12), utc(2026, 3, 8, 12), limit=5
    )
    repeat = ticks.ticks_between(
        "30 1 * * *", "America/New_York", utc(2026, 10, 31, 12), utc(2026, 11, 2, 12), limit=5
    )
    assert gap == [utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7, 0)]  # 02:30 EST; the gap: 03:00 EDT
    assert repeat == [
        utc(2026, 11, 1, 5, 30),
        utc(2026, 11, 2, 6, 30),
    ]  # the first 01:30 (EDT) only


# --- catch-up -------------------------------------------------------------------------


def _plan(catch_up, *, due, now, expression="0 * * * *", grace=60.0):
    return ticks.plan(
        expression, "UTC", due=due, now=now, catch_up=ticks.CatchUp.of(catch_up), grace=grace
    )


def test_a_tick_on_time_starts_and_the_next_is_the_one_after_now():
    plan = _plan("skip", due=utc(2026, 5, 1, 10), now=utc(2026, 5, 1, 10, 0, 2))
    assert plan.start == (utc(2026, 5, 1, 10),)
    assert plan.following == utc(2026, 5, 1, 11)
    assert plan.missed == 0


def test_skip_starts_none_of_the_missed_ticks_and_counts_them():
    plan = _plan("skip", due=utc(2026, 5, 1, 10), now=utc(2026, 5, 1, 15, 30))
    assert plan.start == ()
    assert plan.missed == 6  # 10:00 .. 15:00
    assert plan.following == utc(2026, 5, 1, 16)


def test_once_starts_only_the_latest_missed_tick():
    plan = _plan("once", due=utc(2026, 5, 1, 10), now=utc(2026, 5, 1, 15, 30))
    assert plan.start == (utc(2026, 5, 1, 15),)
    assert plan.missed == 5


def test_once_with_a_tick_on_time_starts_that_one_alone():
    plan = _plan("once", due=utc(2026, 5, 1, 10), now=utc(2026, 5, 1, 15, 0, 5))
    assert plan.start == (utc(2026, 5, 1, 15),)
    assert plan.missed == 5


def test_backfill_starts_up_to_n_of_the_latest_missed_ticks_oldest_first():
    plan = _plan(3, due=utc(2026, 5, 1, 10), now=utc(2026, 5, 1, 15, 30))
    assert plan.start == (utc(2026, 5, 1, 13), utc(2026, 5, 1, 14), utc(2026, 5, 1, 15))
    assert plan.missed == 3


def test_backfill_also_starts_the_tick_on_time():
    plan = _plan("backfill:2", due=utc(2026, 5, 1, 10), now=utc(2026, 5, 1, 12, 0, 1))
    assert plan.start == (utc(2026, 5, 1, 10), utc(2026, 5, 1, 11), utc(2026, 5, 1, 12))
    assert plan.missed == 0


def test_a_fast_forwarded_tick_between_cron_instants_is_a_tick_of_its_own():
    due = utc(2026, 5, 1, 10, 17, 3)
    plan = _plan("once", due=due, now=due + timedelta(milliseconds=5))
    assert plan.start == (due,)
    assert plan.following == utc(2026, 5, 1, 11)


@pytest.mark.parametrize("value", ["sometimes", 0, -1, 1001, "backfill:x", True, 2.5])
def test_a_bad_catch_up_is_refused(value):
    with pytest.raises(ConfigurationError, match="catch_up"):
        ticks.CatchUp.of(value)


def test_catch_up_reads_back_as_it_is_stored():
    for text in ("skip", "once", "backfill:7"):
        assert str(ticks.CatchUp.of(text)) == text
    assert str(ticks.CatchUp.of(4)) == "backfill:4"


def test_a_tick_key_spells_one_instant_one_way():
    berlin = datetime(2026, 3, 29, 3, 0, tzinfo=ticks.zone(BERLIN))
    assert ticks.utc_iso(berlin) == "2026-03-29T01:00:00.000000Z"
    assert ticks.utc_iso(utc(2026, 3, 29, 1)) == ticks.utc_iso(berlin)
