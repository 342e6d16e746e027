"""``manage.py durable_demo`` as a new user runs it: what it says about the database, the
final board, the worker it kills mid-import and the import resuming from its checkpoint
with every row exactly once, and a closing hint that works as printed."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from durable_jobs.models import Job
from testproject import database
from testproject.demo.management.commands import durable_demo
from testproject.demo.models import Effect
from tests.acceptance.harness import ROOT

pytestmark = [pytest.mark.acceptance]


def interpreter_of(command: str, cwd: Path) -> str:
    """The file the shell would run for the first word of ``command``."""
    first = shlex.split(command)[0]
    found = shutil.which(first) if os.sep not in first else str(cwd / first)
    return os.path.abspath(found or first)


ROWS = 15


def processes_marked(mark: str) -> list[str]:
    """Processes (not zombies) whose environment carries ``mark``: what the demo started."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, ValueError):  # not a process, ended meanwhile, or not ours to read
            continue
        if mark.encode() in environ.split(b"\0") and state not in ("Z", "X"):
            found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()!r}")
    return found


@pytest.mark.django_db(transaction=True)
def test_demo__kills_its_worker_mid_import_and_the_import_resumes_with_every_row_once(
    db_url,
):
    mark = f"DURABLE_DEMO_TEST_RUN={uuid.uuid4()}"  # inherited by every process it starts
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "DJANGO_SETTINGS_MODULE": "testproject.settings_test",
        mark.split("=")[0]: mark.split("=")[1],
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "durable_demo", "--rows", str(ROWS), "--timeout", "90"],
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

    # The kill, said as it happens and again in the summary, after a checkpoint and before
    # the end; the new worker resumed exactly there.
    live = [line for line in out if line.startswith("demo: killed the worker (SIGKILL) at row ")]
    assert len(live) == 1, result.stdout
    (killed,) = [
        re.fullmatch(
            r"- killed the worker \(SIGKILL\) at row (\d+) of (\d+), and the \d+ processes under it",
            line,
        )
        for line in out
        if line.startswith("- killed the worker")
    ]
    assert killed, result.stdout
    at, total = int(killed[1]), int(killed[2])
    assert total == ROWS and 0 < at < total, killed[0]
    (resumed,) = [line for line in out if line.startswith("- resumed from checkpoint ")]
    assert resumed == (
        f"- resumed from checkpoint {at}: {at} rows were committed before the kill, "
        f"{total - at} written by the new worker"
    ), resumed
    (recovered,) = [line for line in out if line.startswith("- recovered in ")]
    assert "claimed" in recovered, recovered
    assert (
        f"- {ROWS} rows for {ROWS} items, each exactly once (counted in SQL): "
        "no duplicates, none missing"
    ) in out, result.stdout
    # The rows themselves: every item of the import exactly once.
    main = Job.objects.get(kind="demo.import", total_count=ROWS, created_by="demo")
    assert main.status == "completed" and main.processed_count == ROWS
    items = sorted(Effect.objects.filter(job_id=main.id).values_list("item", flat=True))
    assert items == list(range(ROWS))
    # Nothing the demo started outlives it: neither worker, nor any handler process.
    if Path("/proc/self/environ").exists():
        assert processes_marked(mark) == []

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


@pytest.mark.django_db(transaction=True)
def test_tally__a_duplicated_and_a_missing_row_are_one_line_naming_both(db_url):
    """The demo's verdict on the import's rows, counted in SQL: what it exits 1 with."""
    job_id = uuid.uuid4()
    for item, epoch in [(0, 1), (1, 1), (1, 2), (3, 2)]:  # 1 twice, 2 missing
        Effect.objects.create(job_id=job_id, item=item, epoch=epoch)
    counted = durable_demo.tally(job_id, total=4, epoch=1)
    assert counted.problem == (
        "the import's rows are wrong: 4 rows for 4 items, 1 duplicated, 1 missing, 0 out of range"
    )
    assert (counted.before, counted.after, counted.resumed_from) == (2, 2, 1)
    assert durable_demo.tally(job_id, total=2, epoch=1).stray == 1  # item 3 of a 2-item import
