"""``manage.py durable_demo`` as a new user runs it: what it says about the database, the
final board, and a closing hint that works as printed."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testproject import database
from testproject.demo.management.commands import durable_demo
from tests.acceptance.harness import ROOT

pytestmark = [pytest.mark.acceptance]


def interpreter_of(command: str, cwd: Path) -> str:
    """The file the shell would run for the first word of ``command``."""
    first = shlex.split(command)[0]
    found = shutil.which(first) if os.sep not in first else str(cwd / first)
    return os.path.abspath(found or first)


@pytest.mark.django_db(transaction=True)
def test_demo__says_where_the_database_lives_prints_the_final_board_once_and_a_hint_that_runs(
    db_url,
):
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "DJANGO_SETTINGS_MODULE": "testproject.settings_test",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "durable_demo", "--rows", "6", "--timeout", "90"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()

    (db_line,) = [line for line in out if line.startswith("database: ")]
    if os.environ.get(database.EMBEDDED_ENV):  # the test run's own throwaway server
        assert db_line.startswith("database: embedded PostgreSQL 1"), db_line
        assert "data in /" in db_line and "deleted when this run ends" in db_line, db_line
    else:
        assert "(from DATABASE_URL)" in db_line, db_line

    # Without a terminal: every board under its own "-- 1.2s" header, the last one once.
    headers = [n for n, line in enumerate(out) if re.match(r"^-- +\d+\.\ds$", line)]
    boards = [line for line in out if line.startswith("   ")]
    assert headers and len(boards) == 4 * len(headers), result.stdout
    assert out[headers[-1] + 1 : headers[-1] + 5] == boards[-4:]
    assert boards[-4:] != boards[-8:-4], "the final board is printed twice"

    (hint,) = [line for line in out if line.startswith("Next: ")]
    stats = hint.removeprefix("Next: ").split("   |   ")[0]
    assert stats.endswith(" manage.py durable_jobs stats"), hint
    assert interpreter_of(stats, ROOT) == os.path.abspath(sys.executable), hint
    ran = subprocess.run(
        shlex.split(stats),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0 and "completed" in ran.stdout, ran.stderr


def test_hint__names_the_venv_interpreter_as_the_readme_runs_it(monkeypatch):
    """README: ``.venv/bin/python manage.py durable_demo`` from the clone, no activated venv."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "executable", str(ROOT / ".venv" / "bin" / "python"))
    monkeypatch.setenv("PATH", "/nowhere")
    assert durable_demo.manage_py() == ".venv/bin/python manage.py"


def test_hint__names_plain_python_when_it_is_this_interpreter_on_path(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    assert durable_demo.manage_py() == f"{Path(sys.executable).name} {ROOT / 'manage.py'}"


def test_describe__a_server_of_one_s_own_is_named_by_host_and_database(monkeypatch):
    monkeypatch.delenv(database.EMBEDDED_ENV, raising=False)
    text = database.describe({"HOST": "db.internal", "PORT": "5433", "NAME": "jobs"}, "17.2")
    assert text == "PostgreSQL 17.2 on db.internal:5433, database jobs (from DATABASE_URL)"
