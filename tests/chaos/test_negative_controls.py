"""Negative controls: break a guarantee on purpose in a copy of the project and prove the
suite notices. A control whose tests still pass means the tests could not fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

VARIANTS = {
    "fence predicate removed (lease holder writes check only the status)": (
        "durable_jobs/store.py",
        'LEASE_HELD = f"{_running()} AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s"',
        'LEASE_HELD = f"{_running()}'
        ' AND %(owner)s::text IS NOT NULL AND %(epoch)s::bigint IS NOT NULL"',
        ["tests/integration/test_store_fences.py", "tests/integration/test_executor.py"],
    ),
    "lease computed from the worker's clock": (
        "durable_jobs/store.py",
        """    params = {
        **_lease(lease),
        "processed": processed,""",
        """    params = {
        **_lease(lease),
        "worker_now": __import__("django.utils.timezone", fromlist=["now"]).now(),
        "processed": processed,""",
        ["tests/integration/test_database_clock.py"],
        (
            'SET lease_expires_at = clock_timestamp() + {_ms("ttl_ms")},\n'
            "       heartbeat_at = clock_timestamp(),\n"
            "       processed_count",
            'SET lease_expires_at = %(worker_now)s::timestamptz + {_ms("ttl_ms")},\n'
            "       heartbeat_at = clock_timestamp(),\n       processed_count",
        ),
    ),
    "mirror in its own transaction": (
        "durable_jobs/runtime/executor.py",
        """        with (
            transaction.atomic(using=using)
            if handler.mirror is not None
            else contextlib.nullcontext()
        ):""",
        """        with contextlib.nullcontext():""",
        [
            "tests/integration/test_executor.py::test_a_failing_mirror_rolls_back_the_completion_and_its_own_writes"
        ],
    ),
    "crash re-drives not counted against the poison budget": (
        "durable_jobs/store.py",
        """       redrives_since_commit = redrives_since_commit + 1,
       next_run_at = CASE WHEN {_POISON}""",
        """       redrives_since_commit = redrives_since_commit,
       next_run_at = CASE WHEN {_POISON}""",
        ["tests/integration/test_reconciler.py"],
    ),
}

_IGNORE = shutil.ignore_patterns(
    ".git", ".venv*", ".pgdata", "__pycache__", ".pytest_cache", ".hypothesis", "results", ".venvs"
)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_suite_catches_a_broken_variant(variant, tmp_path):
    path, original, broken, tests, *more = VARIANTS[variant]
    copy = tmp_path / "project"
    shutil.copytree(ROOT, copy, ignore=_IGNORE)
    target = copy / path
    source = target.read_text()
    for old, new in [(original, broken), *more]:
        assert source.count(old) == 1, (
            f"the control no longer matches {path}: update it with the code"
        )
        source = source.replace(old, new)
    target.write_text(source)

    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}  # its own throwaway server
    env["PYTHONPATH"] = str(copy)
    probe = subprocess.run(
        [sys.executable, "-c", "import durable_jobs; print(durable_jobs.__file__)"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
    )
    assert str(copy) in probe.stdout, (
        f"the copy must import its own durable_jobs: {probe.stdout}{probe.stderr}"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = "\n".join(run.stdout.splitlines()[-15:])
    assert run.returncode == 1, (
        f"{variant}: the suite did not catch it (exit {run.returncode})\n{tail}"
    )
    assert " failed" in tail, tail
