"""Named crash and pause points for the fault-injection suite (tests only).

Inert unless the environment variable ``DURABLE_JOBS_FAULTS`` is set when the process
starts: then ``point(name)`` is one truthiness test of an empty dict. A test sets, for
example::

    DURABLE_JOBS_FAULTS="domain_before_commit=kill@3,before_heartbeat=pause:5"

``kill`` sends SIGKILL, ``stop`` SIGSTOP, to the calling thread (the whole process ends
or stops before that thread runs past the point); ``pause:S`` sleeps S seconds on the
calling thread. ``@N`` fires on the N-th time the point is reached (default:
the first), ``@*`` every time.

Points: ``claim_returned`` (a slot's dequeue came back with jobs, none started yet),
``after_claim``, ``slice_starting`` (the worker holds a slice's control, which its
heartbeat does not watch yet, and its handler has not started),
``domain_before_commit``, ``domain_after_commit``,
``terminal_inside``, ``terminal_after``, ``reconciler_between``, ``before_heartbeat``,
``before_batched_completion``, ``answers_readable`` (a slot's thread saw its handler
process's pipe readable and has not read it yet), ``zygote_ready`` (the zygote, once
Django is set up), ``scheduler_between`` (a tick planned, its transaction not begun),
``scheduler_inside`` (a tick's schedule advanced and its job started, not committed),
``hand_back_begun`` (a stopping worker's main thread has begun handing every lease back
and has not read its slots yet).
"""

from __future__ import annotations

import os
import signal
import threading
import time

POINTS = frozenset(
    {
        "claim_returned",
        "after_claim",
        "slice_starting",
        "domain_before_commit",
        "domain_after_commit",
        "terminal_inside",
        "terminal_after",
        "reconciler_between",
        "before_heartbeat",
        "before_batched_completion",
        "answers_readable",
        "zygote_ready",
        "scheduler_between",
        "scheduler_inside",
        "hand_back_begun",
    }
)


def _parse(raw: str) -> dict[str, tuple[str, float, str]]:
    plan = {}
    for entry in filter(None, (part.strip() for part in raw.split(","))):
        name, _, spec = entry.partition("=")
        spec, _, when = spec.partition("@")
        action, _, arg = spec.partition(":")
        if name not in POINTS or action not in ("kill", "stop", "pause"):
            raise ValueError(f"DURABLE_JOBS_FAULTS: cannot read {entry!r}")
        plan[name] = (action, float(arg or 0), when or "1")
    return plan


_PLAN = _parse(os.environ.get("DURABLE_JOBS_FAULTS", ""))
_hits: dict[str, int] = {}
_lock = threading.Lock()


def point(name: str) -> None:
    """Fire the fault planned for ``name``, if any."""
    if not _PLAN or name not in _PLAN:
        return
    action, arg, when = _PLAN[name]
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        count = _hits[name]
    if when != "*" and count != int(when):
        return
    # stderr, unbuffered: the test reads it to know the fault fired.
    os.write(2, f"FAULT {name} {action} (hit {count}) pid={os.getpid()}\n".encode())
    if action in ("kill", "stop"):
        # Sent to this thread, though either signal ends or stops the whole process: a
        # signal sent to the process is taken by whichever thread the kernel picks, and
        # until that thread gets a CPU this one runs on past the point. A "stopped"
        # scheduler went on to fire the tick it was meant to stop before.
        sig = signal.SIGKILL if action == "kill" else signal.SIGSTOP
        signal.pthread_kill(threading.get_ident(), sig)
    else:
        time.sleep(arg)
