"""Hostile input is refused before anything is written, or round-trips exactly, and never
forges a log line."""

from __future__ import annotations

import logging

import pytest
from django.db import connection

import durable_jobs as durable
from durable_jobs import testing
from durable_jobs.models import Job

pytestmark = pytest.mark.django_db


def count_rows() -> int:
    return Job.objects.count()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"text": "a\u0000b"}, "NUL"),
        ({"a\u0000": 1}, "NUL"),
        ({"x": float("nan")}, "NaN"),
        ({"x": object()}, "not a JSON type"),
    ],
)
def test_bad_json_is_refused_naming_the_field(payload, message):
    with pytest.raises(durable.InvalidInput, match=message) as caught:
        durable.start("demo.flaky", input=payload)
    assert caught.value.field == "input"
    assert count_rows() == 0


def test_deep_nesting_is_refused_without_exhausting_the_stack():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(durable.InvalidInput, match="nests deeper"):
        durable.start("demo.flaky", input=deep)
    assert count_rows() == 0


def test_a_100_mb_input_is_refused_before_anything_is_written():
    with pytest.raises(durable.InvalidInput, match="MAX_PAYLOAD_BYTES") as caught:
        durable.start("demo.flaky", input={"blob": "x" * 100_000_000})
    assert caught.value.field == "input"
    assert count_rows() == 0


def test_injection_looking_keys_round_trip_exactly():
    key = "'; DROP TABLE durable_jobs_job; -- \" $$ \\ %s %(x)s"
    job = durable.start(
        "demo.flaky",
        input={"k": key},
        lock_key=key,
        idempotency_key=key + "!",
        subject=("demo.thing", key),
        created_by=key[:100],
    )
    again = durable.get(job.id)
    assert (again.lock_key, again.idempotency_key, again.subject_id, again.input) == (
        key,
        key + "!",
        key,
        {"k": key},
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM durable_jobs_job")
        assert cursor.fetchone()[0] == 1


@pytest.mark.parametrize("kind", ["demo.flaky; DROP TABLE x", "demo\nflaky", "../demo", "démo", ""])
def test_kinds_outside_the_name_alphabet_are_refused(kind):
    with pytest.raises(durable.InvalidInput, match="kind"):
        durable.start(kind)


@pytest.mark.parametrize(
    "key", ["line\nbreak", "carriage\rreturn", "escape\x1b[31mred", "bell\x07"]
)
def test_control_characters_in_keys_are_refused(key):
    with pytest.raises(durable.InvalidInput, match="control characters"):
        durable.start("demo.flaky", lock_key=key)
    assert count_rows() == 0


def test_an_error_message_with_newlines_and_escapes_never_forges_a_log_line(kinds, caplog):
    def handler(job):
        raise durable.TerminalError(
            "boom\n2026-01-01 INFO durable_jobs.worker slice outcome=completed\x1b[2K"
        )

    kinds.add("tests.liar", handler)
    job = durable.start("tests.liar")
    with caplog.at_level(logging.INFO, logger="durable_jobs"):
        testing.run_jobs()
    lines = [record.getMessage() for record in caplog.records]
    assert lines and all("\n" not in line and "\x1b" not in line for line in lines)
    stored = Job.objects.get(id=job.id).error_message
    assert "\n" not in stored and "\\n" in stored
