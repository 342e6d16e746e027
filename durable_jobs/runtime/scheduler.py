"""The scheduler: one leader across the fleet fires each schedule's ticks, once each.

Every worker runs ``run_as_leader`` on a thread of its own: it writes the schedules code
declares (``sync_schedules``), then takes part in the ``scheduler`` leadership (a
follower connects for a moment every RECONCILE_INTERVAL to try the lease; only the
leader keeps a connection)
(``store.acquire_leadership``, the leased row the reconciler uses under another name).
Its own leadership rather than a step of the reconciler's pass: a pass runs every
RECONCILE_INTERVAL and may spend half of it deleting finished jobs or waiting on a
mirror, while a tick should start at its instant; and a stall in one loop never delays
the other.

The leader sleeps until the earliest next tick (one statement on a partial index), the
lease renewal, or a NOTIFY saying the schedules changed, whichever comes first; so a
thousand schedules cost the fleet the same few statements a second as one, plus the
ticks themselves. Leadership is an economy, not the guarantee: each tick is fired by a
compare-and-set on the schedule's next tick, in one transaction with the tick's job,
whose idempotency key is derived from the schedule and the tick (invariant 24). A leader
killed between planning and firing a tick fired nothing, and its successor fires the
tick; a leader stopped past its lease that wakes after its successor fired finds the
row moved and starts nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from durable_jobs import conf, db, faults, metrics, registry, store
from durable_jobs.exceptions import ConfigurationError
from durable_jobs.models import Schedule
from durable_jobs.schedules import api, ticks

log = logging.getLogger("durable_jobs.scheduler")

LEADERSHIP = "scheduler"
#: Due schedules fired per statement that selects them; more are fired on the next turn.
BATCH = 100
#: The leader's lease lasts this many renewals (one every RECONCILE_INTERVAL).
LEASE_INTERVALS = 3
#: Seconds past a tick's instant the leader wakes, so clock_timestamp() has reached it.
SLACK = 0.005


@dataclasses.dataclass(slots=True)
class FireReport:
    started: int = 0  #: jobs started for ticks
    fired: int = 0  #: schedules advanced
    lost: int = 0  #: schedules another leader advanced first
    failed: int = 0  #: schedules whose firing raised (left due)


def fire_due(*, using: str = DEFAULT_DB_ALIAS) -> FireReport:
    """Fire every schedule whose tick has come (database clock); one transaction each."""
    report = FireReport()
    for row in store.select_due_schedules(kinds=registry.kinds(), limit=BATCH, using=using):
        try:
            started = fire(row, using=using)
        except DatabaseError:
            raise
        except Exception:
            log.exception("schedule %s: its tick could not start; trying again", row.name)
            report.failed += 1
            continue
        if started is None:
            report.lost += 1
        else:
            report.fired += 1
            report.started += started
    return report


def fire(row: Schedule, *, using: str = DEFAULT_DB_ALIAS) -> int | None:
    """Fire ``row``'s due tick(s): the jobs its catch-up policy starts, and its next tick.

    Returns how many jobs started, or None when another leader (or a pause, a removal)
    moved the row first: then nothing started, since the CAS and the starts are one
    transaction (invariant 24).
    """
    plan = ticks.plan(
        row.expression,
        row.zone,
        due=row.next_tick_at,
        now=db.database_now(using=using),
        catch_up=ticks.CatchUp.of(row.catch_up),
        grace=conf.get().SCHEDULE_GRACE,
    )
    faults.point("scheduler_between")  # planned, nothing written: a crash here fires nothing
    outermost = not connections[using].in_atomic_block
    with transaction.atomic(using=using):
        if outermost:
            # A leader stalled inside this transaction (a SIGSTOP, a paused VM) holds the
            # schedule's row: its successor's compare-and-set would wait on it, and so
            # would every starting worker's sync. The server ends the stalled session once
            # it has sat idle as long as the leader's lease lasts, by when the lease is lost
            # anyway. Not inside a caller's transaction (``testing.fire_schedules`` in a
            # test): the bound would outlive this block and end the caller's session.
            db.limit_idle_in_transaction(
                conf.ms(conf.get().RECONCILE_INTERVAL * LEASE_INTERVALS), using=using
            )
        advanced = store.advance_schedule(
            row.name,
            due=plan.due,
            following=plan.following,
            last_tick=plan.start[-1] if plan.start else None,
            missed=plan.missed,
            using=using,
        )
        if not advanced:
            log.info(
                "schedule %s: tick %s was fired (or the schedule paused) by another; nothing started",
                row.name,
                ticks.utc_iso(plan.due),
            )
            return None
        job = None
        for tick in plan.start:
            job = api.start_for(row, key=api.tick_key(row.name, tick), tick=tick, using=using)
        if job is not None:
            store.record_schedule_job(row.name, job.id, using=using)
        faults.point("scheduler_inside")  # advanced and started, not committed
    if plan.start:
        metrics.emit("schedule_ticks_started", len(plan.start), schedule=row.name)
    if plan.missed:
        metrics.emit("schedule_ticks_missed", plan.missed, schedule=row.name)
        log.warning(
            "schedule %s: %d missed tick(s) not started (catch_up %s)",
            row.name,
            plan.missed,
            row.catch_up,
        )
    return len(plan.start)


def run_as_leader(
    stop: threading.Event,
    identity: str,
    *,
    wake: threading.Event | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Write the declared schedules, then fire ticks whenever ``identity`` leads, until ``stop``.

    ``wake`` is set by the worker's listener when a NOTIFY says the schedules changed (a
    sync, a resume, a fast-forward), so the leader need not sleep out a tick it no longer
    knows the time of; polling at the lease's renewal cadence stays correct without it.
    """
    wake = wake or threading.Event()
    if not _synced(stop, using):
        return
    leading: int | None = None
    try:
        while not stop.is_set():
            wake.clear()
            interval = conf.get().RECONCILE_INTERVAL
            epoch, sleep = _turn(identity, interval, using)
            if epoch is not None and epoch != leading:
                log.info("scheduler leadership taken by %s (epoch %d)", identity, epoch)
            elif epoch is None and leading is not None:
                log.info("scheduler leadership lost by %s", identity)
            leading = epoch
            if leading is None:
                # A follower holds no connection between its tries: a fleet of W workers
                # keeps one for its scheduler, not W (max_connections is a shared budget).
                connections[using].close()
            if sleep > 0:
                wake.wait(sleep)
    finally:
        if leading is not None:
            try:
                store.resign_leadership(LEADERSHIP, identity, using=using)
            except DatabaseError:
                pass  # it expires by itself
        connections[using].close()


