"""Fault-injection fixtures: the recorded history, and the invariant check after every scenario."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.acceptance.conftest import processes  # noqa: F401  (re-exported fixture)
from tests.chaos import history


@pytest.fixture
def recorded(transactional_db):
    """Record every job-row change; after the test, assert every invariant held."""
    history.install()
    budgets = {"max_redrives": 5, "max_mirror": 5}
    holder = {"skip": ()}
    yield type(
        "Recorded",
        (),
        {"budgets": budgets, "holder": holder, "events": staticmethod(history.events)},
    )()
    history.uninstall()


def assert_invariants(recorded, fleet, **kwargs) -> None:
    """Stop every process of ``fleet`` (the ``processes`` fixture), then run the checker;
    fail listing every violated invariant."""
    for process in fleet.started:
        process.stop()
    assert not [p for p in fleet.started if p.popen.poll() is None]
    children = subprocess.run(
        ["pgrep", "-P", str(os.getpid())], capture_output=True, text=True
    ).stdout.split()
    live_children = [
        pid
        for pid in children
        if os.path.exists(f"/proc/{pid}")
        and "zombie" not in open(f"/proc/{pid}/status").read().lower()
    ]
    assert not live_children, f"child processes left behind: {live_children}"
    history.settle()
    failures = history.check(**recorded.budgets, **kwargs)
    assert not failures, "invariants violated:\n" + "\n".join(
        f"- {name}: {rows}" for name, rows in failures.items()
    )
