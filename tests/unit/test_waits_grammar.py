"""The wait grammar (invariants 15, 17, 19, 20, 23), without a database."""

from __future__ import annotations

import calendar
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_jobs import checks, conf, validation
from durable_jobs.exceptions import ConfigurationError, InvalidInput
from durable_jobs.waits import backoff, grammar

# --- invariant 15: an instant carries its zone, and never rolls -------------------------

GOOD_INSTANTS = [
    ("2026-09-01T09:00:00Z", datetime(2026, 9, 1, 9, 0, tzinfo=timezone.utc)),
    ("2026-09-01t09:00z", datetime(2026, 9, 1, 9, 0, tzinfo=timezone.utc)),
    ("2026-09-01T09:00:00.5Z", datetime(2026, 9, 1, 9, 0, 0, 500000, tzinfo=timezone.utc)),
    ("2026-09-01T09:00:00.123456789Z", datetime(2026, 9, 1, 9, 0, 0, 123456, tzinfo=timezone.utc)),
    ("2026-09-01T11:00:00+02:00", datetime(2026, 9, 1, 9, 0, tzinfo=timezone.utc)),
    ("2026-09-01T00:30-05:30", datetime(2026, 9, 1, 6, 0, tzinfo=timezone.utc)),
    ("2028-02-29T23:59:59Z", datetime(2028, 2, 29, 23, 59, 59, tzinfo=timezone.utc)),  # a leap day
    ("0050-01-01T00:00:00Z", datetime(50, 1, 1, tzinfo=timezone.utc)),  # the year 50, not 1950
]

BAD_INSTANTS = [
    "2026-09-01T09:00:00",  # no zone: which machine's local time?
    "2026-09-01 09:00:00Z",  # a space is not the T
    "2026-09-01",  # a day is not an instant
    "2026-09-01T24:00:00Z",  # hour 24 would roll into the next day
    "2026-09-01T09:60:00Z",  # minute 60
    "2026-09-01T09:00:60Z",  # second 60 (no leap seconds to honour)
    "2026-02-31T00:00:00Z",  # February 31st would roll to March 3rd
    "2026-02-29T00:00:00Z",  # not a leap year
    "2026-13-01T00:00:00Z",  # month 13
    "2026-00-10T00:00:00Z",  # month 0
    "2026-04-31T00:00:00Z",  # April has 30 days
    "0000-01-01T00:00:00Z",  # there is no year 0
    "26-09-01T09:00:00Z",  # a two-digit year
    "2026-9-1T09:00:00Z",  # unpadded fields
    "2026-09-01T09:00:00+24:00",  # an offset of a day
    "2026-09-01T09:00:00+0200",  # offset without the colon
    "2026-09-01T09:00:00+02",  # offset without minutes
    "2026-09-01T09:00:00.Z",  # an empty fraction
    "2026-09-01T09:00:00.1234567890Z",  # ten fraction digits
    "2026-09-01T09:00:00Z\n",  # a trailing newline
    " 2026-09-01T09:00:00Z",
    "",
    None,
    1788253200,
]


@pytest.mark.parametrize(("text", "expected"), GOOD_INSTANTS)
def test_instant__accepted_forms_name_the_moment_written(text, expected):
    assert grammar.parse_instant(text) == expected


@pytest.mark.parametrize("text", BAD_INSTANTS)
def test_instant__refused_forms_are_refused_never_rolled(text):
    with pytest.raises(grammar.BadInstant):
        grammar.parse_instant(text)
    assert grammar.instant_or_none(text) is None


