"""Idle slots and what wakes them: the poll, a held job's due moment, and LISTEN/NOTIFY.

A slot with nothing due sleeps until the poll interval passes, a held job it knows of
comes due, or a NOTIFY from a committed start arrives on the listener connection; one
wake-up wakes one sleeper, which chains to the next while it finds work. Polling alone
is correct (a transaction-mode pooler drops LISTEN; the pooler probe detects it); the
notification only makes it prompt.

``WakeUps`` is a part of ``Worker`` (a mixin), kept in its own module so that each
concern reads on its own; it uses the worker's sleepers, idle flags and stopping event.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time

from durable_jobs import conf, db, store
from durable_jobs.runtime import pooling
from durable_jobs.runtime.outage import OutageLog

log = logging.getLogger("durable_jobs.worker")

#: Seconds an idle slot sleeps past a held job's known due moment before it dequeues.
DUE_SLACK = 0.005

#: A listener connection up this long (seconds) has proved itself: its backoff resets.
LISTENER_HEALTHY = 30.0

#: Notifications arriving within this long (seconds) of the last wake-up this worker gave
#: a slot are folded into one more wake-up when it has passed. Every start's NOTIFY reaches
#: every worker process, and each woken slot runs a claim: under a steady stream of
#: single starts a fleet of P processes ran about 2P + 2 transactions per job (measured:
#: 3.9 at 1 x 4 slots, 11.2 at 4 x 4, 18.8 at 8 x 8, where the machine could no longer
#: keep up with the producer). A start that finds the worker quiet still wakes a slot at
#: once; one in a stream waits at most the cooldown, and the slot woken claims what has
#: come since (its claim grows while it comes back full, and a full claim wakes the next).
WAKE_COOLDOWN = 0.01

#: The cooldown doubles with each claim in a row that found nothing, up to this many
#: times (0.08 s): a worker whose slots keep losing the race for each start to other
#: workers stands back, and one that finds work answers at WAKE_COOLDOWN again.
WAKE_BACKOFF_STEPS = 3

#: A listener connection cut after this long up (seconds) is reconnected at once: it
#: worked, so the server is there; a reconnect loop is then at most one a second.
LISTENER_PROVED = 1.0


class WakeUps:
    """Sleeping, waking and listening (mixed into ``Worker``)."""

    # What this mixin uses of ``Worker``, which sets these in its ``__init__``.
    using: str
    identity: str
    concurrency: int
    stopping: threading.Event
    _wakes: list[threading.Event]  # one per slot
    _idle: list[bool]  # per slot: its last dequeue found nothing (guarded by _idle_lock)
    _claiming: list[bool]  # per slot, in a burst: a dequeue in flight (guarded by _idle_lock)
    _idle_lock: threading.Lock
    _sleepers: dict[int, None]  # slots asleep, oldest first (guarded by _idle_lock)
    # A chained wake-up's full claim, for the slot it woke (guarded by _idle_lock).
    _batch_hints: dict[int, int]
    _missed_wakes: int  # wake-ups that found no slot asleep (guarded by _idle_lock)
    _empty_claims: int  # claims in a row that found nothing (guarded by _idle_lock)
    _due_soon: list[float]  # a heap of monotonic moments held jobs become due
    _due_lock: threading.Lock
    _outage: OutageLog
    _schedules_changed: threading.Event  # set by a SCHEDULES_CHANGED notification

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

    def _claim_begins(self, number: int) -> None:
        """A burst slot is about to dequeue: until it answers, the burst is not over.

        Without this, a slot whose last dequeue found nothing reads as idle while its next
        one is in flight, and a neighbour could end the burst just before that dequeue
        returns a job, leaving the claim unrun until its lease expired.
        """
        with self._idle_lock:
            self._claiming[number] = True

    def _set_idle(self, number: int, idle: bool) -> bool:
        """Record what slot ``number``'s dequeue found; True once every slot's last dequeue
        found nothing and none is in flight: a burst run is then over."""
        with self._idle_lock:
            self._idle[number] = idle
            self._claiming[number] = False
            return all(self._idle) and not any(self._claiming)

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
                    self._outage.answered()
                    connected_at = time.monotonic()
                    self._wake_all()
                    probe.send()
                    last_wake, pending = 0.0, False
                    while not self.stopping.is_set():
                        cooldown = self._wake_cooldown()
                        timeout = (
                            max(0.0, last_wake + cooldown - time.monotonic()) if pending else 0.5
                        )
                        for notification in raw.notifies(timeout=timeout, stop_after=1):
                            if notification.payload == store.SCHEDULES_CHANGED:
                                self._schedules_changed.set()  # the scheduler's, not a slot's
                            elif not probe.seen(notification.payload):
                                pending = True
                        if pending and time.monotonic() - last_wake >= cooldown:
                            self._wake_one()
                            last_wake, pending = time.monotonic(), False
                        hearing = self._judge_probe(probe, hearing, listen_using, settings)
                        if probe.due():
                            probe.send()
                        if failures and time.monotonic() - connected_at > LISTENER_HEALTHY:
                            failures = 0
                except Exception as error:  # noqa: BLE001 - the listener must outlive any fault
                    if (
                        connected_at is not None
                        and time.monotonic() - connected_at >= LISTENER_PROVED
                        and db.is_connection_loss(error)
                    ):
                        # A connection that worked and was cut (pg_terminate_backend, a
                        # proxy): reconnect at once, since every wake-up is lost meanwhile.
                        # Backoff is for connections that fail at once (LISTENER_HEALTHY).
                        log.info("the listener's connection was cut; reconnecting")
                        failures = 0
                        continue
                    failures += 1
                    delay = min(30.0, 0.2 * 2**failures)
                    # One warning per outage for the whole worker (OutageLog), whoever
                    # notices first: the listener's own retries are detail after that.
                    self._outage.failed("the listener", error, delay)
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
        self,
        probe: pooling.Probe,
        hearing: bool | None,
        listen_using: str,
        settings: conf.Settings,
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

    def _claim_found(self, found: bool) -> None:
        """A slot's claim found work or nothing: what sets the wake-up cooldown."""
        with self._idle_lock:
            self._empty_claims = 0 if found else self._empty_claims + 1

    def _wake_cooldown(self) -> float:
        """WAKE_COOLDOWN, doubled for each claim in a row that found nothing (bounded)."""
        with self._idle_lock:
            return WAKE_COOLDOWN * 2 ** min(self._empty_claims, WAKE_BACKOFF_STEPS)

    def _wake_all(self) -> None:
        for wake in self._wakes:
            wake.set()

    # --- one wake-up per notification (no thundering herd) ---
    def _sleep(self, number: int, wake: threading.Event, timeout: float) -> int | None:
        """Sleep until woken or ``timeout``; not at all when a wake-up found nobody asleep.
        Return the batch of the full claim whose chained wake-up woke this slot, if one did.

        A notification that arrives while every slot is busy, or while this one is between
        an empty dequeue and its sleep, is kept as a missed wake-up: the next slot about to
        sleep dequeues once more instead, so no committed start waits out a poll interval.
        """
        with self._idle_lock:
            if self._missed_wakes:
                self._missed_wakes -= 1
                return None
            self._sleepers[number] = None
        try:
            wake.wait(timeout)
            wake.clear()
        finally:
            with self._idle_lock:
                self._sleepers.pop(number, None)
                batch = self._batch_hints.pop(number, None)
        return batch

    def _wake_one(self, *, chained: bool = False, batch: int | None = None) -> None:
        """Wake one sleeping slot for one notification, or (``chained``) for a full claim.

        PostgreSQL folds identical notifications of one transaction into one, so a
        transaction starting many jobs wakes one slot; a slot whose claim came back full
        wakes the next, so the whole batch is picked up, one slot more at a time. The
        claim's ``batch`` goes to the slot it wakes (``_sleep`` returns it).
        """
        with self._idle_lock:
            for number in self._sleepers:
                if not self._wakes[number].is_set():
                    if batch is not None:
                        self._batch_hints[number] = batch
                    self._wakes[number].set()
                    return
            if chained:
                return
            # Nobody asleep and not already woken: every slot is busy and dequeues again on
            # its own when its batch ends; remember it for a slot about to sleep.
            self._missed_wakes = min(self._missed_wakes + 1, self.concurrency)
