"""``validation``: bad input refused at the API, naming the argument (no database).

Invariant 23 (only validated bytes reach a label or a log line) and the jsonb limits."""

from __future__ import annotations

import json

import math

import pytest

from durable_jobs import validation
from durable_jobs.exceptions import InvalidInput

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
