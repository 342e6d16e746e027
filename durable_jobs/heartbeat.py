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
(invariant 5): it never deadlocks against the worker's own lock and never stalls the
other slices' heartbeats.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from durable_jobs import conf, faults, store
from durable_jobs.context import Slice

log = logging.getLogger("durable_jobs.heartbeat")


class Heartbeater:
    def __init__(self, *, using: str = DEFAULT_DB_ALIAS) -> None:
        self.using = using
        self._slices: dict[int, tuple[Slice, float]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="durable-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def track(self, context: Slice) -> None:
        interval = context.handler.setting("HEARTBEAT_INTERVAL")
        with self._lock:
            self._slices[id(context)] = (context, time.monotonic() + interval)
        self._wake.set()

    def untrack(self, context: Slice) -> None:
        with self._lock:
            self._slices.pop(id(context), None)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._beat_due()
                self._wake.wait(self._sleep_for())
                self._wake.clear()
        finally:
            connections[self.using].close()

    def _sleep_for(self) -> float:
        with self._lock:
            dues = [due for _, due in self._slices.values()]
        if not dues:
            return 1.0
        return max(0.01, min(dues) - time.monotonic())

    def _beat_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [(key, ctx) for key, (ctx, at) in self._slices.items() if at <= now]
        for key, context in due:
            interval = context.handler.setting("HEARTBEAT_INTERVAL")
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

    def _beat(self, context: Slice, *, lock_timeout_ms: int) -> None:
        faults.point("before_heartbeat")
        try:
            cancel = store.heartbeat(context.lease, lock_timeout_ms=lock_timeout_ms, using=self.using)
        except DatabaseError as error:
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
