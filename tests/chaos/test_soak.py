"""The short randomized soak, with a fixed seed, in every run of the suite.

A long soak: ``DURABLE_JOBS_SOAK_SECONDS=600 python -m pytest tests/chaos/test_soak.py``
(or run ``python -m tests.chaos.soak --seed N --seconds S`` directly);
``DURABLE_JOBS_SOAK_SEED`` picks another seed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.chaos.soak import ROOT

pytestmark = pytest.mark.acceptance


def test_soak_with_faults_and_a_postgres_crash_keeps_every_invariant():
    seed = os.environ.get("DURABLE_JOBS_SOAK_SEED", "20261130")
    seconds = os.environ.get("DURABLE_JOBS_SOAK_SECONDS", "30")
    env = {
        k: v for k, v in os.environ.items() if k != "DATABASE_URL"
    }  # its own server: it crashes it
    run = subprocess.run(
        [sys.executable, "-m", "tests.chaos.soak", "--seed", seed, "--seconds", seconds],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=float(seconds) + 400,
    )
    print(run.stdout[-6000:], run.stderr[-3000:])
    assert run.returncode == 0, "the soak found a violation (its report is printed above)"
    assert "postgres crash (-m immediate) and restart" in run.stdout
    assert "FAIL" not in run.stdout
