"""The worker process: slots that claim and run slices, a heartbeat, a wake-up listener,
and (unless told not to) the reconciler, run by one leader across the fleet.

Each slot is a thread with its own database connection. A slot claims one due job
(``store.dequeue``), runs its slice, and goes again; when nothing is due it sleeps
until the poll interval passes or a NOTIFY from a committed start wakes it. Polling
alone is correct (a transaction-mode pooler drops LISTEN); the notification only
makes it prompt.

Handlers run in a child process per slot (``EXECUTION = "process"``, see ``runner``)
or on the slot thread (``"thread"``). A thread cannot be stopped from outside, so in
thread execution the main thread supervises the slots: a slice past its time limit,
or deaf to a cancel past its grace, is charged and abandoned, and a fresh thread takes
the slot over so the worker keeps its capacity; past ``MAX_ABANDONED_THREADS`` the
worker exits non-zero for its supervisor to restart it.

Stopping is two-phase: the first SIGTERM/SIGINT stops claiming and asks running slices
to yield (recorded as interrupted, which spends no budget); a second signal, or the
grace period running out, ends the slices still running (killing their processes in
process execution), hands their leases and every unstarted claim back uncharged, and
exits.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, connections

from durable_jobs import conf, db, faults, reads, registry
from durable_jobs.runtime import completer, intake, pooling, zygote
from durable_jobs.runtime.control import SliceControl
from durable_jobs.runtime.executor import (
    DeferredCompletion,
    run_slice,
)
from durable_jobs.runtime.heartbeat import Heartbeater, HeldLease
from durable_jobs.runtime.outage import OutageLog, one_line
from durable_jobs.runtime.pacing import (
    PREFETCH_WINDOW,
    QUICK_SLICE,
    Pace,
    claim_lead,
    fits_in_window,
    next_batch,
    prefetch_ceiling,
    slice_seconds,
)
from durable_jobs.runtime.registration import Registration
from durable_jobs.runtime.runner import ChildRunner
from durable_jobs.runtime.supervision import Supervision
from durable_jobs.runtime.wakeups import WakeUps
from durable_jobs.states import VERDICT_CODES, Lease
from durable_jobs.waits import gate as waits_gate

if TYPE_CHECKING:
    from types import FrameType

    from durable_jobs.models import Job
    from durable_jobs.runtime.invoke import Ran

    #: What ``signal.signal`` takes and returns (typeshed's private ``signal._HANDLER``).
    _SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

log = logging.getLogger("durable_jobs.worker")


def _goes_straight_to_its_handler(job: Job, ttl_ms: int) -> bool:
    """True when ``run_slice`` would hand ``job`` to its handler with nothing written first,
    and its outcome is recorded without user code (no mirror): such a job may be queued
    in the slot's child behind the one running there (send-ahead; ``ChildRunner`` takes
    back what it has not started). Measured (the mechanism trial, docs/performance.rst):
    without it 1 ms slices drain at 0.52-0.56 and 20 ms at 0.88-0.96 of the rate with it
    at 1 and 4 slots, with 13-33 % more worker CPU per 1 ms job; nothing at 16 slots on
    2 cores or from 500 ms up."""
    handler = registry.get(job.kind)
    return (
        handler is not None
        and handler.mirror is None
        and job.error_code not in VERDICT_CODES
        and not waits_gate.pending(job)
        and conf.ms(handler.setting("LEASE_TTL")) == ttl_ms
    )


def _lease_of(job: Job, ttl_ms: int) -> Lease:
    assert job.lease_owner is not None, "a claimed row has its owner"  # store.dequeue sets it
    return Lease(job_id=job.id, owner=job.lease_owner, epoch=job.lease_epoch, ttl_ms=ttl_ms)


def worker_identity() -> str:
    """``host:pid:token`` — unique per process, so a restarted process never shares one."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:60] or "host"
    return f"{host}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclasses.dataclass(eq=False)
