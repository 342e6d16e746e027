"""Where a worker's claims come from: the job table for its database queues, a broker for
the others (DESIGN §6, invariant 31).

A slot that is free asks for one delivery and claims it through ``store.claim`` with the
message's ``(seq, redrives)`` and scope; the message is acked once the claim committed
or refused it. So prefetch is bounded by free slots (a busy slot holds no message), a
slice may run for days without an unacked message behind it, and a consumer that dies
between receiving and claiming leaves the message to the broker's redelivery, which
the fence makes harmless: a duplicate, a redelivery of a slice that already ran, a
straggler of an earlier epoch and a cancelled job all claim nothing, are acked and
dropped, and logged at DEBUG.

Invariant 27: a paused queue's messages are not read (the paused queues are read once per
claim step); one read just before a pause committed is refused by the claim, which reads
the pause with the dequeue's own predicate, and handed back to its broker, not dropped.

Invariant 14b: a message for a kind this worker cannot run is handed back to the broker
(RabbitMQ: ``basic_nack`` with requeue, so another consumer takes it; Redis: left
pending, so ``XAUTOCLAIM`` gives it to another consumer after a while) and the slot
rests for a poll interval; nothing is claimed, charged or lost.

A broker that does not answer is logged once (WARNING; INFO when it answers again), and
its queues are served from the job table meanwhile, exactly as database queues are,
until a dequeue finds them drained after it is back: the jobs started during the outage
were never published, and the stale-pending pass would otherwise wait out PENDING_TTL
for them.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db import DEFAULT_DB_ALIAS

from durable_jobs import conf, reads, registry, store
from durable_jobs.limits import claims
from durable_jobs.runtime.claim_floors import ClaimFloors
from durable_jobs.states import SliceOutcome
from durable_jobs.transports import publishing as transports

if TYPE_CHECKING:
    from durable_jobs.models import Job

log = logging.getLogger("durable_jobs.worker")

#: While a broker is down, how often a slot tries it again.
RETRY_BROKER_EVERY = 2.0
#: How long past its run time a broker's delayed message may still be on its way (a
#: RabbitMQ delay rounded up, a Redis read cycle): a burst run waits that long for it.
DELIVERY_SLACK_MS = 3000
#: What a slot does after a claim step that claimed nothing (``Intake.claim``).
AGAIN, REST, WAITED = "again", "rest", "waited"
#: Slice ends after which the job awaits no delivery (finished, or lost to another holder).
FINAL_OUTCOMES = frozenset(
    {
        SliceOutcome.COMPLETED,
        SliceOutcome.FAILED,
        SliceOutcome.CANCELLED,
        SliceOutcome.PARKED,
        SliceOutcome.LEASE_LOST,
        SliceOutcome.DEFERRED,
    }
)


class Intake:
    """The claim step of a worker's slots, shared by them (brokers are per thread)."""

    def __init__(self, queues: Sequence[str], *, using: str = DEFAULT_DB_ALIAS) -> None:
        settings = conf.get()
        self.using = using
        self.database_queues = [q for q in queues if not transports.is_brokered(q, settings)]
        self.brokers: dict[str, list[str]] = {}
        for queue in queues:
            if transports.is_brokered(queue, settings):
                self.brokers.setdefault(conf.transport_of(queue, settings), []).append(queue)
        self.outages = transports.PUBLISH_OUTAGES  # one WARNING per outage per process
        self._retry_at: dict[str, float] = {}
        self._draining: set[str] = set()  # back from an outage: the table still holds work
        self.floors = ClaimFloors()  # where the table's claims start reading each level

    def claim(self, owner: str, ttl_ms: int, *, limit: int, wait: float) -> tuple[list[Job], str]:
        """Claim due work; return the claims and what the slot does next when there are none:
        ``AGAIN`` (a message was handled, ask at once), ``REST`` (nothing due: idle, sleep
        a poll interval) or ``WAITED`` (idle, and a blocking read already waited it out)."""
        kinds = registry.kinds()
        from_table = self.database_queues + self._served_from_table()
        if from_table:
            claimed = self._from_table(from_table, owner, ttl_ms, kinds, limit)
            if claimed:
                return claimed, AGAIN
            self._draining.clear()  # whatever the outage left in the table has been taken
        answer = WAITED if self.brokers and not from_table else REST
        paused = self._paused_queues() if self.brokers else set()
        for transport, served in self.brokers.items():
            # Invariant 27: a paused queue's messages stay in its broker, unread.
            queues = [queue for queue in served if queue not in paused]
            if not queues or (
                self.outages.down(transport)
                and time.monotonic() < self._retry_at.get(transport, 0.0)
            ):
                answer = REST
                continue
            job, then = self._from_broker(
                transport, queues, owner, ttl_ms, kinds, wait=0.0 if from_table else wait
            )
            if job is not None:
                return [job], AGAIN
            if then != WAITED:
                answer = AGAIN if AGAIN in (then, answer) else REST
        return [], answer

    def claim_ahead(self, owner: str, ttl_ms: int, *, limit: int) -> list[Job]:
        """Claim due work from the job table while the slot's last claim still runs (see
        ``Worker._claim_ahead``); nothing when the slot also reads a broker, whose
        deliveries are taken one free slot at a time."""
        if self.brokers:
            return []
        return self._from_table(self.database_queues, owner, ttl_ms, registry.kinds(), limit)

    def _from_table(
        self, queues: list[str], owner: str, ttl_ms: int, kinds: Sequence[str], limit: int
    ) -> list[Job]:
        """The database transport's claim: through the flow keys while keyed jobs wait in
        ``queues`` (invariant 26), else the default claim, which looks for keyed work
        before it comes back short (``durable_jobs.limits.claims``)."""

        def dequeue(n: int, flow: str | None) -> list[Job]:
            floors = self.floors.for_claim()
            began = time.monotonic()
            took = None
            try:
                claimed = store.dequeue_from(
                    queues, owner, ttl_ms, kinds=kinds, limit=n, flow=flow,
                    floors=floors or (), using=self.using,
                )  # fmt: skip
                took = time.monotonic() - began
            finally:
                if floors is None:
                    self.floors.swept(took)
            self.floors.claimed(
                (job.queue_name, job.priority, due) for job, due in claimed if job.flow_key is None
            )
            return [job for job, _ in claimed]

        flow = claims.for_claim(queues, using=self.using)
        claimed = dequeue(limit, flow)
        if flow is None and len(claimed) < limit and claims.keyed_work(queues, using=self.using):
            claimed += dequeue(limit - len(claimed), claims.claim_settings())
        return claimed

    def _paused_queues(self) -> set[str]:
        """The paused queues, read once per claim step: one small read, no cache to go stale."""
        return {pause.queue for pause in store.list_paused_queues(using=self.using)}

    def _served_from_table(self) -> list[str]:
        return [
            queue
            for transport, queues in self.brokers.items()
            if self.outages.down(transport) or transport in self._draining
            for queue in queues
        ]

    def _from_broker(
        self,
        transport: str,
        queues: list[str],
        owner: str,
        ttl_ms: int,
        kinds: Sequence[str],
        *,
        wait: float,
    ) -> tuple[Job | None, str]:
        broker = transports.broker(transport)
        try:
            received = broker.receive(queues, wait=wait)
        except transports.BrokerUnavailable as error:
            self.outages.failed(
                error, f"its queues ({', '.join(queues)}) are served from the database meanwhile"
            )
            self._retry_at[transport] = time.monotonic() + RETRY_BROKER_EVERY
            self._draining.add(transport)
            return None, REST
        self.outages.answered(transport)
        if received is None:
            return None, WAITED if wait > 0 else REST
        message = received.message
        if message is None or not _is_uuid(message.job_id):
            log.warning("%s: dropped an unreadable message from %s", transport, received.queue)
            self._ack(broker, received)
            return None, AGAIN
        if message.kind not in kinds:
            broker.requeue(received)  # invariant 14b: another worker's to run
            log.debug(
                "job %s: kind %s is not registered here; left for another worker",
                message.job_id,
                message.kind,
            )
            return None, REST
        try:
            job = store.claim(
                message.job_id,
                message.scope,
                message.delivery,
                f"{owner}:{message.job_id}",
                ttl_ms,
                using=self.using,
            )
        except Exception:
            broker.requeue(received)  # the database did not answer: the message stays
            raise
        if job is None and store.get_paused_queue(received.queue, using=self.using) is not None:
            # Paused after this step read the paused queues: the claim refused it, and
            # the message goes back for whoever claims once the queue is resumed.
            broker.requeue(received)
            return None, REST
        self._ack(broker, received)
        if job is None:
            log.debug(
                "job %s: delivery (seq %d, redrives %d) claims nothing (a duplicate, a stale "
                "pair, a cancelled or finished job, or a live lease): dropped",
                message.job_id,
                message.seq,
                message.redrives,
            )
        return job, AGAIN

    def _ack(self, broker: transports.Broker, received: transports.Received) -> None:
        try:
            broker.ack(received)
        except transports.BrokerUnavailable as error:
            # The claim is committed (or refused): a redelivery of it claims nothing.
            self.outages.failed(error, "a redelivered message will be refused by its claim")

    def after_slice(self, job: Job) -> None:
        """Publish the next delivery of a broker queue's job that awaits one after its slice.

        A yield (seq + 1), a failed slice's retry (same pair, after its backoff), a hold,
        a lease handed back: whatever the slice's end wrote, the row says whether and when
        it is due again, by the database's clock (one read by primary key, broker queues
        only). A publish that fails is the stale-pending pass's to find.
        """
        if job.queue_name not in self._brokered_queue_names():
            return
        found = reads.awaiting_delivery(job.id, using=self.using)
        if found is not None:
            row, delay_ms = found
            transports.publish_row(row, delay_ms=delay_ms, using=self.using)

    def _brokered_queue_names(self) -> set[str]:
        return {q for queues in self.brokers.values() for q in queues}

    def close(self) -> None:
        """Drop this thread's broker connections."""
        transports.close_all()


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
