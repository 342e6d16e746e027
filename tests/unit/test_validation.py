"""``validation``: bad input refused at the API, naming the argument (no database).

Invariant 23 (only validated bytes reach a label or a log line) and the jsonb limits."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import pytest

from durable_jobs import validation
from durable_jobs.exceptions import (
    InvalidCheckpoint,
    InvalidInput,
    InvalidJobData,
    InvalidProgress,
    RunAfterOutOfRange,
)

LIMITS = dict(max_bytes=1_000, max_depth=5)


def _deep(levels: int, leaf: object = "leaf") -> object:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


# ---------------------------------------------------------------------------------------
# name
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["reports.rebuild", "a", "A-b_c:d.e", "x" * 100])
def test_name__accepts_letters_digits_and_separators(value):
    assert validation.name("kind", value) == value


@pytest.mark.parametrize(
    "value", ["", "x" * 101, "has space", "semi;colon", "ünï", "a\nb", "\na", None, 5, b"kind"]
)
def test_name__refuses_anything_else_naming_the_field(value):
    with pytest.raises(InvalidInput) as caught:
        validation.name("queue", value)
    assert caught.value.field == "queue"
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("value", ["a\n", "reports.rebuild\n"])
def test_name__refuses_a_trailing_newline(value):
    """Invariant 23: ``$`` would match before a final newline; the pattern must not."""
    with pytest.raises(InvalidInput):
        validation.name("kind", value)


# ---------------------------------------------------------------------------------------
# key
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "report:7",
        "'; DROP TABLE durable_jobs_job; --",
        "ünïcödé 🚀",
        "%s %(x)s {0}",
        "tab-free",
        "k" * 255,
    ],
)
def test_key__accepts_printable_text_verbatim(value):
    assert validation.key("lock_key", value) == value


def test_key__turns_an_integer_into_its_text():
    assert validation.key("subject id", 42) == "42"


@pytest.mark.parametrize(
    "value",
    ["a\x00b", "a\nb", "a\rb", "a\tb", "\x1b[31m", "a\x7fb", "a\x85b", "a\u2028b", "a\u2029b"],
    ids=["nul", "newline", "return", "tab", "escape", "del", "nel", "line-sep", "para-sep"],
)
def test_key__refuses_control_characters(value):
    with pytest.raises(InvalidInput) as caught:
        validation.key("lock_key", value)
    assert caught.value.field == "lock_key" and "control" in str(caught.value)


@pytest.mark.parametrize("value", ["", None, True, 1.5, b"bytes", ["k"]])
def test_key__refuses_empty_and_non_text(value):
    with pytest.raises(InvalidInput):
        validation.key("idempotency_key", value)


def test_key__refuses_more_than_max_length():
    validation.key("created_by", "x" * 200, max_length=200)
    with pytest.raises(InvalidInput) as caught:
        validation.key("created_by", "x" * 201, max_length=200)
    assert "200" in str(caught.value)
    with pytest.raises(InvalidInput):
        validation.key("lock_key", "k" * 256)


# ---------------------------------------------------------------------------------------
# integer
# ---------------------------------------------------------------------------------------


def test_integer__bounds_are_inclusive():
    assert validation.integer("priority", -100, low=-100, high=100) == -100
    assert validation.integer("priority", 100, low=-100, high=100) == 100
    for bad in (-101, 101):
        with pytest.raises(InvalidInput):
            validation.integer("priority", bad, low=-100, high=100)


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None])
def test_integer__refuses_bools_floats_and_text(value):
    with pytest.raises(InvalidInput) as caught:
        validation.integer("priority", value, low=-100, high=100)
    assert caught.value.field == "priority"


# ---------------------------------------------------------------------------------------
# payload
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -1.5, "text", [], {}, {"a": [1, 2.5, None, {"b": "ü"}]}, (1, 2), 10**30],
)
def test_payload__accepts_plain_json_and_returns_its_serialised_text(value):
    text = validation.payload("input", value, **LIMITS)
    if value is None:
        assert text is None
    else:
        assert json.loads(text) == (list(value) if isinstance(value, tuple) else value)


BAD_PAYLOADS = {
    "nul-in-string": {"a": "x\x00y"},
    "nul-in-nested-string": {"a": [{"b": ["\x00"]}]},
    "nul-in-key": {"a\x00": 1},
    "nan": {"a": math.nan},
    "infinity": [math.inf],
    "negative-infinity": {"a": {"b": -math.inf}},
    "non-string-key": {1: "a"},
    "tuple-key": {(1, 2): "a"},
    "set": {"a": {1}},
    "bytes": {"a": b"x"},
    "object": {"a": object()},
    "lone-surrogate": {"a": "\ud800"},
}


@pytest.mark.parametrize("value", BAD_PAYLOADS.values(), ids=BAD_PAYLOADS.keys())
def test_payload__refuses_what_jsonb_cannot_hold_naming_the_field(value):
    with pytest.raises(InvalidInput) as caught:
        validation.payload("checkpoint", value, **LIMITS)
    assert caught.value.field == "checkpoint"


def test_payload__depth_is_bounded_inclusively():
    validation.payload("input", _deep(5), **LIMITS)
    validation.payload("input", _deep(4, leaf={"k": "v"}), **LIMITS)
    with pytest.raises(InvalidInput) as caught:
        validation.payload("input", _deep(6), **LIMITS)
    assert "MAX_PAYLOAD_DEPTH" in str(caught.value)


def test_payload__a_hostile_depth_is_refused_without_exhausting_the_stack():
    with pytest.raises(InvalidInput):
        validation.payload("input", _deep(100_000), max_bytes=10**9, max_depth=64)


def test_payload__size_is_counted_in_utf8_bytes_of_the_compact_form():
    # '"' + 10 x 'é' (2 bytes each) + '"' = 22 bytes
    validation.payload("input", "é" * 10, max_bytes=22, max_depth=5)
    with pytest.raises(InvalidInput) as caught:
        validation.payload("input", "é" * 10, max_bytes=21, max_depth=5)
    assert "MAX_PAYLOAD_BYTES" in str(caught.value)
    # Compact separators: {"a":1,"b":2} is 13 bytes.
    validation.payload("input", {"a": 1, "b": 2}, max_bytes=13, max_depth=5)


# ---------------------------------------------------------------------------------------
# printable
# ---------------------------------------------------------------------------------------


def test_printable__escapes_control_characters_onto_one_line():
    text = validation.printable("ok\nFAKE LOG LINE\x1b[31m\u2028")
    assert "\n" not in text and "\x1b" not in text and "\u2028" not in text
    assert "FAKE LOG LINE" in text


def test_printable__leaves_clean_text_alone_and_truncates_long_text():
    assert validation.printable("ünïcödé fine") == "ünïcödé fine"
    truncated = validation.printable("x" * 50, limit=10)
    assert len(truncated) == 10 and truncated.endswith("…")


def test_handler_kind__refuses_a_trailing_newline():
    """Invariant 23: the registry's kind pattern refuses what validation.name refuses."""
    from durable_jobs import registry
    from durable_jobs.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError):
        registry.handler("reports.rebuild\n")(lambda job: None)
    assert registry.get("reports.rebuild\n") is None


