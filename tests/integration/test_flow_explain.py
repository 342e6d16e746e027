"""Invariant 28, explain reads the claim: for every reason, a job explain calls claimable is
claimed by the dequeue statement, and one it calls blocked is not.

Each case builds one job held back by one reason (or by none), asks ``durable.explain``,
then runs the claim over the whole queue and compares.
"""

from __future__ import annotations

import io
import json
import time
from datetime import datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import connection

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.limits import claims
from durable_jobs.limits import reasons as r
from durable_jobs.models import Job
from tests.factories import JobFactory
from tests.integration.support import FAIL_DEFAULTS, SLACK, db_now, lease_of

TTL_MS = 30_000


def _claim_all() -> set:
    flow = claims.claim_settings()
    return {j.id for j in store.dequeue(["default"], "w", TTL_MS, kinds=None, limit=100, flow=flow)}


def _claim_one() -> list:
    flow = claims.claim_settings()
    return store.dequeue(["default"], "w0", TTL_MS, kinds=None, limit=1, flow=flow)


def _not_due(kinds):
    return durable.start("ex.free", run_after=3600), r.NOT_DUE


def _backing_off(kinds):
    job = durable.start("ex.free")
    [claimed] = store.dequeue(["default"], "w0", TTL_MS, kinds=None, limit=1)
    store.fail_slice(lease_of(claimed), **{**FAIL_DEFAULTS, "backoff_base_ms": 3_600_000})
    return job, r.BACKING_OFF


def _held(kinds):
    job = JobFactory(
        kind="ex.free",
        held_since=-60,
        next_run_at=600,
        wait_for=[{"after": "2099-01-01T00:00:00Z"}],
    )
    return job, r.HELD


def _workflow_wait(kinds):
    wait = json.dumps({"on": "children", "policy": "fail", "seq": 0})  # as a hold stores it
    job = JobFactory(kind="ex.free", next_run_at=None, flow_wait=wait)
    return job, r.WORKFLOW_WAIT


def _cancel_requested(kinds):
    job = durable.start("ex.free")
    durable.cancel(job.id, by="ops")
    return job, r.CANCEL_REQUESTED


def _queue_paused(kinds):
    job = durable.start("ex.free")
    durable.pause_queue("default", reason="maintenance")
    return job, r.QUEUE_PAUSED


def _concurrency_full(kinds):
    durable.start("ex.one")
    assert len(_claim_all()) == 1
    return durable.start("ex.one"), r.CONCURRENCY_FULL


def _rate_limited(kinds):
    durable.start("ex.rated")
    [first] = store.dequeue(
        ["default"], "w0", TTL_MS, kinds=None, limit=1, flow=claims.claim_settings()
    )
    store.complete(lease_of(first))
    return durable.start("ex.rated"), r.RATE_LIMITED


def _claimable(kinds):
    return durable.start("ex.free"), r.CLAIMABLE


def _fair_turn(kinds):
    flow = claims.claim_settings()
    for _ in range(2):
        durable.start("ex.tenant", scope="busy")
        store.dequeue(["default"], "w0", TTL_MS, kinds=None, limit=1, flow=flow)
    durable.start("ex.tenant", scope="busy")
    durable.start("ex.tenant", scope="quiet")
    later = durable.start("ex.tenant", scope="quiet")
    [turn] = store.dequeue(["default"], "w0", TTL_MS, kinds=None, limit=1, flow=flow)
    assert turn.tenant_id == "quiet"  # the key served least goes first
    return later, r.FAIR_TURN


CASES = {
    "not_due": _not_due,
    "backing_off": _backing_off,
    "held": _held,
    "workflow_wait": _workflow_wait,
    "cancel_requested": _cancel_requested,
    "queue_paused": _queue_paused,
    "concurrency_full": _concurrency_full,
    "rate_limited": _rate_limited,
    "claimable": _claimable,
    "fair_turn": _fair_turn,
}


@pytest.fixture
def ex_kinds(kinds):
    kinds.add("ex.free")
    kinds.add("ex.one", flow=durable.FlowControl(key="kind", concurrency=1))
    kinds.add(
        "ex.rated", flow=durable.FlowControl(key="kind", rate=durable.Rate(limit=1, per=3600))
    )
    kinds.add("ex.tenant", flow=durable.FlowControl(key="tenant"))
    return kinds