class SlotState:
    """One slot thread and what it holds now, shared with the supervising main thread."""

    number: int
    generation: int
    owner: str
    thread: threading.Thread | None = None
    current: SliceControl | None = None  # the slice running now
    waiting: list[HeldLease] = dataclasses.field(default_factory=list)  # claims not started yet
    finished: list[HeldLease] = dataclasses.field(
        default_factory=list
    )  # deferred, not yet completed
    completions: list[DeferredCompletion] = dataclasses.field(default_factory=list)
    abandoned: bool = False
    runner: ChildRunner | None = None  # process execution: the slot's handler process
    batch: int = (
        1  # how many jobs it claims at once: grows while its batches are quick (next_batch)
    )
    slice_mean: float | None = None  # the last batch's mean slice time (fits_in_window)
    ahead_seconds: float | None = None  # the last claim ahead's round trip (claim_lead)

    @property
    def started_thread(self) -> threading.Thread:
        """``thread``, which ``Worker._start_slot`` sets before the slot joins ``_slots``."""
        assert self.thread is not None, f"slot {self.owner} has no thread"
        return self.thread


class Worker(Supervision, WakeUps):
    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        burst: bool = False,
        wait_for_retries: bool = False,
        reconcile: bool = True,
        execution: str | None = None,
        using: str = DEFAULT_DB_ALIAS,
    ) -> None:
        settings = conf.get()
        self.queues = list(queues or [settings.DEFAULT_QUEUE])
        self.concurrency = concurrency
        self.burst = burst
        #: A burst run goes on while jobs it could run wait out a retry backoff.
        self.wait_for_retries = wait_for_retries
        self.reconcile = reconcile
        self.execution = execution or settings.EXECUTION
        if self.execution not in conf.EXECUTION_MODES:
            raise ValueError(
                f"execution must be one of {conf.EXECUTION_MODES}, got {self.execution!r}"
            )
        self.using = using
        self.identity = worker_identity()
        self.stopping = threading.Event()  # phase one: stop claiming, slices yield
        self.hard_stop = threading.Event()  # phase two: leave now
        self._handing_back = threading.Event()
        self._slices_per_slot = [0] * concurrency
        self._wakes = [threading.Event() for _ in range(concurrency)]
        self._idle = [False] * concurrency
        self._claiming = [False] * concurrency
        self._idle_lock = threading.Lock()
        self._sleepers: dict[int, None] = {}  # slots asleep waiting for work, oldest first
        self._batch_hints: dict[int, int] = {}  # guarded by _idle_lock
        self._missed_wakes = 0  # wake-ups that found no slot asleep (guarded by _idle_lock)
        self._empty_claims = 0  # claims in a row that found nothing (guarded by _idle_lock)
        self._heartbeater = Heartbeater(using=using)
        self._intake = intake.Intake(self.queues, using=using)
        # Made by ``run`` when it pays (``completer.wanted``), which closes it: a worker
        # driven any other way completes on its slots' own connections.
        self._completer: completer.Completer | None = None
        self._outage = OutageLog(log, self.identity)
        # Wait conditions: this worker's bound on checks running at once, and the moments
        # (monotonic) at which jobs it held become due, so an idle slot never sleeps past
        # an `after` instant it knows of (the poll is the floor, not the promptness).
        self.check_slots = waits_gate.CheckSlots(settings.WAIT_MAX_CONCURRENT_CHECKS)
        self._due_soon: list[float] = []
        self._due_lock = threading.Lock()
        self._slots: list[SlotState] = []
        self._unpaid: list[
            tuple[SliceControl, str]
        ] = []  # abandoned slices whose charge has not landed yet
        self.abandoned_threads = 0
        self._previous_handlers: dict[int, _SignalHandler] = {}
        self._failed = False
        self._schedules_changed = threading.Event()

    # --- signals: handlers only set flags ---
    def stop(self) -> None:
        """Ask the worker to stop, as a first SIGTERM does; a second call stops it at once.

        For a worker run in a thread of its own (embedded, or a test), where no signal
        reaches it: running slices yield, unstarted claims are handed back.
        """
        if self.stopping.is_set():
            self.hard_stop.set()
        self.stopping.set()
        self._wake_all()  # idle slots need not wait out their poll
        self._schedules_changed.set()  # nor the scheduler its next tick

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self.stopping.is_set():
            log.info("signal %d: finishing running slices (again to stop at once)", signum)
        self.stop()

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
        log.info(
            "worker %s starting: queues=%s concurrency=%d execution=%s reconcile=%s",
            self.identity,
            ",".join(self.queues),
            self.concurrency,
            self.execution,
            "on" if self.reconcile else "off",
        )
        self._heartbeater.start()
        registration = Registration(
            self.identity,
            queues=self.queues,
            slots=self.concurrency,
            execution=self.execution,
            using=self.using,
        )
        registration.start()
        if settings.NOTIFY_CHANNEL and not self.burst:
            threading.Thread(
                target=self._listen,
                args=(settings.NOTIFY_CHANNEL,),
                name="durable-listener",
                daemon=True,
            ).start()
        reconciler = None
        if self.reconcile:
            reconciler = threading.Thread(
                target=self._reconcile_loop, name="durable-reconciler", daemon=True
            )
            reconciler.start()
        scheduler = None
        if not self.burst:
            scheduler = threading.Thread(
                target=self._scheduler_loop, name="durable-scheduler", daemon=True
            )
            scheduler.start()
        if completer.wanted(self.concurrency, self.execution):
            self._completer = completer.Completer(self.using)
        for number in range(self.concurrency):
            self._start_slot(number, generation=0)
        # Process execution kills a child at the grace itself; give those kills time to land.
        grace = settings.SHUTDOWN_GRACE + (5.0 if self.execution == "process" else 0.0)
        deadline = None
        try:
            while any(slot.started_thread.is_alive() for slot in self._live_slots()):
                if not self.stopping.is_set():
                    self._check_health()
                if self.execution == "thread":
                    self._supervise()
                if self.hard_stop.is_set():
                    log.warning("worker %s stopping at once", self.identity)
                    return 1
                if self.stopping.is_set() and deadline is None:
                    deadline = time.monotonic() + grace
                if deadline is not None and time.monotonic() > deadline:
                    log.warning(
                        "worker %s: slices did not yield within %.0fs",
                        self.identity,
                        settings.SHUTDOWN_GRACE,
                    )
                    return 1
                alive = [slot for slot in self._live_slots() if slot.started_thread.is_alive()]
                if not alive:
                    break
                alive[0].started_thread.join(timeout=0.1)
            if self.execution == "thread":
                self._supervise()  # charges still owed for abandoned slices
            return 1 if self._failed else 0
        finally:
            self.stopping.set()
            self._schedules_changed.set()  # the scheduler's sleep ends with the worker
            self._hand_back_everything()
            if self._completer is not None:
                self._completer.close(wait=not self.hard_stop.is_set())
                self._completer = None
            self._heartbeater.stop()
            registration.stop()
            if reconciler is not None:
                reconciler.join(timeout=2)  # let a leader resign, so leadership moves at once
            if scheduler is not None:
                scheduler.join(timeout=2)
            if self.execution == "process":
                zygote.close_shared()
            log.info("worker %s stopped after %d slices", self.identity, self.slices_run)
            if self.burst and not self.hard_stop.is_set():
                self._say_what_still_waits()

    def _retry_due_in(self) -> float | None:
        """Seconds until the first job this burst could run is due again after a backoff."""
        try:
            count, due_in = reads.waiting_out_a_backoff(
                self.queues,
                registry.kinds(),
                slack_ms=intake.DELIVERY_SLACK_MS if self._intake.brokers else 0,
                using=self.using,
            )
        except (DatabaseError, InterfaceError):
            return None  # the burst ends; the claim loop's own retries cover an outage
        return max(0.0, due_in) if count and due_in is not None else None

    def _say_what_still_waits(self) -> None:
        """A burst run that ends with retries still pending says so: they are not lost."""
        try:
            count, due_in = reads.waiting_out_a_backoff(
                self.queues, registry.kinds(), using=self.using
            )
        except (DatabaseError, InterfaceError):
            return
        finally:
            connections[self.using].close()
        if count:
            log.info(
                "worker %s: burst run ended with %d job(s) still waiting out a retry backoff "
                "(the next due in %.1fs); --wait-for-retries waits for them",
                self.identity,
                count,
                due_in or 0.0,
            )

    @property
    def slices_run(self) -> int:
        return sum(self._slices_per_slot)

    def _live_slots(self) -> list[SlotState]:
        return [slot for slot in self._slots if not slot.abandoned]

    def _start_slot(self, number: int, *, generation: int) -> SlotState:
        owner = f"{self.identity}/{number}" + (f".{generation}" if generation else "")
        slot = SlotState(number=number, generation=generation, owner=owner)
        name = f"durable-slot-{number}" + (f".{generation}" if generation else "")
        slot.thread = threading.Thread(target=self._slot, args=(slot,), name=name, daemon=True)
        self._slots.append(slot)
        slot.thread.start()
        return slot

    def _check_health(self) -> None:
        if not all(slot.started_thread.is_alive() for slot in self._live_slots()):
            # A slot died of something no handler should be able to cause. Exit non-zero
            # so a supervisor restarts the worker rather than trusting a crippled one.
            log.error("worker %s: a slot thread died; stopping", self.identity)
            self._fail()
        if not self._heartbeater.alive:
            log.error(
                "worker %s: the heartbeat thread died; stopping so leases are not lost silently",
                self.identity,
            )
            self._fail()

    def _fail(self) -> None:
        self._failed = True
        self.stopping.set()
        self._wake_all()

    def _give_up_burst(self, slot: SlotState, reason: str, seconds: float) -> None:
        """A burst run that cannot claim for a whole lease stops, non-zero, instead of retrying.

        A long-running worker outlives an outage by retrying forever; a burst run is a
        script's or a test's "drain the queue, then exit", and one that cannot reach the
        database would hang it. After ``LEASE_TTL`` without a claim, every lease this worker
        held has expired anyway (another worker re-drives those jobs), so waiting longer
        keeps nothing safe: say why, and exit 1 so the caller sees that nothing drained.
        """
        log.error(
            "worker %s: burst run stopped: slot %s could not claim for %.0fs (LEASE_TTL) (%s)",
            self.identity,
            slot.owner,
            seconds,
            reason,
        )
        self._fail()

    # --- a slot ---
    def _slot(self, slot: SlotState) -> None:
        pooling.name_connection(self.using)
        wake = self._wakes[slot.number]
        settings = conf.get()
        ttl_ms = conf.ms(settings.LEASE_TTL)
        runner = slot.runner = (
            ChildRunner(
                role=f"durable-child-{slot.number}", stopping=self.stopping, using=self.using
            )
            if self.execution == "process"
            else None
        )
        failures = 0
        failing_since = 0.0
        after_work = False  # this claim follows the slot's own claims, not a sleep
        try:
            while not self.stopping.is_set() and not slot.abandoned:
                try:
                    db.keep_connection_healthy(self.using)
                    if runner is not None:
                        runner.ensure_started()  # before claiming: a claim should not wait for a boot
                    if self.burst:
                        self._claim_begins(slot.number)
                    # Invariant 14b inside: only the kinds it can run (the table, a broker).
                    claimed, then = self._intake.claim(
                        slot.owner, ttl_ms, limit=slot.batch, wait=min(settings.POLL_INTERVAL, 1.0)
                    )
                    failures = 0
                    self._outage.answered()
                except Exception as error:  # noqa: BLE001 - the database or a child that will not start
                    failures += 1
                    if failures == 1:
                        failing_since = time.monotonic()
                    failing_for = time.monotonic() - failing_since
                    connections[self.using].close()
                    if failures == 1 and db.is_connection_loss(error):
                        # One cut connection (pg_terminate_backend, a proxy's idle timeout)
                        # is not an outage: claim again at once on a new connection. The
                        # backoff, and the outage's warning, start at the second failure.
                        log.info(
                            "slot %s: connection lost (%s); reconnecting",
                            slot.owner,
                            one_line(error),
                        )
                        continue
                    if self.burst and failing_for >= ttl_ms / 1000:
                        self._give_up_burst(slot, one_line(error), failing_for)
                        break
                    delay = min(5.0, 0.1 * 2**failures)
                    self._outage.failed(f"slot {slot.owner}", error, delay)
                    self.stopping.wait(delay)
                    continue
                if claimed:
                    self._claim_found(True)  # the listener's wake-up cooldown back to its base
                elif then != intake.AGAIN and not after_work:
                    # Woken (or polling) and found nothing: another slot or worker won the
                    # race, which is what backs the cooldown off. A slot's look for more
                    # after its own work is not a lost race (AGAIN: a refused message).
                    self._claim_found(False)
                after_work = bool(claimed)
                if claimed:
                    faults.point("claim_returned")
                    self._set_idle(slot.number, False)
                    if len(claimed) == slot.batch:
                        # Maybe more is due (one notification can stand for a whole batch of
                        # starts): pass the wake-up on to one more sleeping slot.
                        self._wake_one(chained=True, batch=slot.batch)
                    try:
                        pace = self._run_claimed(slot, claimed, ttl_ms, runner)
                    except (DatabaseError, InterfaceError) as error:
                        # Between slices (a lease extension or hand-back): the claims left
                        # keep their leases, which expire and are re-driven.
                        log.warning(
                            "slot %s: database error between slices (%s)",
                            slot.owner,
                            type(error).__name__,
                        )
                        connections[self.using].close()
                        pace = Pace.SLOW
                    except Exception:
                        log.exception("slot %s: unexpected error between slices", slot.owner)
                        pace = Pace.SLOW
                    # Claim several at a time only while this slot's batches are quick: the
                    # claims wait their turn holding leases, and a deep queue of no-op-like
                    # jobs should not pay one claim transaction per job.
                    slot.batch = next_batch(
                        slot.batch,
                        len(claimed),
                        pace,
                        prefetch_ceiling(settings.MAX_PREFETCH, self.execution),
                        fits_in_window(slot.slice_mean),
                    )
                    continue
                if then == intake.AGAIN:
                    continue  # a broker message was handled (refused by its claim): ask again
                if self.burst:
                    if self._set_idle(slot.number, True):
                        due_in = self._retry_due_in() if self.wait_for_retries else None
                        if due_in is None:
                            self.stopping.set()  # every slot found nothing due: the burst is over
                            self._wake_all()  # the sleeping slots need not wait out their poll
                            break
                        self._note_due(due_in)  # a retry is coming: sleep until it is due
                    elif then == intake.WAITED:
                        # Another slot is busy or mid-dequeue: sleep (woken by a start, or
                        # by the burst's end) instead of waiting on the broker again at
                        # once. Slots whose broker waits kept overlapping would never all
                        # be seen idle, and the burst would never end.
                        self._rest(slot, wake, self._idle_wait(settings.POLL_INTERVAL))
                        continue
                if then != intake.WAITED:
                    self._rest(slot, wake, self._idle_wait(settings.POLL_INTERVAL))
        finally:
            self._intake.close()
            if runner is not None:
                runner.close()
            if not slot.abandoned:
                connections[self.using].close()

    def _rest(self, slot: SlotState, wake: threading.Event, timeout: float) -> None:
        """Sleep until woken or ``timeout``. Woken by a sibling whose claim came back full,
        start from its batch: its slices were quick and the queue holds more. On a burst
        of 5,000 no-op jobs before one process of 64 slots, each slot grew its own batch
        from one, and its share was gone before the batch was large: the drain ran at
        about 60 % of four slots', and at 75-86 % with the batch passed on (issue #27)."""
        batch = self._sleep(slot.number, wake, timeout)
        if batch is not None:
            slot.batch = max(slot.batch, batch)

    def _run_claimed(
        self, slot: SlotState, claimed: list[Job], ttl_ms: int, runner: ChildRunner | None
    ) -> Pace:
        """Run a slot's claims in order; return how quickly they went (see ``next_batch``).

        The claims' leases are kept alive while they wait their turn and, once finished,
        until their batched completion commits: a slow slice in the batch must not let
        its neighbours' leases expire. Kinds without a mirror are completed together
        after the batch (one statement, each row on its own epoch fence). A claim left
        unstarted (shutdown, or a slow slice) is handed back at once, uncharged.

        In process execution a batch whose slices all go straight to their handler is
        sent to the child in one go (``ChildRunner.send_ahead``): it runs them one after
        the other while this thread records each outcome, and what it has not started is
        taken back before a hand-back, so a claim is run by the child or handed back,
        never both. Once the batch has run for ``PREFETCH_WINDOW`` the claims still waiting
        are handed back the same way, for any slot to take.

        While such a batch's last slices run, the slot claims the next one and queues it
        behind (``_claim_ahead``): the batch goes on with it, its window counted afresh.
        How many slices are still queued then (``claim_lead``) is what keeps the handler
        process busy through the claim's round trip.
        """
        began = time.monotonic()
        settings = conf.get()
        interval = settings.HEARTBEAT_INTERVAL
        batched = len(claimed) > 1
        # The claims to run, in order; it grows at its end when the slot claims ahead (a
        # list's iterator goes on to the items appended to it).
        batch = list(claimed)
        claim_was_full = len(claimed) == slot.batch
        sent_last = len(claimed)  # how many claims the last claim sent to the handler process
        slot.waiting = []
        entries: dict[Any, HeldLease] = {}
        if runner is not None:
            slot.runner = runner
        sent_ahead = batched and self._hold(slot, claimed, entries, ttl_ms, interval, runner)
        if not batched:
            # Listed, not beaten (it starts at once): a hard stop finds it here and hands it
            # back until its slice has begun (``_on_start``), even while its wait is checked.
            lone = HeldLease(claimed[0], _lease_of(claimed[0], ttl_ms), interval)
            entries[lone.id] = lone
            slot.waiting.append(lone)
        pace = Pace.QUICK
        handed_back = False
        ran, busy = 0, 0.0
        try:
            for position, job in enumerate(batch):
                if slot.abandoned:
                    return Pace.SLOW
                entry = entries.get(job.id)
                if entry is not None and entry not in slot.waiting:
                    continue  # handed back while the slice before it ran
                if pace is Pace.QUICK and ran and time.monotonic() - began > PREFETCH_WINDOW:
                    pace = Pace.LONG  # the claims left have waited long enough behind the ones run
                if (self.stopping.is_set() or pace is not Pace.QUICK) and not handed_back:
                    self._hand_back(slot)  # takes back first what the child has not started
                    # Once a batch: what the child keeps after it has started or run
                    # already, and nothing joins the batch once it is not quick. Handing
                    # back again before each of those slices completed them one statement
                    # (and one round trip to the child) apiece: on a saturated machine,
                    # where the child runs a batch ahead of its late slot thread, three in
                    # four of the transactions 64 slots spent (issue #27).
                    handed_back = True
                if handed_back:
                    if runner is None or not runner.holds(job.id):
                        return Pace.SLOW if self.stopping.is_set() else pace
                    # Started in the child before the hand-back: supervised and recorded below.
                if (
                    entry is not None
                    and entry.lease_lost
                    and not (runner is not None and runner.holds(job.id))
                ):
                    self._let_go(slot, entry)
                    continue  # taken over while it waited: not ours to run
                mean = busy / ran if ran else slot.slice_mean
                if (
                    sent_ahead
                    and claim_was_full
                    and pace is Pace.QUICK
                    and position >= len(batch) - claim_lead(slot.ahead_seconds, mean, sent_last)
                    and not self.stopping.is_set()
                    and runner is not None
                    and runner.holds(job.id)
                ):
                    limit = next_batch(
                        slot.batch,
                        slot.batch,
                        Pace.QUICK,
                        prefetch_ceiling(settings.MAX_PREFETCH, self.execution),
                        fits_in_window(mean),
                    )
                    more = self._claim_ahead(slot, ttl_ms, interval, runner, entries, limit=limit)
                    claim_was_full = len(more) == limit  # else the queue is thin: no more ahead
                    if more:
                        batch.extend(more)
                        began = time.monotonic()  # the window of the claims just queued
                        slot.batch = limit
                        sent_last = len(more)
                        sent_ahead = all(runner.holds(more_job.id) for more_job in more)
                lost = (
                    entry is not None and entry.lease_lost
                )  # queued in the child: it is told at once
                report = run_slice(
                    job,
                    stopping=self.stopping,
                    heartbeater=self._heartbeater,
                    completions=slot.completions if batched else None,
                    runner=self._runner_for(slot, runner) if runner is not None else None,
                    check_slots=self.check_slots,
                    using=self.using,
                    on_start=functools.partial(self._on_start, slot, lost, entry),
                )
                slot.current = None
                if entry is not None and entry in slot.waiting:
                    self._let_go(slot, entry)  # ended before its slice began (a wait, a verdict)
                if report.outcome not in intake.FINAL_OUTCOMES:
                    self._intake.after_slice(job)  # a broker queue's next delivery, if due
                if report.recheck_in is not None:
                    self._note_due(report.recheck_in)
                if entry is not None and report.outcome == "deferred":
                    entry.returned = True
                    slot.finished.append(entry)
                    self._heartbeater.track(entry)
                self._slices_per_slot[slot.number] += (
                    1  # one live thread per slot number writes its cell
                )
                ran += 1
                took = slice_seconds(report)
                busy += took
                if took >= QUICK_SLICE:
                    pace = Pace.SLOW
        finally:
            if not slot.abandoned:  # an abandoned slot's claims were handed back by the supervisor
                if slot.completions:
                    faults.point("before_batched_completion")
                self._hand_back(slot)
            if runner is not None and runner.holds_any():
                # Left mid-batch by an error: nothing may run in the child unsupervised.
                log.warning(
                    "slot %s: runs still queued in the handler process after a batch; killing it",
                    slot.owner,
                )
                runner.kill()
                runner.forget()
        if pace is Pace.QUICK and ran > 1 and time.monotonic() - began > PREFETCH_WINDOW:
            pace = Pace.LONG
        slot.slice_mean = busy / ran if ran else slot.slice_mean
        return pace

    def _claim_ahead(
        self,
        slot: SlotState,
        ttl_ms: int,
        interval: float,
        runner: ChildRunner,
        entries: dict[Any, HeldLease],
        *,
        limit: int,
    ) -> list[Job]:
        """While the batch's last slices run in the handler process: complete the slices it
        has finished, claim up to ``limit`` more and queue them behind the queued ones.

        The handler process then goes straight on to the next claim instead of waiting
        for a completion and a claim statement between batches: 20 ms slices lost about
        5 % of a slot's time there (issue #27 item 6). The new claims are held like any
        batch-mate: beaten, handed back if the running slice proves slow or the worker
        stops, taken back from the child before that. A claim that fails here is left to
        the slot's next claim; nothing was queued.
        """
        asked = time.monotonic()
        if slot.completions:
            faults.point("before_batched_completion")
        completions, finished = self._take_finished(slot)
        # The completion on the completer's connection while this thread claims, when
        # that thread is free; else here first, as before (``completer``).
        helper = self._completer
        completing = (
            helper.try_submit(functools.partial(self._complete, slot, completions, finished))
            if helper is not None and completions
            else None
        )
        if completing is None:
            self._complete(slot, completions, finished)
        more: list[Job] = []
        try:
            try:
                more = self._intake.claim_ahead(slot.owner, ttl_ms, limit=limit)
                slot.ahead_seconds = time.monotonic() - asked
            except (DatabaseError, InterfaceError) as error:
                log.info("slot %s: claim ahead failed (%s)", slot.owner, one_line(error))
                connections[self.using].close()
                return []
            if more:
                self._claim_found(True)
                if len(more) == limit:
                    self._wake_one(chained=True, batch=limit)
                # Queued in the handler process before the completion is waited for: the
                # process runs them while the server commits it. Waited for first, the
                # process sat idle some 10 ms a batch of no-op slices at one slot, two
                # fifths of its time (issue #27).
                self._hold(slot, more, entries, ttl_ms, interval, runner)
        finally:
            if completing is not None:
                completing.wait()  # landed (or left to expire) before the slot goes on
        return more

    def _hold(
        self,
        slot: SlotState,
        jobs: list[Job],
        entries: dict[Any, HeldLease],
        ttl_ms: int,
        interval: float,
        runner: ChildRunner | None,
    ) -> bool:
        """Keep the leases of claims that wait their turn in a batch; queue them in the
        handler process when every one goes straight to its handler. Return whether they
        were queued there (``ChildRunner.send_ahead``).

        Held claims are beaten by the heartbeater and listed in ``slot.waiting``, so a
        hand-back (a slow slice, a stop) can find them and give them back uncharged.
        """
        held = [HeldLease(job, _lease_of(job, ttl_ms), interval) for job in jobs]
        for entry in held:
            entries[entry.id] = entry
        slot.waiting.extend(held)
        self._heartbeater.track_all(held)
        if runner is None or not all(_goes_straight_to_its_handler(job, ttl_ms) for job in jobs):
            return False
        return runner.send_ahead([(job, entries[job.id].lease) for job in jobs])

    def _on_start(
        self, slot: SlotState, lost: bool, entry: HeldLease | None, control: SliceControl
    ) -> None:
        # Seen as the slot's current slice before it leaves the waiting claims: at a hard
        # stop the main thread finds the claim in one or the other.
        slot.current = control
        if entry is not None:
            self._let_go(slot, entry)
        if lost:
            control.mark_lease_lost()
        if self._handing_back.is_set():
            # The main thread is handing every lease back (``_hand_back_everything``) and
            # may have read this slot's current slice before it was set: the slice must
            # not start, and hands its claim back itself (``run_slice``).
            control.abandon()

    def _let_go(self, slot: SlotState, entry: HeldLease) -> None:
        """A claim leaves the slot's waiting ones: its slice has begun, or it will not run."""
        slot.waiting.remove(entry)
        self._heartbeater.untrack(entry)

    def _runner_for(self, slot: SlotState, runner: ChildRunner) -> Callable[[SliceControl], Ran]:
        """Run a slice in the slot's child; once it proves slow, hand the rest of the batch back.

        The slot thread is free while the child works: the claims waiting their turn
        (taken back from the child's queue first) go back to the queue for other slots,
        and finished ones are completed now, instead of all of them waiting out one long
        slice.
        """
        return functools.partial(
            runner.run, on_slow=functools.partial(self._hand_back, slot), slow_after=QUICK_SLICE
        )

    def _reconcile_loop(self) -> None:
        # Every worker takes part; only the holder of the leader row runs passes, and it
        # resigns when this worker starts stopping (invariant 14).
        from durable_jobs.runtime.reconciler import run_as_leader

        pooling.name_connection(self.using)
        run_as_leader(self.stopping, self.identity, using=self.using)

    def _scheduler_loop(self) -> None:
        # Every worker writes the schedules its code declares and takes part in the
        # scheduler's leadership; the leader fires each tick once (invariant 24).
        from durable_jobs.runtime.scheduler import run_as_leader as run_scheduler

        pooling.name_connection(self.using)
        run_scheduler(self.stopping, self.identity, wake=self._schedules_changed, using=self.using)
