"""Invariant 1, one home for writes: the ORM refuses to write job rows, no module but
``store.py`` holds SQL that writes the app's tables, and raw SQL runs only in the store and
the three homes of reads and connection plumbing (``db.py``, ``reads.py``,
``console/queries.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import durable_jobs
from durable_jobs.models import Job, ReadOnlyJobRow
from tests.factories import JobFactory, reload
from tests.integration.support import snapshot

PACKAGE = Path(durable_jobs.__file__).resolve().parent

# SQL that writes one of the app's tables (the job table, task attempts, the leader row),
# spelled literally or through a *TABLE constant.
_TABLE = r'(?:"?durable_jobs_\w+"?|\{(?:\w+\.)?\w*TABLE\})'
WRITE_SQL = re.compile(
    rf"\b(?:UPDATE|INSERT\s+INTO|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?)\s+{_TABLE}", re.IGNORECASE
)
# A raw cursor or statement outside the store. (``connections[alias]`` itself is allowed:
# the runtime opens, closes and inspects connections; it runs no SQL through them.)
# ``super().execute(`` is a management command's BaseCommand.execute, not SQL.
RAW_SQL = re.compile(
    r"\.cursor\(|(?<!super\(\))\.execute\(|\.executemany\(|\bRawSQL\(|\.raw\(|\.extra\("
)


#: Where raw SQL may run besides the store: the database seam (session settings, the
#: clock, LISTEN/NOTIFY, the row plumbing) and the two homes of reads.
READ_HOMES = {"db.py", "reads.py", "console/queries.py"}


def _modules_running_no_sql() -> list[Path]:
    return [
        p for p in _modules_outside_the_store() if str(p.relative_to(PACKAGE)) not in READ_HOMES
    ]


def _modules_outside_the_store() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if path.name != "store.py" and "migrations" not in path.relative_to(PACKAGE).parts
    )


# ---------------------------------------------------------------------------------------
# The model refuses
# ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_job_save__is_refused_and_writes_nothing():
    """Invariant 1."""
    job = JobFactory()
    before = snapshot(job)
    job.status = "completed"
    with pytest.raises(ReadOnlyJobRow):
        job.save()
    with pytest.raises(ReadOnlyJobRow):
        job.save(update_fields=["status"])
    assert snapshot(job) == before


@pytest.mark.django_db
def test_job_delete__is_refused():
    """Invariant 1."""
    job = JobFactory()
    with pytest.raises(ReadOnlyJobRow):
        job.delete()
    assert reload(job) is not None


@pytest.mark.django_db
@pytest.mark.parametrize(
    "write",
    [
        lambda: Job.objects.update(status="completed"),
        lambda: Job.objects.filter(status="pending").update(status="completed"),
        lambda: Job.objects.all().delete(),
        lambda: Job.objects.filter(status="pending").delete(),
        lambda: Job.objects.create(kind="x", tenant_id="t", status="pending", queue_name="q"),
        lambda: Job.objects.bulk_create(
            [Job(kind="x", tenant_id="t", status="pending", queue_name="q")]
        ),
        lambda: Job.objects.bulk_update(list(Job.objects.all()), ["status"]),
        lambda: Job.objects.get_or_create(kind="y", defaults={"tenant_id": "t"}),
        lambda: Job.objects.update_or_create(kind="y", defaults={"status": "failed"}),
    ],
    ids=[
        "update",
        "filter-update",
        "delete",
        "filter-delete",
        "create",
        "bulk_create",
        "bulk_update",
        "get_or_create",
        "update_or_create",
    ],
)
def test_job_queryset_writers__are_refused(write):
    """Invariant 1: every bulk writer of the manager refuses too."""
    job = JobFactory()
    before = snapshot(job)
    with pytest.raises(ReadOnlyJobRow):
        write()
    assert snapshot(job) == before
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_job_reads__still_work_through_the_orm():
    """Invariant 1 refuses writes only; the admin and reports read through the ORM."""
    job = JobFactory(priority=3)
    assert Job.objects.filter(priority=3).values_list("id", flat=True).get() == job.id
    assert Job.objects.using("default").get(id=job.id).is_live


@pytest.mark.django_db
def test_job_base_manager__refuses_writes_too():
    """Invariant 1: Django's base manager must refuse like the default one."""
    job = JobFactory()
    with pytest.raises(ReadOnlyJobRow):
        Job._base_manager.filter(id=job.id).update(status="completed")
    assert reload(job).status == "pending"


# ---------------------------------------------------------------------------------------
# Static: no other module writes the job table
# ---------------------------------------------------------------------------------------


def test_store__is_where_the_writing_sql_lives():
    """Invariant 1: the scanner finds what it looks for (so its silence below means something)."""
    source = (PACKAGE / "store.py").read_text()
    found = {m.group(0).split()[0].upper() for m in WRITE_SQL.finditer(source)}
    assert {"UPDATE", "INSERT"} <= found
    assert RAW_SQL.search(source)
    assert RAW_SQL.search('connection.cursor().execute("SELECT 1")') and RAW_SQL.search(
        "cur.execute(sql)"
    )
    assert not RAW_SQL.search("return super().execute(*args, **options)")
    assert WRITE_SQL.search('cursor.execute("update durable_jobs_job set status = 1")')
    assert WRITE_SQL.search('f"DELETE FROM {models.TABLE} WHERE"')


@pytest.mark.parametrize(
    "path", _modules_outside_the_store(), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_module__holds_no_sql_that_writes_the_job_table(path):
    """Invariant 1: every writing statement lives in store.py."""
    source = path.read_text()
    assert not WRITE_SQL.search(source), f"{path.name} writes the job table outside store.py"


@pytest.mark.parametrize(
    "path", _modules_running_no_sql(), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_module__runs_no_raw_sql(path):
    """Invariant 1 / STYLE habit 1: SQL runs through the store and the read homes only."""
    source = path.read_text()
    match = RAW_SQL.search(source)
    assert match is None, (
        f"{path.name} runs SQL itself: {source[max(0, match.start() - 60) : match.end() + 40]!r}"
    )


def test_the_scan__covers_the_package():
    """Invariant 1: the scan sees the whole package but the store and migrations."""
    names = {p.name for p in _modules_outside_the_store()}
    assert {"service.py", "models.py", "__init__.py"} <= names
    assert "store.py" not in names
    assert not any("migrations" in p.parts for p in _modules_outside_the_store())
