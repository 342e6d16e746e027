"""The worker's main thread watching its slots: time limits, cancels past their grace,
abandoned threads, and handing claims back on shutdown.

A thread cannot be stopped from outside, so in thread execution a slice past its time
limit, or deaf to a cancel past its grace, is charged here and abandoned, and a fresh
thread takes the slot over; in process execution the slot's handler process is killed.
On the second phase of a stop every running slice is ended and every lease and unstarted
claim handed back uncharged (invariant 6).

``Supervision`` is a part of ``Worker`` (a mixin), kept in its own module so that each
concern reads on its own; it uses the worker's slots, settings and stopping events.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError, OperationalError

from durable_jobs import conf, db, faults, store
from durable_jobs.runtime.control import SliceControl
from durable_jobs.runtime.executor import claimed_at, complete_deferred
from durable_jobs.runtime.invoke import time_limit_failure
from durable_jobs.states import ErrorClass

if TYPE_CHECKING:
    from durable_jobs.runtime.executor import DeferredCompletion
    from durable_jobs.runtime.heartbeat import Beatable, Heartbeater, HeldLease
    from durable_jobs.runtime.worker import SlotState

log = logging.getLogger("durable_jobs.worker")

#: How long a hand-back of an unstarted claim waits for its row's lock at first: it must
#: not queue behind a long transaction (an operator's, a stopped session's).
HAND_BACK_WAIT_MS = 200
#: How long, in all, the claims whose rows were locked at first may wait once more.
HAND_BACK_BUSY_WAIT = 2.0


class Supervision:
    """The main thread's side of the slots (mixed into ``Worker``)."""

    # What this mixin uses of ``Worker``, which sets these in its ``__init__``.
    using: str
    identity: str
    stopping: threading.Event
    _handing_back: threading.Event  # set once the hand-back at exit has begun
    abandoned_threads: int
    _heartbeater: Heartbeater
    _slots: list[SlotState]
    _unpaid: list[tuple[SliceControl, str]]  # abandoned slices whose charge has not landed yet

    if TYPE_CHECKING:
        # ``Worker``'s own methods, declared for the type checker only.
        def _live_slots(self) -> list[SlotState]: ...

        def _fail(self) -> None: ...

        def _start_slot(self, number: int, *, generation: int) -> SlotState: ...

    # --- thread execution: the supervisor ---
    def _supervise(self) -> None:
        """End thread slices past their time limit or deaf to a cancel; replace their slots."""
        settings = conf.get()
        now = time.monotonic()
        for slot in self._live_slots():
            control = slot.current
            if control is None or control.abandoned or control.returned:
                continue
            if control.past_time_limit(now):
                self._abandon(slot, control, "time_limit")
            elif (
                control.cancel_observed
                and now - (control.cancel_seen_at or now) > settings.CANCEL_GRACE
            ):
                self._abandon(slot, control, "cancel")
        self._unpaid = [
            (control, why) for control, why in self._unpaid if not self._charge(control, why)
        ]

    def _abandon(self, slot: SlotState, control: SliceControl, why: str) -> None:
        """Give up on a slot's thread: charge its slice, hand its claims back, start a new thread."""
        if not control.abandon():
            return  # the handler returned just now: its outcome is being recorded
        slot.abandoned = True
        self._heartbeater.untrack(control)
        self.abandoned_threads += 1
        limit = conf.get().MAX_ABANDONED_THREADS
        log.error(
            "[%s %s] %s: abandoning thread %s (%d of %d abandoned threads allowed)",
            control.kind,
            control.id,
            "slice ran past its time limit"
            if why == "time_limit"
            else "handler ignored the cancel request past CANCEL_GRACE",
            slot.started_thread.name,
            self.abandoned_threads,
            limit,
        )
        if not self._charge(control, why):
            self._unpaid.append((control, why))
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

    def _charge(self, control: SliceControl, why: str) -> bool:
        """Write what an abandoned slice owes; False when its row is busy (try next tick)."""
        lock_ms = max(50, conf.ms(control.heartbeat_interval) // 4)
        if why == "time_limit":
            failure = time_limit_failure(control)
            handler = control.handler

            def write() -> object:
                # A verdict is left for the next claim to record (with the kind's mirror):
                # user code never runs on the supervisor.
                return store.fail_slice(
                    control.lease,
                    # Always set by time_limit_failure; the same fallback as executor._fail.
                    error_class=failure.error_class or ErrorClass.TRANSIENT.value,
                    code=failure.code,
                    message=failure.message,
                    max_failures=handler.setting("MAX_CONSECUTIVE_FAILURES"),
                    backoff_base_ms=conf.ms(handler.setting("RETRY_BACKOFF_BASE")),
                    backoff_max_ms=conf.ms(handler.setting("RETRY_BACKOFF_MAX")),
                    # Invariant 32: the same statement records the attempt.
                    outcome="time_limit",
                    started_at=claimed_at(control),
                    using=self.using,
                )
        else:

            def write() -> object:
                # Released with the cancel request standing: the reconciler ends it (with
                # its mirror) on its next pass.
                return store.release_lease(control.lease, delay_ms=0, using=self.using)

        try:
            db.with_lock_timeout(lock_ms, write, using=self.using)
        except (DatabaseError, InterfaceError) as error:
            log.info(
                "[%s %s] charge for %s deferred: %s",
                control.kind,
                control.id,
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
        kept = [entry for entry in slot.waiting if runner is not None and runner.holds(entry.id)]
        waiting = [entry for entry in slot.waiting if entry not in kept]
        slot.waiting[:] = kept
        self._complete_finished(slot)
        try:
            busy = [entry for entry in waiting if not self._released(entry, HAND_BACK_WAIT_MS)]
            # The claims found locked wait once more, all of them within HAND_BACK_BUSY_WAIT.
            deadline = time.monotonic() + HAND_BACK_BUSY_WAIT
            stuck = 0
            for entry in busy:
                left_ms = int(1000 * (deadline - time.monotonic()))
                # Past the deadline nothing waits again (a lock_timeout of 0 would wait forever).
                stuck += left_ms <= 0 or not self._released(entry, left_ms)
            if stuck:
                log.warning(
                    "slot %s: %d of its claims stayed locked and were not handed back; "
                    "their leases will expire",
                    slot.owner,
                    stuck,
                )
        except (DatabaseError, InterfaceError) as error:
            self._left_to_expire(slot, "hand its claims back", error)
        finally:
            for entry in waiting:
                self._heartbeater.untrack(entry)

    def _released(self, entry: HeldLease, wait_ms: int) -> bool:
        """Release an unstarted claim, uncharged; False when its row stayed locked past
        ``wait_ms`` (a lock timeout), so the caller may wait for it again.

        Another transaction may hold the row for a moment: the heartbeat's statement, or
        a claim whose snapshot still saw the row deliverable (READ COMMITTED locks the
        newer version to re-check it, until that claim commits). On a saturated server
        those last hundreds of milliseconds, and a claim left to its lease waits
        ``LEASE_TTL`` plus ``ORPHAN_GRACE`` (90 s by default) to run: 32 no-op jobs
        finished 99 s after a drain's first claim, the other 39,968 within 12 s
        (docs/performance.rst). A hand-back waits at most ``HAND_BACK_WAIT_MS`` for each
        claim, then ``HAND_BACK_BUSY_WAIT`` more for all the locked ones together.
        """
        if entry.lease_lost:
            return True
        # A cut connection is retried once on a new one: a claim not handed back waits
        # out its whole lease (a release that landed before the cut finds the lease gone
        # the second time, and changes nothing).
        release = functools.partial(store.release_lease, entry.lease, delay_ms=0, using=self.using)
        try:
            db.retry_after_a_cut(
                self.using,
                functools.partial(db.with_lock_timeout, wait_ms, release, using=self.using),
            )
        except OperationalError as error:
            if db.sqlstate(error) != db.LOCK_NOT_AVAILABLE:
                raise
            return False
        return True

    def _complete_finished(self, slot: SlotState) -> None:
        """Complete the slot's finished slices (one statement) and stop beating their leases.

        The claims still waiting their turn keep theirs: this runs at the end of a batch
        (``_hand_back``) and while a batch's last slice runs (``Worker._claim_ahead``,
        which may hand ``_complete`` to the worker's completer thread).
        """
        self._complete(slot, *self._take_finished(slot))

    @staticmethod
    def _take_finished(slot: SlotState) -> tuple[list[DeferredCompletion], list[HeldLease]]:
        """The slot's finished slices, its lists emptied: what one completion writes."""
        # Emptied in place: a slice still running holds the completions list and appends
        # to it when it finishes, so the list object must stay the slot's.
        completions, finished = list(slot.completions), list(slot.finished)
        slot.completions.clear()
        slot.finished.clear()
        return completions, finished

    def _complete(
        self, slot: SlotState, completions: list[DeferredCompletion], finished: list[HeldLease]
    ) -> None:
        try:
            if completions:
                complete_deferred(completions, using=self.using)
        except (DatabaseError, InterfaceError) as error:
            self._left_to_expire(slot, "complete its finished slices", error)
        finally:
            for entry in finished:
                self._heartbeater.untrack(entry)

    def _left_to_expire(self, slot: SlotState, what: str, error: Exception) -> None:
        """A slot's write about its claims failed: they wait out their leases, and the
        reconciler re-drives them."""
        log.warning(
            "slot %s: could not %s (%s); their leases will expire",
            slot.owner,
            what,
            type(error).__name__,
        )
        db.keep_connection_healthy(self.using)

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
        lost_before: set[int] = set()
        # Set before the slots' current slices are read: a slice that begins later
        # abandons itself (``Worker._on_start``), so none starts unseen by both.
        self._handing_back.set()
        faults.point("hand_back_begun")
        # Taken once, before the kills: a slot that sees its child die untracks its slice.
        holders = self._heartbeater.held()
        # And each slot's slice that has begun but is not tracked yet: its kill would
        # otherwise be recorded as the handler process's death, charged to a shutdown.
        tracked = {id(holder) for holder in holders}
        for slot in self._slots:
            control = slot.current
            if control is not None and not control.returned and id(control) not in tracked:
                holders.append(control)
        for holder in holders:
            if isinstance(holder, SliceControl):
                if holder.lease_lost:
                    lost_before.add(id(holder))
                holder.abandon()  # which marks it lost: lost_before says whether it was
        for slot in self._slots:
            if slot.runner is not None:
                slot.runner.kill_process()  # the slot's thread may be reading its pipes
        for slot in self._slots:
            if not slot.abandoned and (slot.waiting or slot.completions):
                self._hand_back(slot, take_back=False)  # the children are dead by now
        seen = {id(holder) for holder in holders}
        for holder in holders + [
            holder for holder in self._heartbeater.held() if id(holder) not in seen
        ]:
            self._heartbeater.untrack(holder)
            if id(holder) in lost_before if isinstance(holder, SliceControl) else holder.lease_lost:
                continue
            if isinstance(holder, SliceControl):
                holder.abandon()

                def write(h: Beatable = holder) -> object:
                    return store.yield_slice(h.lease, interrupted=True, using=self.using)
            else:

                def write(h: Beatable = holder) -> object:
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
