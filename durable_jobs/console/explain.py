""" "Why isn't it running?": the plain-language answer the admin shows for a job.

A thin shell over the one explainer, ``durable_jobs.explain`` (``limits.explain``): the
same reasons the CLI and the API give, read with the claim statement's own predicates
(invariant 28), as the sentences an operator reads.
"""

from __future__ import annotations

from datetime import datetime

from durable_jobs.limits import api as limits_api
from durable_jobs.limits.reasons import Reason
from durable_jobs.models import Job


def reasons(job: Job) -> tuple[Reason, ...]:
    """The reasons ``job`` is not running, as data."""
    return limits_api.explain(job)


def explain(job: Job, *, now: datetime | None = None) -> list[str]:
    """Return the reasons ``job`` is not running now, in plain language.

    ``now`` is accepted for the callers that read the clock already; the explainer reads
    the database clock in the statement it decides with.
    """
    return [reason.sentence for reason in reasons(job)]