def test_handler_policy__is_validated_and_accepts_timedeltas(kinds):
    """A kind's policy is checked when it is registered: durations may be timedeltas
    (read back in seconds); a negative, non-numeric or NaN duration, a non-callable
    mirror or classifier and a malformed queue name are refused at registration."""
    from durable_jobs.exceptions import ConfigurationError

    handler = kinds.add(
        "tests.policy", slice_budget=timedelta(minutes=5), lease_ttl=timedelta(seconds=90)
    )
    assert (handler.setting("SLICE_BUDGET"), handler.setting("LEASE_TTL")) == (300.0, 90.0)
    for bad in (
        {"slice_budget": -1},
        {"max_consecutive_failures": "5"},
        {"lease_ttl": float("nan")},
        {"mirror": "not callable"},
        {"classify": 3},
        {"queue": "bad queue"},
    ):
        with pytest.raises(ConfigurationError):
            kinds.add("tests.policy_bad", **bad)


# ---------------------------------------------------------------------------------------
# counts (processed, total, total_count)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 2**63 - 1])
def test_count__accepts_non_negative_integers_within_bigint(value):
    assert validation.count("total", value) == value


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (-1, "got -1"),
        (2**63, "bigint"),
        (2**70, "bigint"),
        (True, "bool"),
        (1.0, "float"),
        ("lots", "str 'lots'"),
        (None, "NoneType"),
        ("a\nFORGED", "\\n"),
    ],
    ids=[
        "negative",
        "bigint-plus-one",
        "2**70",
        "bool",
        "float",
        "text",
        "none",
        "control-characters",
    ],
)
def test_count__refuses_anything_else_naming_the_field_and_the_value(value, named):
    with pytest.raises(InvalidProgress) as caught:
        validation.count("processed", value)
    error = caught.value
    assert error.field == "processed" and named in str(error) and "\n" not in str(error)
    assert isinstance(error, ValueError) and isinstance(error, InvalidJobData)
    assert (error.error_class, error.code) == ("terminal", "invalid_progress")


