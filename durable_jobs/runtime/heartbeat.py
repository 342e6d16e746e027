"""The background heartbeat: keeps every lease a worker holds alive, one statement per tick.

A handler busy in a long computation never calls anything, yet must keep its lease. So
leases are extended by this thread, on its own database connection, on each kind's
cadence, independent of the handlers. The heartbeat carries the cancel flag back to the
slice and tells it when the lease is gone.

All due leases are extended by one statement (``store.heartbeat_leases``), and a beat
takes along every lease that would fall due within the next quarter of its interval
(``COALESCE``). Leases claimed at scattered moments (long jobs, started whenever) would
otherwise each fall due at a moment of their own: a worker holding 500 of them sent a
statement every few milliseconds, renewing a handful of leases each (the benchmark's
``bookkeeping`` scenario). Beating early only extends a lease sooner, and the leases
taken along then share the beat that took them, so a worker's beats settle at a few
statements per interval whatever it holds.

The statement skips a row locked by a transaction instead of waiting for it: a slice
inside ``fenced()`` holds its own row (the fence extends the lease itself at commit), a
mirror holds its row for as long as user code takes. Waiting behind one such row used to
delay every other lease's beat; forty slow mirrors were enough to let a healthy slice's
lease expire.

What a slice may do with its time is not this thread's business: the worker's
supervisor ends a slice at its time limit (``Worker._supervise``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from django.db import DEFAULT_DB_ALIAS, connections

from durable_jobs import db, faults, store
from durable_jobs.states import Lease

if TYPE_CHECKING:
    from durable_jobs.models import Job

log = logging.getLogger("durable_jobs.heartbeat")

#: A beat also extends the leases due within this share of their interval from now.
COALESCE = 0.25


class Beatable(Protocol):
    """What the heartbeat needs of a lease holder: a running slice's ``SliceControl`` (in
    process execution, the worker's own record of the slice its child runs) or a
    ``HeldLease``.

    Read-only members (properties): ``SliceControl`` computes ``heartbeat_interval`` and
    ``lease_lost``, and its ``id`` is the job's ``UUID``, where ``HeldLease`` keeps plain
    attributes; the heartbeat and the worker's shutdown only read them."""

    @property
    def id(self) -> object: ...

    @property
    def kind(self) -> str: ...

    @property
    def lease(self) -> Lease: ...

    @property
    def heartbeat_interval(self) -> float: ...

    @property
    def lease_lost(self) -> bool: ...

    @property
    def returned(self) -> bool:
        """The slice is over and its end is being written: a lease found gone may be that
        write landing while a beat was in flight, not another claim."""
        ...

    def mark_lease_lost(self) -> None: ...

    def observe_cancel(self) -> None: ...


class HeldLease:
    """A claim the worker holds while not running it: waiting its turn in a slot's batch,
    or finished and waiting for the batch's completion. Its lease is kept alive too."""

    lease_lost = False
    returned = False  # set once its slice finished and waits for the batch's completion

    def __init__(self, job: Job, lease: Lease, heartbeat_interval: float) -> None:
        self.id = job.id
        self.kind = job.kind
        self.lease = lease
        self.heartbeat_interval = heartbeat_interval

    def mark_lease_lost(self) -> None:
        self.lease_lost = True

    def observe_cancel(self) -> None:
        """Seen again by the slice's own first heartbeat, when it runs."""


class Heartbeater:
    def __init__(self, *, using: str = DEFAULT_DB_ALIAS, coalesce: float = COALESCE) -> None:
        self.using = using
        self.coalesce = coalesce
        self._held: dict[int, tuple[Beatable, float]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._sleeping_until = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="durable-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def track(self, holder: Beatable) -> None:
        """``track_all`` of one: a slot tracks each slice it starts, so it is kept short."""
        due = time.monotonic() + holder.heartbeat_interval
        with self._lock:
            self._held[id(holder)] = (holder, due)
            sooner = due < self._sleeping_until
        if sooner:
            self._wake.set()

    def track_all(self, holders: Iterable[Beatable]) -> None:
        """Track every one of ``holders`` (a batch's claims) under one hold of the lock."""
        now = time.monotonic()
        soonest = math.inf
        with self._lock:
            for holder in holders:
                due = now + holder.heartbeat_interval
                self._held[id(holder)] = (holder, due)
                soonest = min(soonest, due)
            sooner = soonest < self._sleeping_until
        if sooner:  # wake the thread only when it would otherwise sleep past this one's beat
            self._wake.set()

    def untrack(self, holder: Beatable) -> None:
        with self._lock:
            self._held.pop(id(holder), None)

    def held(self) -> list[Beatable]:
        """Every lease holder tracked now (for the worker's last act at shutdown)."""
        with self._lock:
            return [holder for holder, _ in self._held.values()]

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        from durable_jobs.runtime import pooling

        pooling.name_connection(self.using)
        try:
            while not self._stop.is_set():
                try:
                    self.beat_due()
                except Exception as error:  # noqa: BLE001 - this thread keeps every lease alive
                    # A dropped connection or a server restart: the leases have slack for a
                    # missed tick; the next one runs on a fresh connection.
                    log.warning("heartbeat tick failed: %s", type(error).__name__)
                    connections[self.using].close()
                self._wake.wait(self._sleep_for())
                self._wake.clear()
        finally:
            connections[self.using].close()

    def _sleep_for(self) -> float:
        with self._lock:
            dues = [due for _, due in self._held.values()]
            wait = max(0.01, min(dues) - time.monotonic()) if dues else 1.0
            self._sleeping_until = time.monotonic() + wait
        return wait

    def beat_due(self) -> None:
        """Extend every lease whose beat is due, and those due within ``coalesce`` of their
        interval, in one statement."""
        now = time.monotonic()
        with self._lock:
            due = [
                holder
                for holder, at in self._held.values()
                if at - self.coalesce * holder.heartbeat_interval <= now
            ]
        if not due:
            return
        faults.point("before_heartbeat")
        leases = [holder.lease for holder in due]
        # A cut connection costs this tick nothing but a reconnect (extending a lease
        # twice is harmless): no warning, no lease left a beat closer to its expiry.
        answers = db.retry_after_a_cut(
            self.using, lambda: store.heartbeat_leases(leases, using=self.using)
        )
        for holder in due:
            answer = answers.get(holder.lease.job_id)
            if answer == store.LOST:
                # A slice whose own end committed while this beat was in flight finds its
                # lease gone too: that is no loss to warn of (the end is logged with its
                # outcome, and a real takeover fails the end's own fence and says so).
                log.log(
                    logging.DEBUG if holder.returned else logging.WARNING,
                    "[%s %s] lease lost: another claim owns the job now",
                    holder.kind,
                    holder.id,
                )
                holder.mark_lease_lost()
            elif answer == store.CANCEL_REQUESTED:
                holder.observe_cancel()
            with self._lock:
                if id(holder) in self._held:
                    self._held[id(holder)] = (holder, time.monotonic() + holder.heartbeat_interval)