@settings(max_examples=300, deadline=None)
@given(
    year=st.integers(1, 9999),
    month=st.integers(0, 13),
    day=st.integers(0, 32),
    hour=st.integers(0, 25),
    minute=st.integers(0, 61),
    second=st.integers(0, 61),
    offset_minutes=st.sampled_from([None, 0, 60, -60, 330, -570, 23 * 60 + 59, -(23 * 60 + 59)]),
)
def test_instant__every_accepted_instant_is_the_calendar_day_written(
    year, month, day, hour, minute, second, offset_minutes
):
    zone = (
        "Z"
        if offset_minutes is None
        else (
            f"{'+' if offset_minutes >= 0 else '-'}"
            f"{abs(offset_minutes) // 60:02d}:{abs(offset_minutes) % 60:02d}"
        )
    )
    text = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}{zone}"
    real_day = 1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]
    real_time = hour <= 23 and minute <= 59 and second <= 59
    parsed = grammar.instant_or_none(text)
    if not (real_day and real_time):
        assert parsed is None, f"{text} must be refused, not rolled to {parsed}"
        return
    assert parsed is not None
    # In its own zone, the instant is exactly the day and time written: nothing rolled.
    assert (parsed.year, parsed.month, parsed.day, parsed.hour, parsed.minute, parsed.second) == (
        year,
        month,
        day,
        hour,
        minute,
        second,
    )
    assert parsed.utcoffset() == timedelta(minutes=offset_minutes or 0)


# --- invariant 17: the backoff rule, as a table --------------------------------------


@pytest.mark.parametrize(
    ("base", "elapsed", "expected"),
    [
        (30, 0, 30),  # the first check waits the base
        (30, 299, 30),  # still inside the first ten base periods
        (30, 300, 60),  # ten periods held: doubled
        (30, 600, 120),
        (30, 1200, 480),
        (30, 1500, 900),  # 960 capped at the ceiling
        (30, 10**9, 900),  # settles at the ceiling, however long
        (1, 0, 30),  # a typo'd 1 is clamped up to the floor, not obeyed
        (0, 0, 30),  # a nonsense base falls back to the floor
        (-5, 100, 30),
        (3600, 0, 3600),  # an hourly base stays hourly: the ceiling never shortens it
        (3600, 36000 * 5, 3600),
        (600, 6000, 900),  # 1200 would pass the ceiling: capped
        (60, -10, 60),  # a negative elapsed (clock skew) reads as zero
    ],
)
def test_backoff__next_check_follows_the_rule(base, elapsed, expected):
    assert backoff.next_check_in(base, elapsed) == expected


def test_backoff__floor_and_ceiling_are_the_settings_given():
    assert backoff.next_check_in(1, 0, floor=2, ceiling=10) == 2
    assert backoff.next_check_in(2, 20, floor=2, ceiling=10) == 4
    assert backoff.next_check_in(2, 10**6, floor=2, ceiling=10) == 10
    assert (
        backoff.next_check_in(20, 10**6, floor=2, ceiling=10) == 20
    )  # base above the ceiling stays


# --- invariant 20: profile declarations ------------------------------------------------


def test_profiles__a_declaration_splits_on_the_first_colon_and_skips_empty_entries():
    assert grammar.parse_profiles(" jira:/opt/checks/jira , win:C:\\checks\\wait.cmd,,") == {
        "jira": "/opt/checks/jira",
        "win": "C:\\checks\\wait.cmd",
    }
    assert grammar.parse_profiles("") == {} and grammar.parse_profiles(None) == {}
    assert grammar.parse_profiles({"a.b-c_1": "/bin/true"}) == {"a.b-c_1": "/bin/true"}


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ("jira", "'jira'"),  # no colon
        (":/bin/true", "':/bin/true'"),  # no name
        ("jira:checks/jira", "'jira:checks/jira'"),  # relative path
        ("jira:", "'jira:'"),  # no path
        ("ok:/bin/true,jira:./jira", "'jira:./jira'"),  # the bad one of several is named
        ("ji ra:/bin/true", "'ji ra:/bin/true'"),  # a space in the name
        ("jira:/a,jira:/b", "'jira:/b'"),  # declared twice
        ("j\u00efra:/bin/true", "'j\u00efra:/bin/true'"),  # outside [A-Za-z0-9._-]
        ("x" * 51 + ":/bin/true", "x" * 51),  # too long a name
        ({"jira": "relative"}, "'jira'"),
    ],
)
def test_profiles__a_garbled_declaration_is_refused_naming_the_entry(raw, named):
    with pytest.raises(ConfigurationError) as caught:
        grammar.parse_profiles(raw)
    assert named in str(caught.value)
    assert "WAIT_PROFILES" in str(caught.value)
    with pytest.raises(
        ConfigurationError
    ):  # the settings refuse it too (system check, worker boot)
        conf.load({"WAIT_PROFILES": raw})


