"""A worker's second connection for batched completions, so that a slot's claim ahead
need not wait for its completion first.

While a batch's last slices run, the slot completes the slices already finished and
claims the next batch (``Worker._claim_ahead``). On the slot's one connection the two
statements ran one after the other, and at one slot the slot's thread spent about half
its time waiting on them: a completion and a claim of 64 rows each take the server about
5 ms, and the handler process ran out of queued slices meanwhile. On two connections the
server runs them side by side (on different job rows: the claim takes only deliverable
rows and skips locked ones), and the slot waits for the longer of the two.

What it buys is a core the slot's thread would otherwise leave idle, so a worker uses it
only when it runs fewer slots than the host has cores (``wanted``). Measured on two
cores, interleaved, 20,000 no-op jobs (docs/performance.rst): one slot 4,127-5,030 jobs/s
against 3,126-3,577 with the two statements in a row, 1.36x; two slots 0.96x and four
0.90x, where the slots already keep both cores busy and the thread only adds hand-offs.

One thread per worker process, shared by its slots, and used only when it is free: a slot
that finds it busy completes on its own connection as before, so no slot ever waits
behind another's completion, and a worker holds one connection more, not one per slot.
The slot waits for the completion before it goes on: when ``_claim_ahead`` returns, its
finished slices are completed, as they were before.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

from django.db import connections

from durable_jobs.runtime import pooling


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the platform says)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def wanted(slots: int, execution: str) -> bool:
    """Whether a worker of ``slots`` slots gains from a completer: only process execution
    claims ahead, and only a core the slots leave idle runs the completion for free."""
    return execution == "process" and slots < usable_cores()


class Pending:
    """A write handed to the completer: ``wait`` until it has run, raising what it raised."""

    def __init__(self, write: Callable[[], None]) -> None:
        self.write = write
        self.done = threading.Event()
        self.error: BaseException | None = None

    def wait(self) -> None:
        self.done.wait()
        if self.error is not None:
            raise self.error


class Completer:
    """Run one write at a time on a thread (and a connection) of its own, when free.

    The thread is a daemon, started at the first write: a worker that stops at once does
    not wait for it, and a worker that never claims ahead never connects it.
    """

    def __init__(self, using: str) -> None:
        self.using = using
        self._free = threading.Lock()  # held from a write's hand-over to its end
        # Guards the three below: no write is queued behind the end-of-work marker.
        self._state = threading.Lock()
        self._work: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def try_submit(self, write: Callable[[], None]) -> Pending | None:
        """Start ``write`` on the completer's thread; None when that thread is busy (or
        closed), and the caller runs it itself."""
        if not self._free.acquire(blocking=False):
            return None
        with self._state:
            if self._closed:
                self._free.release()
                return None
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="durable-completer", daemon=True
                )
                self._thread.start()
            pending = Pending(write)
            self._work.put(pending)
        return pending

    def close(self, *, wait: bool = True) -> None:
        """End the thread, which closes its connection first (Django's connections are
        per thread); ``wait=False`` at a hard stop, which waits for nothing."""
        with self._state:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._work.put(None)
        if thread is not None and wait:
            thread.join()

    def _serve(self) -> None:
        pooling.name_connection(self.using, "completer")
        try:
            while (pending := self._work.get()) is not None:
                ending = False
                try:
                    pending.write()
                except Exception as error:  # noqa: BLE001 - raised on the slot's thread (``wait``)
                    pending.error = error
                except BaseException as error:  # noqa: BLE001 - handed on as well
                    # Meant to end a thread (SystemExit, say): the slot hears it, and the
                    # completer stops serving before its lock is freed, so no later slot
                    # queues a write nobody would run; they complete on their own.
                    pending.error = error
                    ending = True
                    with self._state:
                        self._closed = True
                finally:
                    # Free before the slot hears of it: its next claim ahead may use it.
                    self._free.release()
                    pending.done.set()
                if ending:
                    return
        finally:
            connections.close_all()
