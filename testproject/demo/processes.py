"""The demo's worker processes and everything they start, found and ended by pid.

A worker runs its handlers in child processes (a zygote and the handlers it forks), each
in a session of its own so the worker can kill one handler's whole group. Killing the
worker's own process group would therefore miss them: the demo finds them by walking
the parent links instead, and checks afterwards that none of them is still running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

PROC = Path("/proc")


class KillFailed(RuntimeError):
    """A process of a killed worker is still running."""


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, children before grandchildren."""
    parents = _parents()
    found: list[int] = []
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found += sorted(frontier)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    if not (PROC / "self" / "stat").exists():  # no /proc (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:  # ended, and reaped
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def kill_tree(worker: subprocess.Popen) -> int:
    """SIGKILL ``worker`` and every process below it; return how many were below it.

    The worker is stopped first, so it asks for no new handler process while its tree
    is read. Raises ``KillFailed`` if one of them is still running afterwards.
    """
    try:
        os.kill(worker.pid, signal.SIGSTOP)
    except ProcessLookupError:
        pass
    tree = descendants(worker.pid)
    for pid in [worker.pid, *tree]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    worker.wait()
    left = wait_gone(tree, within=10.0)
    if left:
        raise KillFailed(f"processes {left} of the killed worker are still running after SIGKILL")
    return len(tree)


def stop(worker: subprocess.Popen, grace: float = 15.0) -> None:
    """End ``worker`` gracefully (SIGTERM), and whatever it started with it.

    A worker's handler processes end when their worker does; any that has not within a
    few seconds is killed, so nothing the demo started outlives it.
    """
    if worker.poll() is not None:
        return
    tree = descendants(worker.pid)
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
    for pid in wait_gone(tree, within=5.0):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_gone(pids: list[int], within: float) -> list[int]:
    """Wait up to ``within`` seconds for ``pids`` to end; return those still running."""
    deadline = time.monotonic() + within
    left = [pid for pid in pids if alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [pid for pid in left if alive(pid)]
    return left


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process: from /proc, or from ``ps`` where there is none."""
    if (PROC / "self" / "stat").exists():
        parents = {}
        for entry in PROC.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended while we looked
                continue
            # The name, in parentheses, may hold spaces: the fields after it are plain.
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
        return parents
    listing = subprocess.run(
        ["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True, text=True, check=True
    ).stdout
    return {int(pid): int(ppid) for pid, ppid in (line.split() for line in listing.splitlines())}
