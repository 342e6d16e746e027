"""The worker's control of one slice: never handed to a handler.

A handler gets a ``context.Slice`` (its row, checkpoint, progress, ``should_yield()``,
``fenced()``). Everything else a running slice needs is the worker's and lives here:
the hard time limit and when a cancel was first seen (the supervisor and the handler
process's runner end the slice by them), the heartbeat's reports (lease lost, cancel
requested), and the one-way race between the handler returning and the worker giving up
on it (exactly one of "record the outcome" and "charge the abandonment" may happen).

The two share a ``context.SliceState``: what the heartbeat reports, the handler sees.
``SliceControl`` is a ``heartbeat.Beatable``.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import TYPE_CHECKING

from django.db import DEFAULT_DB_ALIAS

from durable_jobs.runtime.context import Slice, new_state
from durable_jobs.states import Lease

if TYPE_CHECKING:
    from durable_jobs.models import Job
    from durable_jobs.registry import Handler


class SliceControl:
    """One slice as the worker holds it: its handler context, its limits, its end."""

    def __init__(
        self,
        job: Job,
        handler: Handler,
        lease: Lease,
        *,
        stopping: threading.Event | None = None,
        using: str = DEFAULT_DB_ALIAS,
    ) -> None:
        self.row = job
        self.id = job.id
        self.kind = job.kind
        self.lease = lease
        self.handler = handler
        self.using = using
        self.state = new_state(job, handler, stopping)
        self.started_at = time.monotonic()
        #: The hard bound (monotonic): past it the worker ends the slice (time_limit).
        #: Process execution moves it to when the handler process actually started the run.
        self.time_limit_at = self.started_at + handler.time_limit_seconds()
        #: Set by the worker that gave up on this slice (time limit or cancel past its
        #: grace); nothing the handler does afterwards is recorded.
        self.abandoned = False
        #: Set once the handler came back, before its outcome is recorded: from then on
        #: the slice is bookkeeping, which no time limit may abandon.
        self.returned = False
        self._end_lock = threading.Lock()

    @functools.cached_property
    def context(self) -> Slice:
        """What the handler receives, sharing this slice's state. Built on first use: in
        process execution the worker's own control of a slice never needs it (the handler
        process builds its own), and a no-op slice's bookkeeping is counted in microseconds."""
        return Slice(self.row, self.handler, self.lease, using=self.using, state=self.state)

    # --- what the supervisor reads ---
    @property
    def heartbeat_interval(self) -> float:
        return self.handler.setting("HEARTBEAT_INTERVAL")

    @property
    def cancel_seen_at(self) -> float | None:
        """When (monotonic) this slice first learned of a cancel request."""
        return self.state.cancel_seen_at

    @property
    def lease_lost(self) -> bool:
        return self.state.lease_lost

    @property
    def cancel_observed(self) -> bool:
        return self.state.cancel_observed

    def past_time_limit(self, now: float | None = None) -> bool:
        """True once the slice has run past its kind's time limit: the worker ends it."""
        return (time.monotonic() if now is None else now) >= self.time_limit_at

    # --- what the heartbeat (or the handler process's mailbox) reports in ---
    def observe_cancel(self) -> None:
        self.state.observe_cancel()

    def mark_lease_lost(self) -> None:
        self.state.lease_lost = True

    # --- the one-way race between the handler's return and the worker giving up ---
    def abandon(self) -> bool:
        """Give up on this slice (every later fenced write raises ``LeaseLost``).

        False when the handler has already returned: its outcome is being recorded, and
        exactly one of the two — the supervisor's charge or the record — must happen.
        """
        with self._end_lock:
            if self.returned:
                return False
            self.abandoned = True
            self.state.lease_lost = True
            return True

    def handler_returned(self) -> bool:
        """Mark the handler as returned; False when the worker abandoned the slice first."""
        with self._end_lock:
            if self.abandoned:
                return False
            self.returned = True
            return True
