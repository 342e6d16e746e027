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


def analyzed() -> None:
    """Make the planner's statistics this test's own table's.

    ``stats`` counts finished jobs from ANALYZE's statistics by design (exact counts would
    read the history); an earlier test's ANALYZE of thousands of rows would otherwise
    answer for this test's four.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_jobs_job")


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
    failed = JobFactory(
        status="failed",
        error_code="unrecoverable",
        error_class="unrecoverable",
        finished_at=-1,
        pending_since=None,
    )
    with pytest.raises(CommandError, match="force"):
        run("redrive", str(failed.id))
    assert "pending again" in run("redrive", str(failed.id), "--force")
    assert reload(failed).status == "pending"


def test_cancel_of_a_parent_cancels_its_live_children_too(kinds):
    from durable_jobs.models import Job
    from durable_jobs.runtime.reconciler import Reconciler
    from tests.integration.support import parent_with_live_children

    parent, children = parent_with_live_children(kinds, count=2)
    grandchildren = list(Job.objects.filter(parent_id__in=[c.id for c in children]))
    text = run("cancel", str(parent.id), "--by", "ops")
    assert "cancellation requested" in text and "every live job it spawned" in text
    while Reconciler().run_pass().cancelled:
        pass
    tree = [parent, *children, *grandchildren]
    assert [(reload(j).status, reload(j).cancelled_by) for j in tree] == [("cancelled", "ops")] * 5


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
    JobFactory(
        kind="tests.b",
        status="failed",
        parked_at=-1,
        finished_at=-1,
        error_code="poison",
        pending_since=None,
    )
    JobFactory(kind="tests.b", status="completed", finished_at=-30, pending_since=None)
    analyzed()
    data = json.loads(run("stats", "--json"))
    assert data["by_kind"] == {
        "tests.a": {"pending": 1, "running": 1},
        "tests.b": {"completed": 1, "failed": 1},
    }
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

        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "durable_jobs", *args],
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    ok = cli("show", str(job.id))
    assert ok.returncode == 0, ok.stderr
    missing = cli("show", "00000000-0000-0000-0000-000000000000")
    assert (
        missing.returncode == 1 and "no job 00000000-0000-0000-0000-000000000000" in missing.stderr
    )
    refused = cli("redrive", str(job.id))
    assert refused.returncode == 1 and "still live" in refused.stderr
    bad = cli("list", "--status", "bogus")
    assert bad.returncode == 2 and "invalid status value" in bad.stderr


def test_json_is_accepted_before_or_after_the_action(kinds):
    JobFactory(kind="tests.a")
    for args in (["--json", "stats"], ["stats", "--json"], ["--json", "list"], ["list", "--json"]):
        data = json.loads(run(*args))
        assert isinstance(data, dict), args
    assert json.loads(run("--json", "stats"))["by_kind"] == {"tests.a": {"pending": 1}}
    assert json.loads(run("--json", "list"))["total"] == 1


def test_stats_counts_only_the_scope_it_is_given(kinds):
    JobFactory(kind="tests.wide")
    JobFactory(kind="tests.org", organization_id="org-x")
    JobFactory(kind="tests.other", tenant_id="tenant-b")
    analyzed()

    def counted(*args):
        return set(json.loads(run("stats", "--json", *args))["by_kind"])

    assert counted() == {"tests.wide"}
    assert counted("--organization", "org-x") == {"tests.org"}
    assert counted("--tenant", "tenant-b") == {"tests.other"}
    assert counted("--tenant", "tenant-b", "--organization", "org-x") == set()
    assert counted("--all-tenants") == {"tests.wide", "tests.org", "tests.other"}
    assert json.loads(run("stats", "--json", "--organization", "org-x"))["scope"] == {
        "tenant": "default",
        "organization": "org-x",
    }
    assert run("stats", "--organization", "org-x").startswith(
        "scope: tenant default, organization org-x\n"
    )
    with pytest.raises(CommandError, match="--all-tenants counts every tenant"):
        run("stats", "--all-tenants", "--tenant", "tenant-b")


@pytest.mark.django_db(transaction=True)
def test_errors_under_json_are_one_json_object_on_stderr_with_the_exit_status(kinds):
    job = JobFactory()
    env = {"DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "testproject.settings_test"}

    def cli(*args):
        import os

        result = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "durable_jobs", *args],
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.stdout == "", result.stdout
        return result.returncode, json.loads(result.stderr)

    missing = "00000000-0000-0000-0000-000000000000"
    assert cli("--json", "show", missing) == (
        1,
        {"error": f"no job {missing} in this scope", "code": "job_not_found", "exit_status": 1},
    )
    status, error = cli("redrive", str(job.id), "--json")
    assert (status, error["code"], error["exit_status"]) == (
        1,
        "wrong_state",
        1,
    ) and "still live" in error["error"]
    status, error = cli("--json", "show", "not-a-uuid")
    assert (status, error["code"], error["exit_status"]) == (2, "invalid_input", 2)
    status, error = cli("list", "--status", "bogus", "--json")
    assert (status, error["code"], error["exit_status"]) == (2, "bad_arguments", 2)
    assert "invalid status value: 'bogus'" in error["error"]
    status, error = cli("--json", "stats", "--organization", "has space")
    assert (status, error["code"]) == (2, "bad_arguments") and "--organization" in error["error"]
    status, error = cli("--json")
    assert (status, error["code"]) == (2, "bad_arguments") and "action" in error["error"]
    status, error = cli("--json", "stats", "--all-tenants", "--tenant", "x")
    assert (status, error["code"]) == (2, "bad_arguments")


@pytest.mark.django_db(transaction=True)
def test_json_stats_from_the_command_line_before_the_action(kinds):
    JobFactory(kind="tests.a", organization_id="org-x")
    env = {"DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "testproject.settings_test"}
    import os

    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "durable_jobs",
            "--json",
            "stats",
            "--organization",
            "org-x",
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["by_kind"] == {"tests.a": {"pending": 1}}
