"""What a new user sees from ``manage.py`` in a fresh project: log lines without any
``LOGGING``, and a typo in ``DURABLE_JOBS`` reported by the system checks, not a traceback.

Each test writes a settings module of its own (the test project's, minus ``LOGGING`` or
with a bad ``DURABLE_JOBS``) and runs ``manage.py`` in a subprocess against the test
database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.acceptance.harness import ROOT

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def project(tmp_path, db_url):
    """``project.settings(body)`` writes a settings module; ``project.run(...)`` runs
    manage.py with it."""

    class Project:
        def settings(self, body: str) -> None:
            (tmp_path / "fresh_settings.py").write_text(
                "from testproject.settings_test import *  # noqa\n" + body
            )

        def env(self) -> dict[str, str]:
            env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_JOBS_")}
            return {
                **env,
                "DATABASE_URL": db_url,
                "DJANGO_SETTINGS_MODULE": "fresh_settings",
                "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
            }

        def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, str(ROOT / "manage.py"), *args],
                check=False,
                cwd=ROOT,
                env=env or self.env(),
                capture_output=True,
                text=True,
                timeout=120,
                stdin=subprocess.DEVNULL,
            )

        def start(self, *args: str) -> subprocess.Popen:
            return subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), *args],
                cwd=ROOT,
                env=self.env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                stdin=subprocess.DEVNULL,
            )

    return Project()


NO_LOGGING = "del LOGGING\n"


def test_worker_without_logging_settings__says_on_stderr_that_it_started(project):
    project.settings(NO_LOGGING)
    result = project.run("durable_worker", "--burst")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if " INFO durable_jobs.worker " in line]
    assert any("starting: queues=default concurrency=1" in line for line in lines), result.stderr
    assert any("stopped after 0 slices" in line for line in lines), result.stderr


def test_worker_without_logging_settings__v0_hides_info_lines_and_v2_shows_them(project):
    project.settings(NO_LOGGING)
    quiet = project.run("durable_worker", "--burst", "-v", "0")
    assert quiet.returncode == 0 and "starting" not in quiet.stderr, quiet.stderr
    chatty = project.run("durable_worker", "--burst", "-v", "2")
    assert chatty.returncode == 0 and " INFO durable_jobs.worker " in chatty.stderr, chatty.stderr


def test_worker_with_a_project_handler__logs_through_it_alone(project):
    project.settings(
        "LOGGING = {'version': 1, 'disable_existing_loggers': False,\n"
        "           'formatters': {'own': {'format': 'OWN %(levelname)s %(message)s'}},\n"
        "           'handlers': {'own': {'class': 'logging.StreamHandler', 'formatter': 'own'}},\n"
        "           'root': {'handlers': ['own'], 'level': 'WARNING'}}\n"
    )
    result = project.run("durable_worker", "--burst")
    assert result.returncode == 0, result.stderr
    starting = [line for line in result.stderr.splitlines() if "starting: queues=" in line]
    assert len(starting) == 1 and starting[0].startswith("OWN INFO worker "), result.stderr


def test_reconciler_without_logging_settings__says_it_started_and_stopped(project):
    project.settings(NO_LOGGING)
    process = project.start("durable_reconciler")
    try:
        # The start line is written after Django has set up; give it time on a busy machine.
        deadline = time.monotonic() + 60
        line = ""
        while "reconciler starting" not in line and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line and process.poll() is not None:
                break
        assert "INFO durable_jobs.reconciler reconciler starting: all tenants" in line
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert "reconciler stopped" in err


BAD_KEYS = 'DURABLE_JOBS = {**DURABLE_JOBS, "LEASE_TT": 5, "lease_ttl": 5}\n'


def test_check__a_typo_in_durable_jobs_is_a_system_check_error_with_a_did_you_mean(project):
    project.settings(BAD_KEYS)
    result = project.run("check")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert (
        "(durable_jobs.E001) DURABLE_JOBS has an unknown key 'LEASE_TT'; did you mean 'LEASE_TTL'?"
        in result.stderr
    ), result.stderr
    assert (
        "(durable_jobs.E001) DURABLE_JOBS has an unknown key 'lease_ttl'; did you mean 'LEASE_TTL'?"
        in result.stderr
    ), result.stderr


@pytest.mark.parametrize(
    "command", [["durable_worker", "--burst"], ["durable_reconciler", "--once"]]
)
def test_worker_and_reconciler__refuse_a_typo_in_durable_jobs_without_a_traceback(project, command):
    project.settings(BAD_KEYS)
    result = project.run(*command)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    assert "unknown key 'LEASE_TT'; did you mean 'LEASE_TTL'?" in result.stderr
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, "one line, not the system checks' block"


def test_reconciler__with_checks_skipped_still_refuses_a_typo_in_one_line(project):
    project.settings(BAD_KEYS)
    result = project.run("durable_reconciler", "--once", "--skip-checks")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        (
            "CommandError: DURABLE_JOBS has an unknown key 'LEASE_TT'; did you mean 'LEASE_TTL'?; "
            "DURABLE_JOBS has an unknown key 'lease_ttl'; did you mean 'LEASE_TTL'?"
        ),
    ]


def test_check__a_nonsense_value_is_a_system_check_error_too(project):
    project.settings('DURABLE_JOBS = {"HEARTBEAT_INTERVAL": 30, "LEASE_TTL": 10}\n')
    result = project.run("check")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert (
        "(durable_jobs.E001) DURABLE_JOBS['HEARTBEAT_INTERVAL'] (30.0s) must be below"
        in result.stderr
    )


def test_worker__a_handler_whose_time_limit_is_not_above_its_budget_is_refused_in_one_line(
    project, tmp_path
):
    """A handler's nonsense policy stops the worker before it starts, in one line that
    names the kind and the rule, and ``check`` reports it as durable_jobs.E003."""
    app = tmp_path / "badpolicy"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "durable.py").write_text(
        "import durable_jobs as durable\n\n"
        "@durable.handler('bad.policy', slice_budget=10, time_limit=5)\n"
        "def run(job):\n    return durable.DONE\n"
    )
    project.settings('INSTALLED_APPS = [*INSTALLED_APPS, "badpolicy"]\n')
    result = project.run("durable_worker", "--burst")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "'bad.policy'" in line and "time_limit (5.0s) must exceed slice_budget (10.0s)" in line
    checked = project.run("check")
    assert checked.returncode != 0 and "durable_jobs.E003" in checked.stderr


def test_worker_and_stats__before_migrate_say_run_migrate_in_one_line(project, db_url):
    """A database that was never migrated: one line that says what to do, no traceback."""
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS durable_jobs_never_migrated")
        conn.execute("CREATE DATABASE durable_jobs_never_migrated")
    try:
        fresh_url = db_url.replace(
            db_url.split("?")[0].rsplit("/", 1)[1], "durable_jobs_never_migrated", 1
        )
        project.settings("")
        env_url = fresh_url
        for command in (["durable_worker", "--burst"], ["durable_jobs", "stats"]):
            result = project.run(*command, env={**project.env(), "DATABASE_URL": env_url})
            assert result.returncode != 0, command
            assert "Traceback" not in result.stderr, result.stderr
            [line] = result.stderr.strip().splitlines()
            assert line.endswith("run python manage.py migrate"), line
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS durable_jobs_never_migrated")


def test_demo_and_stats__an_unreachable_database_is_one_line_naming_it(project):
    """A wrong DATABASE_URL: the server's own first line of complaint, and what to check."""
    # The project's own settings (manage.py's default), as a newcomer runs the demo.
    env = {k: v for k, v in project.env().items() if k != "DJANGO_SETTINGS_MODULE"}
    for command in (["durable_demo", "--rows", "10"], ["durable_jobs", "stats"]):
        result = project.run(
            *command, env={**env, "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/nothing"}
        )
        assert result.returncode != 0, command
        assert "Traceback" not in result.stderr, result.stderr
        [line] = result.stderr.strip().splitlines()
        assert "cannot reach database 'default' (nothing at 127.0.0.1:1)" in line, line
        assert "check DATABASES (or DATABASE_URL)" in line
