"""``manage.py durable_jobs``: output, JSON, exit codes, and scope for every action."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

import durable_jobs as durable
from tests.acceptance.harness import ROOT
from tests.conftest import database_url
from tests.factories import JobFactory, reload, running

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("durable_jobs", *args, stdout=out)
    return out.getvalue()


def test_list_shows_the_scope_s_jobs_and_filters_them(kinds):
    kinds.add("tests.a")
    kinds.add("tests.b")
    a = durable.start("tests.a", total_count=10)
    durable.start("tests.b")
    other_tenant = durable.start("tests.a", scope="tenant-b")
    text = run("list", "--kind", "tests.a")
    assert str(a.id) in text and str(other_tenant.id) not in text and "1 of 1 job(s)" in text
    data = json.loads(run("list", "--json", "--tenant", "tenant-b"))
    assert data["total"] == 1 and data["jobs"][0]["id"] == str(other_tenant.id)


def test_show_prints_the_whole_row_with_a_progress_bar(kinds):
    job = running(kind="tests.noop", processed_count=5, total_count=10, input={"report": 7})
    text = run("show", str(job.id))
    assert f"tests.noop {job.id}: running" in text
    assert "[###############...............] 5/10 (50%)" in text
    assert '"report": 7' in text and "lease_epoch" in text
    assert json.loads(run("show", str(job.id), "--json"))["processed_count"] == 5


def test_cancel_and_redrive_act_through_the_service(kinds):
    pending = JobFactory()
    assert "cancellation requested" in run("cancel", str(pending.id), "--by", "ops")
    assert reload(pending).cancelled_by == "ops" and reload(pending).status == "pending"
    failed = JobFactory(status="failed", error_code="unrecoverable", error_class="unrecoverable",
                        finished_at=-1, pending_since=None)
    with pytest.raises(CommandError, match="force"):
        run("redrive", str(failed.id))
    assert "pending again" in run("redrive", str(failed.id), "--force")
    assert reload(failed).status == "pending"


def test_a_missing_or_foreign_job_is_an_error_naming_it(kinds):
    foreign = JobFactory(tenant_id="tenant-b")
    for action in ("show", "cancel", "redrive"):
        with pytest.raises(CommandError, match="no job"):
            run(action, str(foreign.id))
    with pytest.raises(CommandError, match="not a job id"):
        run("show", "not-a-uuid")


def test_stats_counts_by_kind_and_status_and_reports_the_backlog(kinds):
    JobFactory(kind="tests.a", pending_since=-120)
    running(kind="tests.a", lease_expires_at=-60)
    JobFactory(kind="tests.b", status="failed", parked_at=-1, finished_at=-1, error_code="poison",
               pending_since=None)
    JobFactory(kind="tests.b", status="completed", finished_at=-30, pending_since=None)
    data = json.loads(run("stats", "--json"))
    assert data["by_kind"] == {"tests.a": {"pending": 1, "running": 1}, "tests.b": {"completed": 1, "failed": 1}}
    assert data["running_expired_leases"] == 1
    assert data["parked_by_reason"] == {"poison": 1}
    assert data["oldest_pending_seconds"] >= 119
    assert data["finished_last"]["1m"]["completed"] == 1
    text = run("stats")
    assert "parked: poison 1" in text and "1 with expired leases" in text


@pytest.mark.django_db(transaction=True)
def test_exit_codes_of_the_command_line(kinds):
    job = JobFactory()
    env = {"DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "testproject.settings_test"}

    def cli(*args):
        import os

        return subprocess.run([sys.executable, str(ROOT / "manage.py"), "durable_jobs", *args], cwd=ROOT,
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=60)

    ok = cli("show", str(job.id))
    assert ok.returncode == 0, ok.stderr
    missing = cli("show", "00000000-0000-0000-0000-000000000000")
    assert missing.returncode == 1 and "no job 00000000-0000-0000-0000-000000000000" in missing.stderr
    refused = cli("redrive", str(job.id))
    assert refused.returncode == 1 and "still live" in refused.stderr
    bad = cli("list", "--status", "bogus")
    assert bad.returncode == 2 and "invalid status value" in bad.stderr