def test_profiles__the_system_check_fails_on_a_garbled_declaration_naming_the_entry(settings):
    settings.DURABLE_JOBS = {"WAIT_PROFILES": "good:/bin/true,bad:relative/check"}
    errors = checks.check_settings()
    assert len(errors) == 1 and "'bad:relative/check'" in errors[0].msg


# --- conditions at start, and what the gate can read -----------------------------------

PROFILES = {"ticket-closed": "/bin/true", "deploy.done": "/bin/true"}


@pytest.mark.parametrize(
    ("wait_for", "field", "says"),
    [
        ({"after": "2026-09-01T09:00:00Z"}, "wait_for", "list"),
        ([], "wait_for", "empty"),
        ([{"profile": "ticket-closed"}] * 5, "wait_for", "at most 4"),
        ([{"profile": "ticket-closed"}, "after"], "wait_for[1]", "exactly one key"),
        (
            [{"after": "2026-09-01T09:00:00Z", "profile": "ticket-closed"}],
            "wait_for[0]",
            "exactly one key",
        ),
        ([{"exclusive": True}], "wait_for[0]", "'exclusive'"),
        (
            [{"after": "2026-09-01T09:00:00Z"}, {"after": "2026-09-02T09:00:00Z"}],
            "wait_for[1]",
            "second 'after'",
        ),
        (
            [{"profile": "deploy.done"}, {"after": "2026-02-31T00:00:00Z"}],
            "wait_for[1]",
            "calendar",
        ),
        ([{"after": "2026-09-01T09:00:00"}], "wait_for[0]", "zone"),
        ([{"profile": "nobody-declared-me"}], "wait_for[0]", "not declared"),
        ([{"profile": "bad\nname"}], "wait_for[0]", "letters"),
    ],
)
def test_validate__a_bad_condition_is_refused_naming_it(wait_for, field, says):
    with pytest.raises(InvalidInput) as caught:
        grammar.validate(wait_for, profiles=PROFILES)
    assert caught.value.field == field
    assert says in str(caught.value)


def test_validate__a_conjunction_is_stored_as_written():
    conditions = [
        {"after": "2026-09-01T09:00:00+02:00"},
        {"profile": "ticket-closed"},
        {"profile": "deploy.done"},
    ]
    assert grammar.validate(conditions, profiles=PROFILES) == conditions
    assert (
        grammar.label(conditions) == "after 2026-09-01T09:00:00+02:00 + ticket-closed + deploy.done"
    )
    assert grammar.profile_names(conditions) == ["ticket-closed", "deploy.done"]
    assert grammar.unreadable(conditions) == []


@pytest.mark.parametrize(
    "stored",
    [
        [{"until": "2026-09-01T09:00:00Z"}],  # a key of some newer version
        [{"after": "2026-02-31T00:00:00Z"}],  # written by something that did not check the calendar
        [{"after": "2026-09-01T09:00:00Z"}, {"after": "2026-09-02T09:00:00Z"}],  # two instants
        [{"profile": "bad name; rm -rf /"}],
        [{"after": "2026-09-01T09:00:00Z", "profile": "x"}],
        ["after"],
        {"after": "2026-09-01T09:00:00Z"},  # not a list at all
        [{"profile": "a"}] * 5,
    ],
)
def test_unreadable__what_this_version_cannot_act_on_is_reported_not_ignored(stored):
    assert grammar.unreadable(stored), "an unreadable condition must never read as cleared"


