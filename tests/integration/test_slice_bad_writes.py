"""A handler that asks its slice to store something unstorable has a bug: the job fails at
once, terminal, with a message naming what was wrong (as a bad ``Done(...)`` result does),
instead of being retried as a transient fault until its budget runs out. Slices run
in-process with ``testing.run_jobs`` (see test_executor.py)."""

from __future__ import annotations

import datetime

import pytest
from django.test import override_settings

import durable_jobs as durable
from durable_jobs import testing
from durable_jobs.exceptions import InvalidCheckpoint, InvalidProgress
from testproject.demo.models import Report
from tests.factories import reload

pytestmark = pytest.mark.django_db

KIND = "tests.bad_writes"


def _deep(levels: int) -> object:
    value: object = "leaf"
    for _ in range(levels):
        value = [value]
    return value


def _run_one(kinds, handler, **policy):
    kinds.add(KIND, handler, **policy)
    job = durable.start(KIND, total_count=10)
    reports = testing.run_jobs(max_slices=3)
    return [report.outcome for report in reports], reload(job)


BAD_CHECKPOINTS = {
    "datetime": ({"at": datetime.datetime(2026, 1, 1)}, "contains a datetime"),
    "set": ({"seen": {1, 2}}, "contains a set"),
    "nul": ({"text": "a\x00b"}, "NUL"),
    "nan": ({"ratio": float("nan")}, "NaN"),
    "too-big": ({"blob": "x" * 200}, "MAX_PAYLOAD_BYTES"),
    "too-deep": (_deep(10), "MAX_PAYLOAD_DEPTH"),
}


@pytest.mark.parametrize(("state", "named"), BAD_CHECKPOINTS.values(), ids=BAD_CHECKPOINTS.keys())
def test_save_checkpoint__an_unstorable_state_fails_the_job_at_once(kinds, state, named):
    def handler(job):
        job.save_checkpoint(state, processed=1)
        return durable.DONE

    with override_settings(DURABLE_JOBS={"MAX_PAYLOAD_BYTES": 100, "MAX_PAYLOAD_DEPTH": 5}):
        outcomes, after = _run_one(kinds, handler)

    assert outcomes == ["failed"], "one slice, no retries"
    assert (after.status, after.error_class, after.consecutive_failures) == (
        "failed",
        "terminal",
        1,
    )
    assert after.error_message.startswith("InvalidCheckpoint: checkpoint:")
    assert named in after.error_message
    assert (after.checkpoint, after.processed_count) == (None, 0), "nothing of the call was stored"


def test_save_checkpoint__fails_at_once_whatever_the_handlers_classifier_says(kinds):
    """A classifier decides about the handler's own exceptions; a bug in calling the slice
    is not one of them (a bad Done(...) result bypasses it too)."""

    def handler(job):
        job.save_checkpoint({"at": object()})
        return durable.DONE

    outcomes, after = _run_one(kinds, handler, classify=lambda error: "transient")
    assert outcomes == ["failed"] and (after.status, after.error_class) == ("failed", "terminal")


def test_save_checkpoint__inside_a_fence_an_unstorable_state_lands_none_of_the_domain_writes(kinds):
    def handler(job):
        with job.fenced():
            Report.objects.create(name="written beside the checkpoint")
            job.save_checkpoint({"at": datetime.date(2026, 1, 1)})
        return durable.DONE

    outcomes, after = _run_one(kinds, handler)
    assert outcomes == ["failed"] and after.status == "failed"
    assert Report.objects.count() == 0


def test_save_checkpoint__the_handler_can_catch_the_named_error(kinds):
    """It is a ValueError naming the field, like every refusal of bad input."""
    caught = []

    def handler(job):
        try:
            job.save_checkpoint({"at": {1}})
        except InvalidCheckpoint as error:
            caught.append((error.field, isinstance(error, ValueError)))
        job.save_checkpoint({"at": 1})
        return durable.DONE

    outcomes, after = _run_one(kinds, handler)
    assert caught == [("checkpoint", True)]
    assert outcomes == ["completed"] and after.checkpoint == {"at": 1}


BAD_PROGRESS = {
    "negative-processed": ("save_checkpoint", {"processed": -5}, "processed", "got -5"),
    "negative-total": ("save_checkpoint", {"processed": 1, "total": -10}, "total", "got -10"),
    "text-processed": ("heartbeat", {"processed": "lots"}, "processed", "str 'lots'"),
    "huge-total": ("heartbeat", {"total": 2**70}, "total", "bigint"),
    "bool-processed": ("heartbeat", {"processed": True}, "processed", "bool"),
    "float-processed": ("save_checkpoint", {"processed": 2.5}, "processed", "float"),
}


@pytest.mark.parametrize(
    ("method", "kwargs", "field", "named"), BAD_PROGRESS.values(), ids=BAD_PROGRESS.keys()
)
def test_progress__a_bad_count_fails_the_job_at_once_naming_it(kinds, method, kwargs, field, named):
    """processed/total are non-negative integers within bigint: "lots" or 2**70 no longer
    reach the database as a DataError (retried as transient), and -5/-10 are not stored."""

    def handler(job):
        getattr(job, method)(
            **({"state": {"c": 1}} if method == "save_checkpoint" else {}), **kwargs
        )
        return durable.DONE

    outcomes, after = _run_one(kinds, handler)

    assert outcomes == ["failed"]
    assert (after.status, after.error_class) == ("failed", "terminal")
    assert after.error_message.startswith(f"InvalidProgress: {field}:")
    assert named in after.error_message
    assert (after.processed_count, after.total_count, after.checkpoint) == (0, 10, None)


def test_progress__the_named_error_is_a_value_error(kinds):
    errors = []

    def handler(job):
        try:
            job.heartbeat(processed=-1)
        except InvalidProgress as error:
            errors.append((error.field, isinstance(error, ValueError)))
        return durable.DONE

    _run_one(kinds, handler)
    assert errors == [("processed", True)]


def test_done__a_result_over_max_payload_bytes_fails_the_job_at_once_naming_the_bound(kinds):
    """What a parent, ``get()``, the admin and ``get_result`` read is bounded: an over-size
    ``Done(result)`` stores nothing and fails the job with the verdict ``terminal`` and a
    message leading with ``invalid_result`` that names the bound."""

    def handler(job):
        return durable.Done({"blob": "x" * 200})

    with override_settings(DURABLE_JOBS={"MAX_PAYLOAD_BYTES": 100}):
        outcomes, after = _run_one(kinds, handler)

    assert outcomes == ["failed"], "one slice, no retries"
    assert (after.status, after.error_code, after.result) == ("failed", "terminal", None)
    assert after.error_message == (
        "invalid_result: InvalidInput: result: is 211 bytes serialised; "
        "the limit is 100 (MAX_PAYLOAD_BYTES)"
    )
