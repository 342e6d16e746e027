"""The background heartbeat: keeps every running slice's lease alive on its own connection.

A handler busy in a long computation never calls anything, yet must keep its lease;
a handler genuinely stuck must lose it. So leases are extended by this thread, on its
own database connection, on each kind's cadence, independent of the handler. The
heartbeat carries the cancel flag back to the slice and tells it when the lease is gone.

A slice still running at twice its ``SLICE_BUDGET`` is taken for stuck (an infinite loop,
a call that never returns): the heartbeat stops extending its lease, so the lease
expires, the reconciler re-drives the job, and everything the stuck slice tries to
write afterwards is refused. A handler that needs longer slices says so with its
``slice_budget``.

While a slice is inside ``fenced()`` its transaction holds the job row; the heartbeat
stands aside (the fence extends the lease itself at commit) and, should it race the
fence to the row, gives up after a short lock timeout instead of waiting behind it
(invariant 5): it never deadlocks against the worker's own lock, and a collision delays
the other slices' heartbeats by at most that timeout (a quarter of the interval).
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, connections

from durable_jobs import conf, faults, store
from durable_jobs.context import Slice

log = logging.getLogger("durable_jobs.heartbeat")


class HeldLease:
    """A claim the worker holds while not running it: waiting its turn in a slot's batch,
    or finished and waiting for the batch's completion. Its lease is kept alive too."""

    in_fence = False
    lease_lost = False

    def __init__(self, job, lease, heartbeat_interval: float) -> None:
        self.id = job.id
        self.kind = job.kind
        self.lease = lease
        self.heartbeat_interval = heartbeat_interval

    def overran(self) -> bool:
        return False

    def mark_lease_lost(self) -> None:
        self.lease_lost = True

    def observe_cancel(self) -> None:
        """Seen again by the slice's own first heartbeat, when it runs."""


class Heartbeater:
    def __init__(self, *, using: str = DEFAULT_DB_ALIAS) -> None:
        self.using = using
        self._slices: dict[int, tuple[Slice, float]] = {}
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

    def track(self, context: Slice | HeldLease) -> None:
        due = time.monotonic() + context.heartbeat_interval
        with self._lock:
            self._slices[id(context)] = (context, due)
            sooner = due < self._sleeping_until
        if sooner:  # wake the thread only when it would otherwise sleep past this one's beat
            self._wake.set()

    def untrack(self, context: Slice | HeldLease) -> None:
        with self._lock:
            self._slices.pop(id(context), None)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._beat_due()
                except Exception:  # noqa: BLE001 - this thread keeps every lease alive
                    log.exception("heartbeat pass failed")
                    connections[self.using].close()
                self._wake.wait(self._sleep_for())
                self._wake.clear()
        finally:
            connections[self.using].close()

    def _sleep_for(self) -> float:
        with self._lock:
            dues = [due for _, due in self._slices.values()]
            wait = max(0.01, min(dues) - time.monotonic()) if dues else 1.0
            self._sleeping_until = time.monotonic() + wait
        return wait

    def _beat_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [(key, ctx) for key, (ctx, at) in self._slices.items() if at <= now]
        for key, context in due:
            interval = context.heartbeat_interval
            if context.overran():
                if not context.lease_lost:
                    log.warning("[%s %s] slice overran twice its budget: its lease is left to expire",
                                context.kind, context.id)
                    context.mark_lease_lost()
            elif not context.in_fence:
                self._beat(context, lock_timeout_ms=max(50, conf.ms(interval) // 4))
            with self._lock:
                if key in self._slices:
                    self._slices[key] = (context, time.monotonic() + interval)

    def _beat(self, context: Slice | HeldLease, *, lock_timeout_ms: int) -> None:
        faults.point("before_heartbeat")
        try:
            cancel = store.heartbeat(context.lease, lock_timeout_ms=lock_timeout_ms, using=self.using)
        except (DatabaseError, InterfaceError) as error:
            # A lock timeout (the slot's fence won the race) or a dropped connection: try
            # again next tick on a fresh connection. The lease has slack for a missed beat.
            log.info("heartbeat for job %s skipped: %s", context.id, type(error).__name__)
            connections[self.using].close()
            return
        if cancel is None:
            log.warning("[%s %s] lease lost: another claim owns the job now", context.kind, context.id)
            context.mark_lease_lost()
        elif cancel:
            context.observe_cancel()
