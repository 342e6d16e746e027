"""The REDACT_ERROR hook: exception text (which may carry personal data) passes it before
it is stored (the job row, its attempt rows) or logged by the worker."""

from __future__ import annotations

import logging
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import durable_jobs as durable
from durable_jobs import checks, conf, testing
from durable_jobs.console import queries
from durable_jobs.exceptions import ConfigurationError
from tests.factories import reload

EMAIL = re.compile(r"[\w.+-]+@[\w-]+(\.[\w-]+)+")
HOOK = "tests.integration.test_attempt_history_redaction.mask_emails"


def mask_emails(text: str) -> str:
    return EMAIL.sub("<email>", text)


def broken_hook(text: str) -> str:
    raise KeyError(text)


def _lookup(job):
    raise LookupError("user alice@example.com not found")


@pytest.fixture
def redacting(settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "REDACT_ERROR": HOOK}


@pytest.mark.django_db
def test_a_redaction_hook__keeps_the_address_out_of_the_row_the_attempt_and_the_log(
    kinds, redacting, caplog
):
    kinds.add("tests.lookup", _lookup)
    job = durable.start("tests.lookup")
    with caplog.at_level(logging.DEBUG, logger="durable_jobs"):
        assert [r.outcome for r in testing.run_jobs(max_slices=1)] == ["retrying"]
    row = reload(job)
    [attempt] = queries.attempts_of(job.id)
    assert row.error_message == "LookupError: user <email> not found"
    assert attempt.error_message == row.error_message
    assert "user <email> not found" in attempt.traceback
    assert "user <email> not found" in caplog.text, "the worker logged the (redacted) error"
    for text in (row.error_message, attempt.error_message, attempt.traceback, caplog.text):
        assert "alice@example.com" not in text


@pytest.mark.django_db
def test_without_a_hook__the_text_is_kept_as_it_was(kinds):
    kinds.add("tests.lookup", _lookup)
    job = durable.start("tests.lookup")
    testing.run_jobs()
    assert reload(job).error_message == "LookupError: user alice@example.com not found"


@pytest.mark.django_db
def test_a_hook_that_fails__withholds_the_text_instead_of_storing_it(kinds, settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "REDACT_ERROR": broken_hook}
    kinds.add("tests.lookup", _lookup)
    job = durable.start("tests.lookup")
    assert [r.outcome for r in testing.run_jobs(max_slices=1)] == ["retrying"], (
        "the slice is still recorded"
    )
    row = reload(job)
    [attempt] = queries.attempts_of(job.id)
    assert "REDACT_ERROR hook failed (KeyError)" in row.error_message
    assert "alice@example.com" not in row.error_message + attempt.traceback


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("no_such_module.redact", "cannot be imported"),
        ("durable_jobs.conf.no_such_function", "cannot be imported"),
        ("durable_jobs.conf.NAME_PATTERN", "is not callable"),
        (42, "must be None, a callable or the dotted path of one"),
    ],
)
def test_a_bad_hook__is_refused_naming_it(value, says):
    with pytest.raises(ConfigurationError) as refused:
        conf.load({"REDACT_ERROR": value})
    message = str(refused.value)
    assert "DURABLE_JOBS['REDACT_ERROR']" in message and says in message
    if isinstance(value, str):
        assert repr(value) in message


def test_an_unimportable_hook__stops_the_worker_at_boot_naming_it(settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "REDACT_ERROR": "myproject.jobs.redact"}
    [error] = checks.check_settings()
    assert "'myproject.jobs.redact'" in error.msg
    with pytest.raises(
        CommandError, match=r"REDACT_ERROR.*'myproject\.jobs\.redact'.*cannot be imported"
    ):
        call_command("durable_worker", "--burst")


def test_a_hook_given_as_a_dotted_path__is_what_runs(settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "REDACT_ERROR": HOOK}
    assert conf.redact("mail bob@example.org now") == "mail <email> now"
    assert conf.redact(None) is None
