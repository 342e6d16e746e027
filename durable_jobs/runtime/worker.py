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
import enum
import functools
import heapq
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

from durable_jobs import conf, db, faults, registry, store, validation
from durable_jobs.runtime import pooling, zygote
from durable_jobs.runtime.context import Slice
from durable_jobs.runtime.executor import (
    DeferredCompletion,
    SliceReport,
    complete_deferred,
    run_slice,
    time_limit_failure,
)
from durable_jobs.runtime.heartbeat import Heartbeater, HeldLease
from durable_jobs.runtime.runner import ChildRunner
from durable_jobs.states import VERDICT_CODES, Lease
from durable_jobs.waits import gate as waits_gate

log = logging.getLogger("durable_jobs.worker")


#: A slice this short (seconds) lets its slot claim more than one job at a time.
QUICK_SLICE = 0.05
#: How long (seconds) a prefetched claim may wait behind its batch-mates: a batch still
#: running after this hands the rest back, and the slot claims half as many next time.
#: It bounds the wait whatever MAX_PREFETCH is, so a large batch only ever forms from
#: slices that together finish well inside it.
PREFETCH_WINDOW = 0.1


#: MAX_PREFETCH when it is None, by execution mode. A handler process that dies charges
#: only the slice it ran (the runs queued behind it go to the next child), so process
#: execution risks only a worker killed outright on a large batch; in thread execution a
#: handler that kills the process (a segfault, os._exit) takes every claim with it.
PREFETCH_BY_EXECUTION = {"process": 64, "thread": 8}


def prefetch_ceiling(max_prefetch: int | None, execution: str) -> int:
    """The most jobs a slot claims at once: ``MAX_PREFETCH``, or its default for ``execution``."""
    return max_prefetch if max_prefetch is not None else PREFETCH_BY_EXECUTION[execution]


class Pace(enum.Enum):
    """How a slot's last batch went, which sets how many jobs it claims next."""

    QUICK = "quick"  # every slice quick and the batch inside PREFETCH_WINDOW: may grow
    LONG = "long"  # quick slices, but together past PREFETCH_WINDOW: halve
    SLOW = "slow"  # a slice took QUICK_SLICE or more (or the batch was cut short): one at a time


