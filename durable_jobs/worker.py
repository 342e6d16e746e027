"""The worker process: slots that claim and run slices, a heartbeat, a wake-up listener.

Each slot is a thread with its own database connection. A slot claims one due job
(``store.dequeue``), runs its slice, and goes again; when nothing is due it sleeps
until the poll interval passes or a NOTIFY from a committed start wakes it. Polling
alone is correct (a transaction-mode pooler drops LISTEN); the notification only
makes it prompt.

Stopping is two-phase: the first SIGTERM/SIGINT stops claiming and asks running slices
to yield (they are recorded as interrupted, which spends no budget); a second signal,
or the grace period running out, exits at once and leaves the leases to expire.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import secrets
import signal
import socket
import threading
import time
from collections.abc import Sequence

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, connections
from django.db.backends.signals import connection_created

from durable_jobs import conf, faults, store, validation
from durable_jobs.executor import SliceReport, complete_deferred, run_slice
from durable_jobs.heartbeat import Heartbeater, HeldLease
from durable_jobs.states import Lease

log = logging.getLogger("durable_jobs.worker")


def tag_connection(sender, connection, **kwargs) -> None:
    """Name each worker connection after its thread (``<application_name>/durable-slot-0``).

    ``pg_stat_activity`` then tells an operator which connection is a slot, the heartbeat
    or the listener, and a fault-injection test can cut exactly one of them.
    """
    role = threading.current_thread().name
    if role.startswith("durable-"):
        store.set_application_name(f"{os.environ.get('PGAPPNAME', 'durable_jobs')}/{role}"[:63],
                                   using=connection.alias)


#: A slice this short (seconds) lets its slot claim more than one job at a time.
QUICK_SLICE = 0.05


def _lease_of(job, ttl_ms: int) -> Lease:
    return Lease(job_id=job.id, owner=job.lease_owner, epoch=job.lease_epoch, ttl_ms=ttl_ms)


def keep_connection_healthy(using: str) -> None:
    """Drop the slot's connection if a handler left it broken; otherwise keep it.

    Not ``close_old_connections()``: under the default ``CONN_MAX_AGE = 0`` that closes
    the connection on every call, and a worker polling in a loop would reconnect for
    every dequeue. A worker's connections live as long as the process; a connection the
    server or a pooler cuts is replaced on the next error.
    """
    connection = connections[using]
    if connection.connection is None:
        return
    if connection.get_autocommit() != connection.settings_dict["AUTOCOMMIT"]:
        connection.close()  # a handler left a transaction open: do not take chances
    elif connection.errors_occurred:
        if connection.is_usable():
            connection.errors_occurred = False
        else:
            connection.close()


def worker_identity() -> str:
    """``host:pid:token`` — unique per process, so a restarted process never shares one."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:60] or "host"
    return f"{host}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        burst: bool = False,
        reconcile: bool = True,
        using: str = DEFAULT_DB_ALIAS,
    ) -> None:
        settings = conf.get()
        self.queues = list(queues or [settings.DEFAULT_QUEUE])
        self.concurrency = concurrency
        self.burst = burst
        self.reconcile = reconcile
        self.using = using
        self.identity = worker_identity()
        self.stopping = threading.Event()  # phase one: stop claiming, slices yield
        self.hard_stop = threading.Event()  # phase two: leave now
        # Recent slice reports (bounded: a worker runs for weeks) and a running total.
        self.recent: collections.deque[SliceReport] = collections.deque(maxlen=1000)
        self._slices_per_slot = [0] * concurrency
        self._wakes = [threading.Event() for _ in range(concurrency)]
        self._idle = [False] * concurrency
        self._idle_lock = threading.Lock()
        self._heartbeater = Heartbeater(using=using)
        self._previous_handlers: dict[int, object] = {}
        self._failed = False

    # --- signals: handlers only set flags ---
    def _on_signal(self, signum, frame) -> None:
        if self.stopping.is_set():
            self.hard_stop.set()
        else:
            log.info("signal %d: finishing running slices (again to stop at once)", signum)
            self.stopping.set()
        for wake in self._wakes:
            wake.set()

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def restore_signal_handlers(self) -> None:
        for signum, previous in self._previous_handlers.items():
            signal.signal(signum, previous)
        self._previous_handlers.clear()

    # --- the run ---
    def run(self) -> int:
        """Run until stopped (or idle, in burst mode); return the process exit code."""
        settings = conf.get()
        connection_created.connect(tag_connection, dispatch_uid="durable_jobs.tag_connection")
        log.info("worker %s starting: queues=%s concurrency=%d", self.identity, ",".join(self.queues), self.concurrency)
        self._heartbeater.start()
        threads = [threading.Thread(target=self._slot, args=(n,), name=f"durable-slot-{n}", daemon=True)
                   for n in range(self.concurrency)]
        if settings.NOTIFY_CHANNEL and not self.burst:
            threading.Thread(target=self._listen, args=(settings.NOTIFY_CHANNEL,), name="durable-listener",
                             daemon=True).start()
        if self.reconcile:
            threading.Thread(target=self._reconcile_loop, name="durable-reconciler", daemon=True).start()
        for thread in threads:
            thread.start()
        deadline = None
        while any(t.is_alive() for t in threads):
            if not self.stopping.is_set() and not all(t.is_alive() for t in threads):
                # A slot died of something no handler should be able to cause. Exit non-zero
                # so a supervisor restarts the worker rather than trusting a crippled one.
                log.error("worker %s: a slot thread died; stopping", self.identity)
                self.stopping.set()
                self._failed = True
            if not self._heartbeater.alive and not self.stopping.is_set():
                log.error("worker %s: the heartbeat thread died; stopping so leases are not lost silently",
                          self.identity)
                self.stopping.set()
                self._failed = True
            if self.hard_stop.is_set():
                log.warning("worker %s stopping at once; running leases will expire", self.identity)
                return 1
            if self.stopping.is_set() and deadline is None:
                deadline = time.monotonic() + settings.SHUTDOWN_GRACE
            if deadline is not None and time.monotonic() > deadline:
                log.warning("worker %s: slices did not yield within %.0fs", self.identity, settings.SHUTDOWN_GRACE)
                return 1
            for thread in threads:
                thread.join(timeout=0.1)
        self.stopping.set()
        self._heartbeater.stop()
        log.info("worker %s stopped after %d slices", self.identity, self.slices_run)
        return 1 if self._failed else 0

    @property
    def slices_run(self) -> int:
        return sum(self._slices_per_slot)

    def _slot(self, number: int) -> None:
        owner = f"{self.identity}/{number}"
        wake = self._wakes[number]
        settings = conf.get()
        ttl_ms = conf.ms(settings.LEASE_TTL)
        failures = 0
        batch = 1
        try:
            while not self.stopping.is_set():
                try:
                    keep_connection_healthy(self.using)
                    claimed = store.dequeue(self.queues, owner, ttl_ms, limit=batch, using=self.using)
                    failures = 0
                except (DatabaseError, InterfaceError) as error:
                    failures += 1
                    delay = min(5.0, 0.1 * 2 ** failures)
                    log.warning("slot %s: database unavailable (%s); retrying in %.1fs", owner,
                                validation.printable(f"{type(error).__name__}: {error}", limit=300), delay)
                    connections[self.using].close()
                    self.stopping.wait(delay)
                    continue
                if claimed:
                    self._set_idle(number, False)
                    try:
                        quick = self._run_claimed(number, claimed, ttl_ms)
                    except (DatabaseError, InterfaceError) as error:
                        # Between slices (a lease extension or hand-back): the claims left
                        # keep their leases, which expire and are re-driven.
                        log.warning("slot %s: database error between slices (%s)", owner, type(error).__name__)
                        connections[self.using].close()
                        quick = False
                    except Exception:  # noqa: BLE001 - a slot must outlive any one batch
                        log.exception("slot %s: unexpected error between slices", owner)
                        quick = False
                    # Claim several at a time only while slices are quick: the claims wait
                    # their turn holding leases, and a deep queue of no-op-like jobs should
                    # not pay one claim transaction per job.
                    full = len(claimed) == batch
                    batch = min(settings.MAX_PREFETCH, batch * 2) if quick and full else 1 if not quick else batch
                    continue
                if self.burst and self._set_idle(number, True):
                    self.stopping.set()  # every slot found nothing due: the burst is over
                    for other in self._wakes:
                        other.set()  # the sleeping slots need not wait out their poll
                    break
                wake.wait(settings.POLL_INTERVAL)
                wake.clear()
        finally:
            connections[self.using].close()

    def _run_claimed(self, number: int, claimed: list, ttl_ms: int) -> bool:
        """Run a slot's claims in order; return True when every slice was quick.

        A claim that waited long for its turn has its lease extended before it runs; one
        left unstarted at shutdown is handed back at once (released, no budget spent).
        """
        if len(claimed) == 1:
            self._record(number, run_slice(claimed[0], stopping=self.stopping, heartbeater=self._heartbeater,
                                           using=self.using))
            return self.recent[-1].duration < QUICK_SLICE
        # The batch's leases are kept alive while they wait their turn and, once finished,
        # until their batched completion commits: a slow slice in the batch must not let
        # its neighbours' leases expire. Kinds without a mirror are completed together
        # after the batch (one statement, each row on its own epoch fence).
        interval = conf.get().HEARTBEAT_INTERVAL
        held = [HeldLease(job, _lease_of(job, ttl_ms), interval) for job in claimed]
        for entry in held:
            self._heartbeater.track(entry)
        completions: list = []
        quick = True
        try:
            for index, job in enumerate(claimed):
                if self.stopping.is_set() or not quick:
                    # Shutting down, or a slice was slow: hand the unstarted claims back at
                    # once (no budget spent) for another slot to take.
                    for entry in held[index:]:
                        if not entry.lease_lost:
                            store.release_lease(entry.lease, delay_ms=0, using=self.using)
                    return False
                if held[index].lease_lost:
                    continue  # taken over while it waited: not ours to run
                report = run_slice(job, stopping=self.stopping, heartbeater=self._heartbeater,
                                   completions=completions, using=self.using)
                self._record(number, report)
                quick = report.duration < QUICK_SLICE
        finally:
            if completions:
                faults.point("before_batched_completion")
                complete_deferred(completions, using=self.using)
            for entry in held:
                self._heartbeater.untrack(entry)
        return quick

    def _record(self, number: int, report: SliceReport) -> None:
        self.recent.append(report)  # deque.append is thread-safe
        self._slices_per_slot[number] += 1  # each slot writes only its own cell

    def _set_idle(self, number: int, idle: bool) -> bool:
        with self._idle_lock:
            self._idle[number] = idle
            return all(self._idle)

    def _listen(self, channel: str) -> None:
        """Wake every idle slot when a start commits; reconnect with backoff when cut."""
        failures = 0
        while not self.stopping.is_set():
            raw = None
            try:
                connection = connections[self.using]
                params = connection.get_connection_params()
                params["application_name"] = f"{os.environ.get('PGAPPNAME', 'durable_jobs')}/durable-listener"[:63]
                raw = connection.get_new_connection(params)
                raw.autocommit = True
                store.listen(raw, channel)
                failures = 0
                while not self.stopping.is_set():
                    for _ in raw.notifies(timeout=1.0, stop_after=1):
                        for wake in self._wakes:
                            wake.set()
            except Exception as error:  # noqa: BLE001 - the listener must outlive any fault
                failures += 1
                log.info("listener reconnecting after %s",
                         validation.printable(f"{type(error).__name__}: {error}", limit=300))
                self.stopping.wait(min(5.0, 0.2 * 2 ** failures))
            finally:
                if raw is not None:
                    try:
                        raw.close()
                    except Exception:  # noqa: BLE001
                        pass

    def _reconcile_loop(self) -> None:
        # Every worker takes part; only the holder of the leader row runs passes, and it
        # resigns when this worker starts stopping (invariant 14).
        from durable_jobs.reconciler import run_as_leader

        run_as_leader(self.stopping, self.identity, using=self.using)