@pytest.mark.django_db
@pytest.mark.parametrize("case", sorted(CASES))
def test_explain__agrees_with_the_claim(ex_kinds, case):
    job, expected = CASES[case](ex_kinds)

    reasons = durable.explain(job.id, scope=(job.tenant_id, job.organization_id))
    blocked = any(reason.blocks_claim for reason in reasons)

    assert expected in [reason.code for reason in reasons], reasons
    assert all(reason.sentence for reason in reasons)
    assert (job.id in _claim_all()) is not blocked, reasons


@pytest.mark.django_db
def test_explain__names_the_jobs_holding_a_full_key_and_when_a_rate_frees(ex_kinds):
    holder = durable.start("ex.one")
    _claim_all()
    waiting = durable.start("ex.one")

    [full] = [x for x in durable.explain(waiting.id) if x.code == r.CONCURRENCY_FULL]

    assert full.fields["holders"] == [str(holder.id)]
    assert full.fields["limit"] == 1
    assert str(holder.id) in full.sentence
    assert full.as_dict()["fields"]["key"] == "kind:ex.one"

    # A rate of 2 starts an hour: the window frees a start an hour after its oldest start
    # (by the database clock), not after the newest.
    ex_kinds.add(
        "ex.twice", flow=durable.FlowControl(key="kind", rate=durable.Rate(limit=2, per=3600))
    )
    for _ in range(3):
        durable.start("ex.twice")
    before = db_now()
    [oldest] = _claim_one()
    after = db_now()
    time.sleep(SLACK.total_seconds() * 2)
    second = db_now()
    assert len(_claim_one()) == 1
    store.complete(lease_of(oldest))
    [rated] = Job.objects.filter(kind="ex.twice", status="pending")

    [limited] = [x for x in durable.explain(rated.id) if x.code == r.RATE_LIMITED]

    hour = timedelta(hours=1)
    assert (limited.fields["limit"], limited.fields["window_s"]) == (2, 3600.0)
    assert before + hour - SLACK <= limited.fields["until"] <= after + hour + SLACK
    assert limited.fields["until"] < second + hour - SLACK  # the oldest start frees, not the newest
    out = io.StringIO()
    call_command("durable_jobs", "explain", str(rated.id), "--json", stdout=out)
    [shown] = [x for x in json.loads(out.getvalue())["reasons"] if x["code"] == r.RATE_LIMITED]
    assert datetime.fromisoformat(shown["fields"]["until"]) == limited.fields["until"]


@pytest.mark.django_db
def test_explain__a_job_no_live_worker_serves_says_so(ex_kinds):
    job = durable.start("ex.free")

    codes = [x.code for x in durable.explain(job.id)]

    assert r.NO_WORKER in codes


@pytest.mark.django_db
def test_explain__a_backing_off_job_says_which_failure_and_until_when(ex_kinds):
    job = durable.start("ex.free")
    for backoff_ms in (1, 3_600_000):  # a quick first retry, then an hour's backoff
        time.sleep(0.01)
        [claimed] = _claim_one()
        store.fail_slice(
            lease_of(claimed),
            **{
                **FAIL_DEFAULTS,
                "code": "upstream_503",
                "backoff_base_ms": backoff_ms,
                "backoff_max_ms": 7_200_000,
            },
        )
    row = Job.objects.get(id=job.id)

    [reason] = [x for x in durable.explain(job.id) if x.code == r.BACKING_OFF]

    assert reason.fields["failures"] == 2
    assert reason.fields["error_code"] == "upstream_503"
    assert reason.fields["until"] == row.next_run_at
    assert reason.fields["until"] > db_now() + timedelta(minutes=20)
    assert "failure 2" in reason.sentence and "upstream_503" in reason.sentence


@pytest.mark.django_db
def test_explain__a_parked_job_says_parked_with_its_code_and_since_when(ex_kinds):
    job = durable.start("ex.free")
    [claimed] = _claim_one()
    with connection.cursor() as cursor:  # its worker died: the lease ran out
        cursor.execute(
            f"UPDATE {store.TABLE} SET lease_expires_at = now() - interval '1 hour' WHERE id = %s",
            [claimed.id],
        )
    store.take_orphan(claimed.id, grace_ms=0, backoff_ms=0, max_redrives=0)  # poison
    row = Job.objects.get(id=job.id)
    assert (row.status, row.error_code) == ("failed", "poison")

    reasons = durable.explain(job.id)

    assert [x.code for x in reasons] == [r.PARKED]
    [parked] = reasons
    assert parked.fields["why"] == "poison"
    assert parked.fields["since"] == row.parked_at
    assert "poison" in parked.sentence and "re-drive" in parked.sentence
    assert parked.as_dict()["fields"]["since"] == row.parked_at.isoformat()
