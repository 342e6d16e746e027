"""The process harness cleans up after itself: a test run leaves no log files behind."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.acceptance import harness

pytestmark = [pytest.mark.acceptance]

HELP = ["durable_jobs", "--help"]  # a real manage.py run that needs no database


def stray_logs(app_name: str) -> set[Path]:
    # Only this test's names: other test runs on the machine may be writing logs of their own.
    return set(Path(tempfile.gettempdir()).glob(f"{app_name}-*.log"))


def test_a_stopped_process_leaves_no_log_file_and_keeps_its_output(db_url):
    app_name = f"durable-test-logs-{os.getpid()}"
    process = harness.Process(HELP, db_url=db_url, app_name=app_name)
    assert process.wait(timeout=120) == 0
    process.stop()
    assert not process.log_path.exists()
    assert "usage:" in process.output() and "stats" in process.output()
    assert stray_logs(app_name) == set()


def test_a_run_that_never_stops_its_processes_still_leaves_no_log_file(db_url, tmp_path):
    """The run's log directory goes when the interpreter exits (a killed soak worker, a
    crashed test)."""
    script = (
        "import sys\n"
        "from tests.acceptance import harness\n"
        f"p = harness.Process({HELP!r}, db_url=sys.argv[1], app_name=sys.argv[2])\n"
        "p.wait(timeout=120)\n"
        "print(p.log_path)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_JOBS_KEEP_LOGS"}
    app_name = f"durable-test-forgotten-{os.getpid()}"
    result = subprocess.run(
        [sys.executable, "-c", script, db_url, app_name],
        cwd=harness.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    log_path = Path(result.stdout.strip())
    assert log_path.name.startswith(app_name)
    assert not log_path.exists() and not log_path.parent.exists()
    assert stray_logs(app_name) == set()