def next_batch(batch: int, claimed: int, pace: Pace, ceiling: int) -> int:
    """How many jobs a slot claims next, after claiming ``claimed`` of ``batch`` at ``pace``.

    Grows (doubling, up to ``ceiling``, i.e. ``MAX_PREFETCH``) only when the claim came
    back full, so a thin queue keeps batches small; halves after a long batch; drops to
    one after a slow slice, since the claims behind a slow slice are what prefetch costs.
    """
    if pace is Pace.SLOW:
        return 1
    if pace is Pace.LONG:
        return max(1, batch // 2)
    return min(ceiling, batch * 2) if claimed == batch else min(ceiling, batch)


def _slice_seconds(report: SliceReport) -> float:
    """How long a slice took, for pacing: its own work (``SliceReport.busy``: the run by
    the handler process's clock, the slot's bookkeeping and the mirror) where a handler
    process ran it, else the slot thread's duration. On a saturated machine the slot
    thread hears of a no-op run tens of milliseconds late; judged by that, every slice
    looked slow and every slot fell back to one claim per job, adding work to the
    machine that was already behind."""
    return report.busy if report.busy is not None else report.duration


def _goes_straight_to_its_handler(job, ttl_ms: int) -> bool:
    """True when ``run_slice`` would hand ``job`` to its handler with nothing written first,
    and its outcome is recorded without user code (no mirror): such a job may be queued
    in the slot's child behind the one running there."""
    handler = registry.get(job.kind)
    return (
        handler is not None
        and handler.mirror is None
        and job.error_code not in VERDICT_CODES
        and not waits_gate.pending(job)
        and conf.ms(handler.setting("LEASE_TTL")) == ttl_ms
    )


def _lease_of(job, ttl_ms: int) -> Lease:
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
    current: Slice | None = None  # the slice running now
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


class Worker:
    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        burst: bool = False,
        reconcile: bool = True,
        execution: str | None = None,
        using: str = DEFAULT_DB_ALIAS,
    ) -> None:
        settings = conf.get()
        self.queues = list(queues or [settings.DEFAULT_QUEUE])
        self.concurrency = concurrency
        self.burst = burst
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
        self._slices_per_slot = [0] * concurrency
        self._wakes = [threading.Event() for _ in range(concurrency)]
        self._idle = [False] * concurrency
        self._idle_lock = threading.Lock()
        self._sleepers: dict[int, None] = {}  # slots asleep waiting for work, oldest first
        self._missed_wakes = 0  # wake-ups that found no slot asleep (guarded by _idle_lock)
        self._heartbeater = Heartbeater(using=using)
        # Wait conditions: this worker's bound on checks running at once, and the moments
        # (monotonic) at which jobs it held become due, so an idle slot never sleeps past
        # an `after` instant it knows of (the poll is the floor, not the promptness).
        self.check_slots = waits_gate.CheckSlots(settings.WAIT_MAX_CONCURRENT_CHECKS)
        self._due_soon: list[float] = []
        self._due_lock = threading.Lock()
        self._slots: list[SlotState] = []
        self._unpaid: list[
            tuple[Slice, str]
        ] = []  # abandoned slices whose charge has not landed yet
        self.abandoned_threads = 0
        self._previous_handlers: dict[int, object] = {}
        self._failed = False

    # --- signals: handlers only set flags ---
    def _on_signal(self, signum, frame) -> None:
        if self.stopping.is_set():
            self.hard_stop.set()
        else:
            log.info("signal %d: finishing running slices (again to stop at once)", signum)
            self.stopping.set()
        self._wake_all()

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
        for number in range(self.concurrency):
            self._start_slot(number, generation=0)
        # Process execution kills a child at the grace itself; give those kills time to land.
        grace = settings.SHUTDOWN_GRACE + (5.0 if self.execution == "process" else 0.0)
        deadline = None
        try:
            while any(slot.thread.is_alive() for slot in self._live_slots()):
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
                alive = [slot for slot in self._live_slots() if slot.thread.is_alive()]
                if not alive:
                    break
                alive[0].thread.join(timeout=0.1)
            if self.execution == "thread":
                self._supervise()  # charges still owed for abandoned slices
            return 1 if self._failed else 0
        finally:
            self.stopping.set()
            self._hand_back_everything()
            self._heartbeater.stop()
            if reconciler is not None:
                reconciler.join(timeout=2)  # let a leader resign, so leadership moves at once
            if self.execution == "process":
                zygote.close_shared()
            log.info("worker %s stopped after %d slices", self.identity, self.slices_run)

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
        if not all(slot.thread.is_alive() for slot in self._live_slots()):
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

    # --- thread execution: the supervisor ---
    def _supervise(self) -> None:
        """End thread slices past their time limit or deaf to a cancel; replace their slots."""
        settings = conf.get()
        now = time.monotonic()
        for slot in self._live_slots():
            context = slot.current
            if context is None or context.abandoned or context.returned:
                continue
            if context.past_time_limit(now):
                self._abandon(slot, context, "time_limit")
            elif (
                context.cancel_observed
                and now - (context.cancel_seen_at or now) > settings.CANCEL_GRACE
            ):
                self._abandon(slot, context, "cancel")
        self._unpaid = [
            (context, why) for context, why in self._unpaid if not self._charge(context, why)
        ]

    def _abandon(self, slot: SlotState, context: Slice, why: str) -> None:
        """Give up on a slot's thread: charge its slice, hand its claims back, start a new thread."""
        if not context.abandon():
            return  # the handler returned just now: its outcome is being recorded
        slot.abandoned = True
        self._heartbeater.untrack(context)
        self.abandoned_threads += 1
        limit = conf.get().MAX_ABANDONED_THREADS
        log.error(
            "[%s %s] %s: abandoning thread %s (%d of %d abandoned threads allowed)",
            context.kind,
            context.id,
            "slice ran past its time limit"
            if why == "time_limit"
            else "handler ignored the cancel request past CANCEL_GRACE",
            slot.thread.name,
            self.abandoned_threads,
            limit,
        )
        if not self._charge(context, why):
            self._unpaid.append((context, why))
        self._hand_back(slot)
        if self.abandoned_threads > limit:
            log.error(
                "worker %s: more than %d handler threads are stuck; exiting for a restart (use "
                "EXECUTION = 'process' to have stuck handlers killed instead)",
                self.identity,
                limit,
            )
            self._fail()
        elif not self.stopping.is_set():
            self._start_slot(slot.number, generation=slot.generation + 1)

    def _charge(self, context: Slice, why: str) -> bool:
        """Write what an abandoned slice owes; False when its row is busy (try next tick)."""
        lock_ms = max(50, conf.ms(context.heartbeat_interval) // 4)
        if why == "time_limit":
            failure = time_limit_failure(context)
            handler = context.handler

            def write():
                # A verdict is left for the next claim to record (with the kind's mirror):
                # user code never runs on the supervisor.
                return store.fail_slice(
                    context.lease,
                    error_class=failure.error_class,
                    code=failure.code,
                    message=failure.message,
                    max_failures=handler.setting("MAX_CONSECUTIVE_FAILURES"),
                    backoff_base_ms=conf.ms(handler.setting("RETRY_BACKOFF_BASE")),
                    backoff_max_ms=conf.ms(handler.setting("RETRY_BACKOFF_MAX")),
                    using=self.using,
                )
        else:

            def write():
                # Released with the cancel request standing: the reconciler ends it (with
                # its mirror) on its next pass.
                return store.release_lease(context.lease, delay_ms=0, using=self.using)

        try:
            db.with_lock_timeout(lock_ms, write, using=self.using)
        except (DatabaseError, InterfaceError) as error:
            log.info(
                "[%s %s] charge for %s deferred: %s",
                context.kind,
                context.id,
                why,
                type(error).__name__,
            )
            db.keep_connection_healthy(self.using)
            return False
        return True

    # --- shutdown ---
    def _hand_back(self, slot: SlotState, *, take_back: bool = True) -> None:
        """Complete a slot's finished batch and release its unstarted claims, uncharged.

        Claims queued in the slot's child are taken back first (``ChildRunner.take_back``);
        one the child had already started stays in ``slot.waiting``, to be run (told to
        stop, on a shutdown) and recorded like any slice: handed back or run, never both.
        """
        runner = slot.runner
        if runner is not None and take_back and not slot.abandoned:
            runner.take_back()  # on the slot's own thread, the only one that talks to its child
        # Emptied in place: a slice still running holds the completions list and appends
        # to it when it finishes, so the list object must stay the slot's.
        completions, finished = list(slot.completions), list(slot.finished)
        kept = [entry for entry in slot.waiting if runner is not None and runner.holds(entry.id)]
        waiting = [entry for entry in slot.waiting if entry not in kept]
        slot.completions.clear()
        slot.waiting[:] = kept
        slot.finished.clear()
        try:
            if completions:
                complete_deferred(completions, using=self.using)
            for entry in waiting:
                if not entry.lease_lost:
                    db.with_lock_timeout(
                        200,
                        lambda e=entry: store.release_lease(e.lease, delay_ms=0, using=self.using),
                        using=self.using,
                    )
        except (DatabaseError, InterfaceError) as error:
            log.warning(
                "slot %s: could not hand its claims back (%s); their leases will expire",
                slot.owner,
                type(error).__name__,
            )
            db.keep_connection_healthy(self.using)
        finally:
            for entry in (*waiting, *finished):
                self._heartbeater.untrack(entry)

    def _hand_back_everything(self) -> None:
        """At exit: hand back every lease still held, so nothing waits out an expiry.

        A slice still running is recorded as interrupted (invariant 6: a shutdown spends
        no budget); a claim never started is released. Busy rows (a fence still open)
        are left to their lease.

        In process execution the handler processes are killed first (a handler process,
        and its own children, never outlives its worker), after their running slices are
        marked abandoned so that no slot records the kill as a death: nothing a child
        had queued may start once its claim is released.
        """
        lost_before = set()
        # Taken once, before the kills: a slot that sees its child die untracks its slice.
        holders = self._heartbeater.held()
        for holder in holders:
            if isinstance(holder, Slice):
                if holder.lease_lost:
                    lost_before.add(id(holder))
                holder.abandon()  # which marks it lost: lost_before says whether it was
        for slot in self._slots:
            if slot.runner is not None:
                slot.runner.kill()
        for slot in self._slots:
            if not slot.abandoned and (slot.waiting or slot.completions):
                self._hand_back(slot, take_back=False)  # the children are dead by now
        seen = {id(holder) for holder in holders}
        for holder in holders + [
            holder for holder in self._heartbeater.held() if id(holder) not in seen
        ]:
            self._heartbeater.untrack(holder)
            if id(holder) in lost_before if isinstance(holder, Slice) else holder.lease_lost:
                continue
            if isinstance(holder, Slice):
                holder.abandon()

                def write(h=holder):
                    return store.yield_slice(h.lease, interrupted=True, using=self.using)
            else:

                def write(h=holder):
                    return store.release_lease(h.lease, delay_ms=0, using=self.using)

            try:
                if db.with_lock_timeout(200, write, using=self.using) is not None:
                    log.info("[%s %s] handed back at shutdown", holder.kind, holder.id)
            except (DatabaseError, InterfaceError) as error:
                log.warning(
                    "[%s %s] not handed back (%s); its lease will expire",
                    holder.kind,
                    holder.id,
                    type(error).__name__,
                )
                db.keep_connection_healthy(self.using)

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
        try:
            while not self.stopping.is_set() and not slot.abandoned:
                try:
                    db.keep_connection_healthy(self.using)
                    if runner is not None:
                        runner.ensure_started()  # before claiming: a claim should not wait for a boot
                    claimed = store.dequeue(
                        self.queues, slot.owner, ttl_ms, limit=slot.batch, using=self.using
                    )
                    failures = 0
                except Exception as error:  # noqa: BLE001 - the database or a child that will not start
                    failures += 1
                    if failures == 1:
                        failing_since = time.monotonic()
                    failing_for = time.monotonic() - failing_since
                    reason = validation.printable(f"{type(error).__name__}: {error}", limit=300)
                    connections[self.using].close()
                    if self.burst and failing_for >= ttl_ms / 1000:
                        self._give_up_burst(slot, reason, failing_for)
                        break
                    delay = min(5.0, 0.1 * 2**failures)
                    log.warning(
                        "slot %s: cannot claim (%s); retrying in %.1fs", slot.owner, reason, delay
                    )
                    self.stopping.wait(delay)
                    continue
                if claimed:
                    self._set_idle(slot.number, False)
                    if len(claimed) == slot.batch:
                        # Maybe more is due (one notification can stand for a whole batch of
                        # starts): pass the wake-up on to one more sleeping slot.
                        self._wake_one(chained=True)
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
                    )
                    continue
                if self.burst and self._set_idle(slot.number, True):
                    self.stopping.set()  # every slot found nothing due: the burst is over
                    self._wake_all()  # the sleeping slots need not wait out their poll
                    break
                self._sleep(slot.number, wake, self._idle_wait(settings.POLL_INTERVAL))
        finally:
            if runner is not None:
                runner.close()
            if not slot.abandoned:
                connections[self.using].close()

    def _run_claimed(
        self, slot: SlotState, claimed: list, ttl_ms: int, runner: ChildRunner | None
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
        """
        began = time.monotonic()
        interval = conf.get().HEARTBEAT_INTERVAL
        batched = len(claimed) > 1
        slot.waiting = (
            [HeldLease(job, _lease_of(job, ttl_ms), interval) for job in claimed] if batched else []
        )
        entries = {entry.id: entry for entry in slot.waiting}
        for entry in slot.waiting:
            self._heartbeater.track(entry)
        if runner is not None:
            slot.runner = runner
        if (
            runner is not None
            and batched
            and all(_goes_straight_to_its_handler(job, ttl_ms) for job in claimed)
        ):
            runner.send_ahead([(job, entries[job.id].lease) for job in claimed])
        pace = Pace.QUICK
        ran = 0
        try:
            for job in claimed:
                if slot.abandoned:
                    return Pace.SLOW
                entry = entries.get(job.id)
                if entry is not None and entry not in slot.waiting:
                    continue  # handed back while the slice before it ran
                if pace is Pace.QUICK and ran and time.monotonic() - began > PREFETCH_WINDOW:
                    pace = Pace.LONG  # the claims left have waited long enough behind the ones run
                if self.stopping.is_set() or pace is not Pace.QUICK:
                    self._hand_back(slot)  # takes back first what the child has not started
                    if runner is None or not runner.holds(job.id):
                        return Pace.SLOW if self.stopping.is_set() else pace
                    # Started in the child before the hand-back: supervised and recorded below.
                if entry is not None:
                    slot.waiting.remove(entry)
                    self._heartbeater.untrack(entry)
                    if entry.lease_lost and not (runner is not None and runner.holds(job.id)):
                        continue  # taken over while it waited: not ours to run
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
                    on_start=functools.partial(self._on_start, slot, lost),
                )
                slot.current = None
                if report.recheck_in is not None:
                    self._note_due(report.recheck_in)
                if entry is not None and report.outcome == "deferred":
                    slot.finished.append(entry)
                    self._heartbeater.track(entry)
                self._slices_per_slot[slot.number] += (
                    1  # one live thread per slot number writes its cell
                )
                ran += 1
                if _slice_seconds(report) >= QUICK_SLICE:
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
        return pace

    @staticmethod
    def _on_start(slot: SlotState, lost: bool, context: Slice) -> None:
        slot.current = context
        if lost:
            context.mark_lease_lost()

    def _runner_for(self, slot: SlotState, runner: ChildRunner):
        """Run a slice in the slot's child; once it proves slow, hand the rest of the batch back.

        The slot thread is free while the child works: the claims waiting their turn
        (taken back from the child's queue first) go back to the queue for other slots,
        and finished ones are completed now, instead of all of them waiting out one long
        slice.
        """
        return functools.partial(
            runner.run, on_slow=functools.partial(self._hand_back, slot), slow_after=QUICK_SLICE
        )

    def _note_due(self, seconds: float) -> None:
        """Remember that a job this worker held is due in ``seconds`` (database clock difference)."""
        with self._due_lock:
            heapq.heappush(self._due_soon, time.monotonic() + max(0.0, seconds))

    def _idle_wait(self, poll: float) -> float:
        """How long an idle slot sleeps: the poll interval, or less when a held job is due sooner."""
        now = time.monotonic()
        with self._due_lock:
            while self._due_soon and self._due_soon[0] <= now:
                heapq.heappop(self._due_soon)
            if not self._due_soon:
                return poll
            # A hair past the instant, so the dequeue's clock_timestamp() has reached it.
            return min(poll, self._due_soon[0] - now + DUE_SLACK)

    def _set_idle(self, number: int, idle: bool) -> bool:
        with self._idle_lock:
            self._idle[number] = idle
            return all(self._idle)

    def _listen(self, channel: str) -> None:
        """Wake one idle slot per committed start; reconnect with backoff when cut.

        The listener connects through ``LISTEN_DATABASE`` (default: the worker's own
        database). The backoff is reset only after a connection has stayed up for a
        while: a LISTEN that succeeds on a connection that dies at once (a pooler, a
        server restarting) must not turn into a reconnect loop. After every (re)connect
        the slots are woken for one dequeue pass each, since notifications sent while no
        LISTEN was in place are lost.

        A probe NOTIFY, sent through the worker's own database as a ``start()`` would,
        must come back within ``pooling.PROBE_TIMEOUT``, at start and every
        ``pooling.PROBE_EVERY`` seconds. When it does not (a transaction-mode pooler took
        the LISTEN away), the worker logs an error saying that jobs now wait for the poll
        and how to fix it, instead of polling silently.
        """
        settings = conf.get()
        listen_using = settings.LISTEN_DATABASE or self.using
        probe = pooling.Probe(self.using, channel, self.identity)
        hearing: bool | None = None
        failures = 0
        try:
            while not self.stopping.is_set():
                raw = None
                connected_at = None
                try:
                    raw = pooling.new_raw_connection(listen_using, "durable-listener")
                    db.listen(raw, channel)
                    connected_at = time.monotonic()
                    self._wake_all()
                    probe.send()
                    while not self.stopping.is_set():
                        for notification in raw.notifies(timeout=0.5, stop_after=1):
                            if not probe.seen(notification.payload):
                                self._wake_one()
                        hearing = self._judge_probe(probe, hearing, listen_using, settings)
                        if probe.due():
                            probe.send()
                        if failures and time.monotonic() - connected_at > LISTENER_HEALTHY:
                            failures = 0
                except Exception as error:  # noqa: BLE001 - the listener must outlive any fault
                    failures += 1
                    delay = min(30.0, 0.2 * 2**failures)
                    log.info(
                        "listener reconnecting in %.1fs after %s",
                        delay,
                        validation.printable(f"{type(error).__name__}: {error}", limit=300),
                    )
                    self.stopping.wait(delay)
                finally:
                    if raw is not None:
                        try:
                            raw.close()
                        except Exception:  # noqa: BLE001
                            pass
        finally:
            probe.close()

    def _judge_probe(
        self, probe: pooling.Probe, hearing: bool | None, listen_using: str, settings
    ) -> bool | None:
        """Log what the probe found when it changes; return whether wake-ups arrive (None: not known yet)."""
        answer = probe.check()
        if answer is None or answer == hearing:
            return hearing
        if answer:
            if hearing is None:
                log.info(
                    "worker %s: wake-ups arrive (a probe NOTIFY came back to the listener on %r)",
                    self.identity,
                    listen_using,
                )
            else:
                log.warning(
                    "worker %s: wake-ups arrive again (the probe NOTIFY came back)", self.identity
                )
            return True
        log.error(
            "worker %s: wake-ups are not arriving: a probe NOTIFY sent through database %r did not reach the "
            "listener on %r within %.0fs. A transaction-mode pooler (PgBouncer) drops LISTEN. Jobs still run, "
            "but each waits up to POLL_INTERVAL (%.1fs) to start. Fix: set DURABLE_JOBS['LISTEN_DATABASE'] to "
            "an alias that connects to PostgreSQL directly, or NOTIFY_CHANNEL = None to poll on purpose. "
            "Checking again every %.0fs.",
            self.identity,
            self.using,
            listen_using,
            pooling.PROBE_TIMEOUT,
            settings.POLL_INTERVAL,
            pooling.PROBE_EVERY,
        )
        return False

    def _wake_all(self) -> None:
        for wake in self._wakes:
            wake.set()

    # --- one wake-up per notification (no thundering herd) ---
    def _sleep(self, number: int, wake: threading.Event, timeout: float) -> None:
        """Sleep until woken or ``timeout``; not at all when a wake-up found nobody asleep.

        A notification that arrives while every slot is busy, or while this one is between
        an empty dequeue and its sleep, is kept as a missed wake-up: the next slot about to
        sleep dequeues once more instead, so no committed start waits out a poll interval.
        """
        with self._idle_lock:
            if self._missed_wakes:
                self._missed_wakes -= 1
                return
            self._sleepers[number] = None
        try:
            wake.wait(timeout)
            wake.clear()
        finally:
            with self._idle_lock:
                self._sleepers.pop(number, None)

    def _wake_one(self, *, chained: bool = False) -> None:
        """Wake one sleeping slot for one notification, or (``chained``) for a full claim.

        PostgreSQL folds identical notifications of one transaction into one, so a
        transaction starting many jobs wakes one slot; a slot whose claim came back full
        wakes the next, so the whole batch is picked up, one slot more at a time.
        """
        with self._idle_lock:
            for number in self._sleepers:
                if not self._wakes[number].is_set():
                    self._wakes[number].set()
                    return
            if chained:
                return
            # Nobody asleep and not already woken: every slot is busy and dequeues again on
            # its own when its batch ends; remember it for a slot about to sleep.
            self._missed_wakes = min(self._missed_wakes + 1, self.concurrency)

    def _reconcile_loop(self) -> None:
        # Every worker takes part; only the holder of the leader row runs passes, and it
        # resigns when this worker starts stopping (invariant 14).
        from durable_jobs.runtime.reconciler import run_as_leader

        pooling.name_connection(self.using)
        run_as_leader(self.stopping, self.identity, using=self.using)


#: Seconds an idle slot sleeps past a held job's known due moment before it dequeues.
DUE_SLACK = 0.005

#: A listener connection up this long (seconds) has proved itself: its backoff resets.
LISTENER_HEALTHY = 30.0