def test_progress__none_and_unset_pass_through_and_processed_may_exceed_total():
    unset = object()
    assert validation.progress(None, unset, unset=unset) == (None, unset)
    assert validation.progress(5, None, unset=unset) == (5, None)
    assert validation.progress(12, 10, unset=unset) == (12, 10), "a total is often an estimate"


# ---------------------------------------------------------------------------------------
# checkpoint
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "named"),
    [
        ({"s": {1}}, "set"),
        ({"t": "\x00"}, "NUL"),
        (_deep(6), "MAX_PAYLOAD_DEPTH"),
        ("x" * 2_000, "MAX_PAYLOAD_BYTES"),
    ],
    ids=["set", "nul", "too-deep", "too-big"],
)
def test_checkpoint__refuses_what_jsonb_cannot_hold_as_a_terminal_invalid_checkpoint(state, named):
    with pytest.raises(InvalidCheckpoint) as caught:
        validation.checkpoint(state, **LIMITS)
    error = caught.value
    assert str(error).startswith("checkpoint: ") and named in str(error)
    assert (error.field, error.error_class, error.code) == (
        "checkpoint",
        "terminal",
        "invalid_checkpoint",
    )
    assert validation.checkpoint({"cursor": 3}, **LIMITS) == '{"cursor":3}'


# ---------------------------------------------------------------------------------------
# run_after
# ---------------------------------------------------------------------------------------

DAY = 86400.0


def test_run_after__durations_become_seconds_within_the_ceiling():
    assert validation.run_after(None, max_ahead=DAY) is None
    assert validation.run_after(timedelta(hours=1), max_ahead=DAY) == 3600.0
    assert validation.run_after(timedelta(minutes=-5), max_ahead=DAY) == 0.0  # past means now
    assert validation.run_after(DAY, max_ahead=DAY) == DAY


@pytest.mark.parametrize("value", [DAY + 1, -1, 1e300], ids=["beyond", "negative", "huge"])
def test_run_after__a_duration_out_of_range_is_refused(value):
    with pytest.raises(RunAfterOutOfRange) as caught:
        validation.run_after(value, max_ahead=DAY)
    assert caught.value.field == "run_after" and caught.value.value == value


def test_run_after_instant__is_bounded_by_the_clock_it_is_given():
    now = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
    plus_two = timezone(timedelta(hours=2))
    for fine in (
        now - timedelta(hours=23),
        now + timedelta(days=29),
        datetime(2026, 6, 1, 14, 0, tzinfo=plus_two),
    ):
        assert validation.run_after_instant(fine, now, max_ahead=30 * DAY) == fine
    for bad in (
        now - timedelta(days=1, seconds=1),
        now + timedelta(days=30, seconds=1),
        datetime.min.replace(tzinfo=plus_two),
        datetime.max.replace(tzinfo=timezone.utc),
    ):
        with pytest.raises(RunAfterOutOfRange):
            validation.run_after_instant(bad, now, max_ahead=30 * DAY)
