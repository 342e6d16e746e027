"""Declared queues (``DURABLE_JOBS["QUEUES"]``) and idempotency keys that must match their input.

A typo in a queue name used to start a job nobody would ever claim; a retried request
whose body changed used to get the first job back silently. Both can now be refused, at
the start, with a one-line error that says what to do.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import override_settings

import durable_jobs as durable
from durable_jobs import conf
from durable_jobs.exceptions import ConfigurationError, IdempotencyInputMismatch, InvalidInput
from durable_jobs.models import Job

pytestmark = pytest.mark.django_db

DECLARED = {"QUEUES": ["default", "reports"]}


@pytest.fixture
def kind(kinds):
    kinds.add("tests.declared")
    return "tests.declared"


def test_a_start_on_an_undeclared_queue_is_refused_with_a_did_you_mean(kind):
    with override_settings(DURABLE_JOBS=DECLARED):
        with transaction.atomic():
            with pytest.raises(InvalidInput) as refused:
                durable.start(kind, queue="reprots")
            kept = durable.start(kind, queue="reports")  # the caller's transaction carries on
    assert str(refused.value) == (
        "queue: 'reprots' is not a declared queue (DURABLE_JOBS['QUEUES']: default, reports); "
        "did you mean 'reports'?"
    )
    assert list(Job.objects.values_list("id", flat=True)) == [kept.id]


def test_start_many_refuses_the_whole_batch_for_one_undeclared_queue(kind):
    with override_settings(DURABLE_JOBS=DECLARED):
        with pytest.raises(InvalidInput, match="'mail' is not a declared queue"):
            durable.start_many([{"kind": kind}, {"kind": kind, "queue": "mail"}])
    assert not Job.objects.exists()


def test_without_declared_queues_any_well_formed_queue_is_accepted(kind):
    assert durable.start(kind, queue="anything.goes").queue_name == "anything.goes"


def test_declared_queues_must_include_the_default_and_be_names():
    with pytest.raises(ConfigurationError, match="must include DEFAULT_QUEUE \\('default'\\)"):
        conf.load({"QUEUES": ["reports"]})
    with pytest.raises(ConfigurationError, match="must be None or a list"):
        conf.load({"QUEUES": "default"})
    with pytest.raises(ConfigurationError, match="names of letters"):
        conf.load({"QUEUES": ["default", "no spaces"]})


def test_a_handler_on_an_undeclared_queue_is_refused_at_registration():
    with override_settings(DURABLE_JOBS=DECLARED):
        with pytest.raises(ConfigurationError, match="handler 'tests.typo': queue 'reprot'"):
            durable.handler("tests.typo", queue="reprot")(lambda job: durable.DONE)


def test_a_worker_for_an_undeclared_queue_is_refused_in_one_line():
    with override_settings(DURABLE_JOBS=DECLARED):
        with pytest.raises(CommandError, match="--queues: 'reprots' is not a declared queue"):
            call_command("durable_worker", "--queues", "default,reprots", "--burst")


def test_an_idempotency_key_with_another_input_returns_the_first_job_by_default(kind):
    first = durable.start(kind, input={"amount": 10}, idempotency_key="req-1")
    again = durable.start(kind, input={"amount": 99}, idempotency_key="req-1")
    assert again.id == first.id and again.input == {"amount": 10}


def test_an_idempotency_key_with_another_input_is_a_conflict_when_inputs_are_checked(kind):
    with override_settings(DURABLE_JOBS={"IDEMPOTENCY_CHECKS_INPUT": True}):
        first = durable.start(kind, input={"amount": 10, "to": "a"}, idempotency_key="req-1")
        # The same body, keys in another order: the same request.
        assert (
            durable.start(kind, input={"to": "a", "amount": 10}, idempotency_key="req-1") == first
        )
        with transaction.atomic():
            with pytest.raises(IdempotencyInputMismatch) as refused:
                durable.start(kind, input={"amount": 99, "to": "a"}, idempotency_key="req-1")
            other = durable.start(kind, input={"amount": 99}, idempotency_key="req-2")
        with pytest.raises(IdempotencyInputMismatch):
            durable.start_many([{"kind": kind, "input": {"amount": 1}, "idempotency_key": "req-1"}])
    assert refused.value.job_id == first.id
    assert "with a different input; use a new key for a new request" in str(refused.value)
    assert set(Job.objects.values_list("id", flat=True)) == {first.id, other.id}