def _turn(identity: str, interval: float, using: str) -> tuple[int | None, float]:
    """One turn of the loop: renew (or try to take) leadership, fire what is due; return
    ``(epoch or None, seconds to sleep)``."""
    try:
        # A cut connection alone is retried at once: leadership is not given up for it.
        epoch = db.retry_after_a_cut(
            using,
            lambda: store.acquire_leadership(
                LEADERSHIP, identity, ttl_ms=conf.ms(interval * LEASE_INTERVALS), using=using
            ),
        )
        if epoch is None:
            return None, interval
        until = store.next_schedule_tick(kinds=registry.kinds(), using=using)
        if until is not None and until <= 0:
            report = fire_due(using=using)
            if report.failed:
                return epoch, interval  # try again at the renewal, not in a busy loop
            until = store.next_schedule_tick(kinds=registry.kinds(), using=using)
        if until is None:
            return epoch, interval
        return epoch, min(interval, max(0.0, until) + SLACK)
    except DatabaseError as error:
        log.warning("scheduler: database unavailable (%s)", type(error).__name__)
        connections[using].close()
        return None, interval


def _synced(stop: threading.Event, using: str) -> bool:
    """Write the declared schedules, retrying through an outage; False when stopping or refused."""
    while not stop.is_set():
        try:
            written, removed = api.sync_schedules(using=using)
        except ConfigurationError as error:
            log.error("scheduler: schedules refused, none will fire from this worker: %s", error)
            return False
        except DatabaseError as error:
            log.warning("scheduler: could not write schedules (%s); retrying", type(error).__name__)
            connections[using].close()
            stop.wait(conf.get().RECONCILE_INTERVAL)
            continue
        if written or removed:
            log.info("scheduler: %d schedule(s) written, %d marked removed", written, removed)
        return True
    return False