def test_label__only_validated_bytes_reach_it():
    stored = [
        {"profile": "ok"},
        {"profile": "evil\x1b[31m\nline"},
        {"after": "2026-09-01T09:00:00Z\r\nforged"},
    ]
    assert grammar.label(stored) == "ok"
    assert grammar.profile_names(stored) == ["ok"]
    assert grammar.label([{"profile": "\u202eevil"}]) is None


# --- the wait settings ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            {"WAIT_CHECK_INTERVAL_CEILING": 10, "WAIT_CHECK_INTERVAL_FLOOR": 30},
            "WAIT_CHECK_INTERVAL_CEILING",
        ),
        ({"WAIT_MAX_FAULTS": 0}, "WAIT_MAX_FAULTS"),
        ({"WAIT_MAX_CONCURRENT_CHECKS": 1.5}, "WAIT_MAX_CONCURRENT_CHECKS"),
        ({"WAIT_CHECK_TIMEOUT": -1}, "WAIT_CHECK_TIMEOUT"),
        ({"WAIT_CHECK_OUTPUT_CAP": "4k"}, "WAIT_CHECK_OUTPUT_CAP"),
        ({"WAIT_AFTER_MAX_AHEAD": float("inf")}, "WAIT_AFTER_MAX_AHEAD"),
        ({"WAIT_MAX_HOLD": timedelta(0)}, "WAIT_MAX_HOLD"),
    ],
)
def test_settings__nonsense_wait_settings_are_refused_naming_them(overrides, says):
    with pytest.raises(ConfigurationError, match=says):
        conf.load(overrides)


def test_settings__wait_defaults_are_the_documented_ones():
    defaults = conf.load({})
    assert defaults.WAIT_AFTER_MAX_AHEAD == 30 * 86400 and defaults.WAIT_PROFILES == {}
    assert (defaults.WAIT_CHECK_INTERVAL_FLOOR, defaults.WAIT_CHECK_INTERVAL_CEILING) == (
        backoff.FLOOR,
        backoff.CEILING,
    )
    assert conf.load({"WAIT_MAX_HOLD": timedelta(days=1)}).WAIT_MAX_HOLD == 86400.0


# --- the wait-key grammar (docs/waits.rst, "One hold per target") ------------------------

GOOD_WAIT_KEYS = ["ticket:4711", "t:1", "deploy:eu-1/web", "pr:acme/api@42", "a", "x" * 200, 7]

BAD_WAIT_KEYS = [
    "",  # empty
    "x" * 201,  # too long
    "ticket 1",  # whitespace
    "a;rm -rf /",  # shell metacharacters
    "$(id)",
    "`id`",
    "a|b",
    "a&b",
    "a'b",
    'a"b',
    "a/../b",  # a parent segment
    "..",
    "a/./b",  # a current-directory segment
    "a//b",  # an empty segment
    "a/",
    "/etc/passwd",  # absolute
    "-rf",  # an option
    "x?y=1",  # a query
    "x#frag",  # a fragment
    "50%",  # a percent-escape
    "a\\b",
    "a\nb",  # control characters
    "a\x00b",
    "tické",  # non-ASCII
    None,
    ["ticket:1"],
]


@pytest.mark.parametrize("key", GOOD_WAIT_KEYS)
def test_wait_key__the_grammar_accepts_plain_target_names(key):
    assert validation.wait_key("wait_key", key) == str(key)


@pytest.mark.parametrize("key", BAD_WAIT_KEYS)
def test_wait_key__whitespace_metacharacters_dot_segments_and_escapes_are_refused_in_one_line(key):
    with pytest.raises(InvalidInput) as caught:
        validation.wait_key("wait_key", key)
    message = str(caught.value)
    assert message.startswith("wait_key: must be 1-200 of ASCII letters, digits and _ . : - / @")
    assert "\n" not in message
