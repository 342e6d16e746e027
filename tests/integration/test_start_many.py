"""start_many: one statement for a batch, with start()'s validation and keys."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

import durable_jobs as durable
from durable_jobs.models import Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_starts_every_job_in_order_with_its_fields():
    ids = durable.start_many(
        [
            {
                "kind": "demo.flaky",
                "input": {"n": i, "text": "é\\\"'"},
                "priority": i,
                "meta": {"i": i},
            }
            for i in range(50)
        ]
    )
    assert [Job.objects.get(id=job_id).input["n"] for job_id in ids] == list(range(50))
    assert Job.objects.count() == 50
    row = Job.objects.get(id=ids[7])
    assert (row.input, row.meta, row.priority, row.status) == (
        {"n": 7, "text": "é\\\"'"},
        {"i": 7},
        7,
        "pending",
    )


def test_run_after_and_subjects_are_applied():
    [later_id] = durable.start_many(
        [{"kind": "demo.flaky", "run_after": timedelta(hours=1), "subject": ("a.b", 3)}]
    )
    later = Job.objects.get(id=later_id)
    assert later.subject_id == "3" and later.next_run_at > later.created_at + timedelta(minutes=59)


def test_validation_refuses_the_whole_batch_naming_the_bad_field():
    with pytest.raises(durable.InvalidInput, match="input"):
        durable.start_many(
            [{"kind": "demo.flaky"}, {"kind": "demo.flaky", "input": {"x": "\u0000"}}]
        )
    with pytest.raises(durable.InvalidInput, match="unknown arguments"):
        durable.start_many([{"kind": "demo.flaky", "colour": "red"}])
    assert Job.objects.count() == 0


def test_idempotency_keys_answer_with_the_existing_job_and_repeats_in_the_batch():
    first = durable.start("demo.flaky", idempotency_key="k1")
    ids = durable.start_many(
        [
            {"kind": "demo.flaky", "idempotency_key": "k1"},
            {"kind": "demo.flaky", "idempotency_key": "k2"},
            {"kind": "demo.flaky", "idempotency_key": "k2"},
        ]
    )
    assert ids[0] == first.id and ids[1] == ids[2] != first.id
    assert Job.objects.count() == 2


def test_a_held_lock_key_refuses_the_batch_and_leaves_the_transaction_usable():
    holder = JobFactory(kind="demo.flaky", lock_key="busy")
    with transaction.atomic():
        with pytest.raises(durable.LockKeyHeld) as caught:
            durable.start_many([{"kind": "demo.flaky"}, {"kind": "demo.flaky", "lock_key": "busy"}])
        assert caught.value.holder_id == holder.id
        with pytest.raises(durable.LockKeyHeld):
            durable.start_many(
                [{"kind": "demo.flaky", "lock_key": "x"}, {"kind": "demo.flaky", "lock_key": "x"}]
            )
        durable.start("demo.flaky")  # still usable
    assert Job.objects.count() == 2


def test_an_idempotency_key_of_another_kind_is_a_conflict():
    durable.start("demo.flaky", idempotency_key="k")
    with pytest.raises(durable.IdempotencyConflict):
        durable.start_many([{"kind": "demo.import", "idempotency_key": "k"}])


def test_a_key_repeated_within_the_batch_with_another_kind_is_a_conflict():
    """Invariant 9: the key check covers the batch itself, not only rows already stored."""
    with pytest.raises(durable.IdempotencyConflict):
        durable.start_many(
            [
                {"kind": "demo.flaky", "idempotency_key": "k"},
                {"kind": "demo.noop", "idempotency_key": "k"},
            ]
        )
    assert Job.objects.count() == 0


def test_an_empty_batch_does_nothing():
    assert durable.start_many([]) == []
