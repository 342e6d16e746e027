"""Where a worker's claims start reading a queue level: just before the oldest row the
last claim found there, so a pinned horizon cannot make every claim slower than the last.

The default claim reads a queue's deliverable rows in run-time order off a partial index
(``store.DEQUEUE_OPEN``, one scan per priority level). A claimed row leaves its index
entry behind until vacuum removes it, and vacuum removes nothing a transaction older
than the oldest open one could still see: while a session holds a transaction open (a
pinned horizon), a claim walks past the entry of every row claimed since the pin began,
and reads each one's row version to learn it is gone. Measured at 1,000 jobs/s
(docs/performance.rst, "A pinned horizon"): the claim cost 0.5 ms, then 120 ms after
150 s, and then the two cores saturated.

A claim's first row at a level is the oldest claimable row its snapshot saw there, so
the next claim at that level may start a little before it (``store.FLOOR_MARGIN_MS``,
subtracted in the statement: the floors are the database's own run times) and skip what
the claims before it left behind. A row can become deliverable below a floor:

* a start whose transaction committed more than ``FLOOR_MARGIN_MS`` after the row was
  inserted (its run time is the insert's clock), or a start with a run time in the past;
* a job made due again at the run time it had (a dependency wait that ended at once);
* a row a concurrent claim had locked, and then rolled back (a cut connection).

A sweep, a claim without floors, takes those: a worker sweeps at least every
``SWEEP_EVERY`` seconds, and when a sweep is costly (the horizon is pinned), only often
enough that sweeps take ``SWEEP_SHARE`` of one slot's time. Such a row waits for the
next sweep: a second at most on a healthy database, tens of seconds under a long pin.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterable

from durable_jobs.store import Floors

#: The most seconds between two sweeps (claims without floors).
SWEEP_EVERY = 1.0

#: The share of one slot's time sweeps may take: a sweep that took 0.5 s is the last for
#: 25 s.
SWEEP_SHARE = 0.02


class ClaimFloors:
    """One worker's floors, by queue and priority level; its slots share them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._floors: dict[tuple[str, int], datetime.datetime] = {}
        self._sweep_at = 0.0  # time.monotonic() from which the next claim sweeps
        self._sweeping = False  # a slot's sweep is in flight: the others keep their floors

    def for_claim(self) -> Floors | None:
        """The floors a claim starting now reads from, or None: it sweeps (no floors).
        A claim given None must report back through ``swept``, however it ends."""
        with self._lock:
            if not self._sweeping and time.monotonic() >= self._sweep_at:
                self._sweeping = True
                return None
            return [(queue, priority, at) for (queue, priority), at in self._floors.items()]

    def claimed(self, due: Iterable[tuple[str, int, datetime.datetime]]) -> None:
        """Move each level's floor to the oldest run time a claim took there (``due``:
        queue, priority and run time, as the claim returned it, of each unkeyed row)."""
        oldest: dict[tuple[str, int], datetime.datetime] = {}
        for queue, priority, at in due:
            level = (queue, priority)
            if level not in oldest or at < oldest[level]:
                oldest[level] = at
        if oldest:
            with self._lock:
                for level, at in oldest.items():
                    self._floors[level] = at

    def swept(self, seconds: float | None) -> None:
        """A sweep ended: it took ``seconds``, or None when it failed (the next claim
        sweeps again)."""
        with self._lock:
            self._sweeping = False
            if seconds is not None:
                self._sweep_at = time.monotonic() + max(SWEEP_EVERY, seconds / SWEEP_SHARE)
