"""Bounds on what start()/start_many() may schedule and count (invariants 2 and 9).

``run_after`` may not lie more than a day in the past (year 1 would jump the queue) nor
beyond ``MAX_RUN_AFTER`` (default 366 days), measured on the database's clock; counts are
non-negative integers within bigint. A refused call names the argument and stores nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.test import override_settings

import durable_jobs as durable
from durable_jobs.exceptions import InvalidProgress, RunAfterOutOfRange
from durable_jobs.models import Job
from tests.integration.support import db_now

pytestmark = pytest.mark.django_db

KIND = "tests.bounds"


@pytest.fixture(autouse=True)
def _kind(kinds):
    kinds.add(KIND)


def _start(how: str, **kwargs):
    if how == "start":
        return durable.start(KIND, **kwargs)
    return durable.start_many([{"kind": KIND}, {"kind": KIND, **kwargs}])


both = pytest.mark.parametrize("how", ["start", "start_many"])


REFUSED_RUN_AFTER = {
    "year-1": lambda now: datetime(1, 1, 1, tzinfo=timezone.utc),
    "datetime-min-in-a-zone": lambda now: datetime.min.replace(tzinfo=timezone(timedelta(hours=2))),
    "two-days-ago": lambda now: now - timedelta(days=2),
    "eleven-years-ahead": lambda now: now + timedelta(days=11 * 365),
    "year-9999": lambda now: datetime(9999, 1, 1, tzinfo=timezone.utc),
    "367-days-ahead": lambda now: now + timedelta(days=367),
    "367-days-as-a-timedelta": lambda now: timedelta(days=367),
    "367-days-as-seconds": lambda now: 367 * 86400,
}


@both
@pytest.mark.parametrize("make", REFUSED_RUN_AFTER.values(), ids=REFUSED_RUN_AFTER.keys())
def test_start__a_run_after_out_of_bounds_is_refused_and_stores_nothing(how, make):
    value = make(db_now())
    with pytest.raises(RunAfterOutOfRange) as caught:
        _start(how, run_after=value)
    assert caught.value.field == "run_after" and isinstance(caught.value, ValueError)
    assert Job.objects.count() == 0


def test_start__the_refusals_say_which_bound_and_where_it_is_set():
    with pytest.raises(RunAfterOutOfRange, match="more than a day in the past"):
        durable.start(KIND, run_after=datetime(1, 1, 1, tzinfo=timezone.utc))
    with pytest.raises(RunAfterOutOfRange, match=r"366 days, DURABLE_JOBS\['MAX_RUN_AFTER'\]"):
        durable.start(KIND, run_after=db_now() + timedelta(days=400))


@both
def test_start__the_run_after_bounds_sit_a_day_back_and_max_run_after_ahead(how):
    """Just inside each bound is accepted (an instant an hour past, a caller's "09:00
    today" computed late, is due at once), just outside is refused."""
    now = db_now()
    _start(how, run_after=now - timedelta(hours=23))
    _start(how, run_after=now + timedelta(days=365, hours=23))
    _start(how, run_after=timedelta(days=365, hours=23))
    for outside in (
        now - timedelta(hours=25),
        now + timedelta(days=366, hours=1),
        timedelta(days=366, hours=1),
    ):
        with pytest.raises(RunAfterOutOfRange):
            _start(how, run_after=outside)
    stored = 3 if how == "start" else 6
    assert Job.objects.count() == stored
    assert Job.objects.filter(next_run_at__gt=now + timedelta(days=365)).count() == 2


def test_start__max_run_after_is_configurable():
    with override_settings(DURABLE_JOBS={"MAX_RUN_AFTER": timedelta(hours=1)}):
        durable.start(KIND, run_after=timedelta(minutes=59))
        durable.start(KIND, run_after=db_now() + timedelta(minutes=59))
        for value in (timedelta(minutes=61), 3660, db_now() + timedelta(minutes=61)):
            with pytest.raises(RunAfterOutOfRange):
                durable.start(KIND, run_after=value)
    assert Job.objects.count() == 2


BAD_TOTALS = {
    "negative": -10,
    "text": "lots",
    "beyond-bigint": 2**70,
    "bool": True,
    "float": 10.0,
}


@both
@pytest.mark.parametrize("total", BAD_TOTALS.values(), ids=BAD_TOTALS.keys())
def test_start__a_bad_total_count_is_refused_naming_it_and_stores_nothing(how, total):
    with pytest.raises(InvalidProgress) as caught:
        _start(how, total_count=total)
    assert caught.value.field == "total_count" and isinstance(caught.value, ValueError)
    assert Job.objects.count() == 0


def test_start__the_largest_bigint_total_is_accepted():
    job = durable.start(KIND, total_count=2**63 - 1)
    assert Job.objects.get(id=job.id).total_count == 2**63 - 1
