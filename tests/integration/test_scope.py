"""Invariant 10, scope is exact: tenant A can neither see nor act on tenant B's job, and a
null organization ("tenant-wide") matches only null."""

from __future__ import annotations

import uuid

import pytest

import durable_jobs as durable
from durable_jobs.exceptions import InvalidInput, JobNotFound
from durable_jobs.states import Scope
from tests.factories import JobFactory, reload

KIND = "tests.scope"

# (scope the job lives in, a scope that must not reach it)
FOREIGN = {
    "other-tenant": (("tenant-a", None), ("tenant-b", None)),
    "same-org-id-other-tenant": (("tenant-a", "acme"), ("tenant-b", "acme")),
    "org-scope-on-tenant-wide-job": (("tenant-a", None), ("tenant-a", "acme")),
    "tenant-wide-scope-on-org-job": (("tenant-a", "acme"), ("tenant-a", None)),
    "other-organization": (("tenant-a", "acme"), ("tenant-a", "umbrella")),
}


@pytest.fixture
def kind(kinds):
    kinds.add(KIND)
    return KIND


def _failed_job(home):
    tenant, organization = home
    return JobFactory(
        tenant_id=tenant,
        organization_id=organization,
        kind=KIND,
        status="failed",
        next_run_at=None,
        finished_at=-1,
        error_code="boom",
        error_class="transient",
    )


@pytest.mark.django_db
@pytest.mark.parametrize(("home", "foreign"), FOREIGN.values(), ids=FOREIGN.keys())
def test_get__another_scopes_job_is_not_found(kind, home, foreign):
    """Invariant 10."""
    job = durable.start(kind, scope=home)
    with pytest.raises(JobNotFound):
        durable.get(job.id, scope=foreign)
    assert durable.get(job.id, scope=home).id == job.id


@pytest.mark.django_db
@pytest.mark.parametrize(("home", "foreign"), FOREIGN.values(), ids=FOREIGN.keys())
def test_list_jobs__lists_only_the_exact_scope(kind, home, foreign):
    """Invariant 10."""
    job = durable.start(kind, scope=home)
    theirs, total = durable.list_jobs(scope=foreign)
    assert (theirs, total) == ([], 0)
    ours, total = durable.list_jobs(scope=home)
    assert [j.id for j in ours] == [job.id] and total == 1


@pytest.mark.django_db
@pytest.mark.parametrize(("home", "foreign"), FOREIGN.values(), ids=FOREIGN.keys())
def test_cancel__another_scopes_job_is_not_found_and_untouched(kind, home, foreign):
    """Invariant 10."""
    job = durable.start(kind, scope=home)
    with pytest.raises(JobNotFound):
        durable.cancel(job.id, scope=foreign, by="mallory")
    assert reload(job).cancel_requested_at is None


@pytest.mark.django_db
@pytest.mark.parametrize(("home", "foreign"), FOREIGN.values(), ids=FOREIGN.keys())
def test_redrive__another_scopes_job_is_not_found_and_untouched(kind, home, foreign):
    """Invariant 10 (even with force)."""
    job = _failed_job(home)
    with pytest.raises(JobNotFound):
        durable.redrive(job.id, scope=foreign)
    with pytest.raises(JobNotFound):
        durable.redrive(job.id, scope=foreign, force=True)
    assert reload(job).status == "failed"
    assert durable.redrive(job.id, scope=home).status == "pending"


@pytest.mark.django_db
def test_scope__accepts_a_tenant_id_a_pair_or_a_scope(kind):
    """Invariant 10: every form names the same exact scope."""
    job = durable.start(kind, scope=("tenant-a", "acme"))
    assert durable.get(job.id, scope=Scope(tenant="tenant-a", organization="acme")).id == job.id
    tenant_wide = durable.start(kind, scope="tenant-a")
    assert durable.get(tenant_wide.id, scope=("tenant-a", None)).id == tenant_wide.id
    default = durable.start(kind)
    assert default.tenant_id == "default" and default.organization_id is None
    assert durable.get(str(default.id)).id == default.id


@pytest.mark.django_db
@pytest.mark.parametrize(
    "scope",
    [("tenant-a",), ("tenant-a", ""), ("", None), 42, ("bad tenant", None)],
    ids=["one-element", "empty-organization", "empty-tenant", "number", "bad-tenant"],
)
def test_scope__malformed_scopes_are_refused(kind, scope):
    """Invariants 10 and 23: the empty organization is refused (it is the lock index's null
    sentinel)."""
    with pytest.raises(InvalidInput):
        durable.list_jobs(scope=scope)


@pytest.mark.django_db
def test_get__an_unknown_or_malformed_id(kind):
    """Invariant 23: a malformed id is refused as input, not run as SQL."""
    with pytest.raises(JobNotFound):
        durable.get(uuid.uuid4())
    with pytest.raises(InvalidInput) as caught:
        durable.get("'; DROP TABLE durable_jobs_job; --")
    assert caught.value.field == "job_id"


@pytest.mark.django_db
def test_list_jobs__filters_and_pages_within_the_scope(kind, kinds):
    """Invariant 10: filters narrow within the scope, never beyond it."""
    kinds.add("tests.other")
    for i in range(5):
        durable.start(kind, scope="tenant-a", subject=("report", str(i % 2)))
    durable.start("tests.other", scope="tenant-a")
    durable.start(kind, scope="tenant-b")

    _, total = durable.list_jobs(scope="tenant-a")
    assert total == 6
    by_kind, total = durable.list_jobs(scope="tenant-a", kind=kind)
    assert total == 5 and {j.kind for j in by_kind} == {kind}
    _, total = durable.list_jobs(scope="tenant-a", subject=("report", "1"))
    assert total == 2
    page1, total = durable.list_jobs(scope="tenant-a", page_size=4)
    page2, _ = durable.list_jobs(scope="tenant-a", page_size=4, page=2)
    assert (len(page1), len(page2), total) == (4, 2, 6)
    assert {j.id for j in page1}.isdisjoint({j.id for j in page2})
    _, total = durable.list_jobs(scope="tenant-a", status=durable.Status.PENDING)
    assert total == 6
    with pytest.raises(InvalidInput):
        durable.list_jobs(scope="tenant-a", status="exploded")
