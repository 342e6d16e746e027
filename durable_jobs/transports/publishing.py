"""Publishing deliveries to a broker, and what the app asks of one (invariant 31).

The database stays the source of truth; a broker only carries "look at job X under the
delivery (seq, redrives) now". What this package does, and where:

* publish after commit: ``publish_after_commit`` (``start``, ``start_many``, the
  operator's redrive), each confirmed by the broker and recorded with
  ``store.record_enqueue`` so a cancel can remove it; ``publish_job`` for the worker's
  retries and yields and the reconciler's re-drives;
* consume through the fenced claim: ``durable_jobs.runtime.intake``;
* the lost publish: ``durable_jobs.runtime.reconciler``'s stale-pending pass re-drives
  the job (``store.redrive_pending``, the seed's budget) and publishes again;
* cancel: ``remove_after_commit`` takes the message back when the broker can (Redis);
  when it cannot (RabbitMQ), the claim refuses the cancelled job.

A publish that fails is logged once per outage (WARNING, then INFO when the broker
answers again) and never raised into the caller: the start committed, and the job is
found as stale pending once the broker is back. A start on a database-transport queue
never reaches this package (``is_brokered`` is a dictionary lookup).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, transaction

from durable_jobs import conf, store
from durable_jobs.db import database_now
from durable_jobs.states import Delivery, Scope
from durable_jobs.transports.base import (
    Broker,
    BrokerUnavailable,
    Message,
    QueueHealth,
    Received,
)

if TYPE_CHECKING:
    from durable_jobs.models import Job

__all__ = [
    "Broker",
    "BrokerUnavailable",
    "Message",
    "QueueHealth",
    "Received",
    "broker",
    "brokered_queues",
    "close_all",
    "describe",
    "health",
    "holds_nothing",
    "is_brokered",
    "publish_after_commit",
    "publish_job",
    "publish_new_after_commit",
    "publish_row",
    "publish_started",
    "start_delay_ms",
    "remove_after_commit",
    "stale_candidate_queues",
]

log = logging.getLogger("durable_jobs.transports")

_local = threading.local()
#: A new job's delivery.
FIRST_DELIVERY = Delivery(seq=0, redrives=0)


def is_brokered(queue: str, settings: conf.Settings | None = None) -> bool:
    """True when ``queue``'s jobs are delivered by a broker, not the job table."""
    return conf.transport_of(queue, settings or conf.get()) != "database"


def brokered_queues(settings: conf.Settings | None = None) -> dict[str, list[str]]:
    """The queues the setting names for each broker transport (a string setting names none)."""
    settings = settings or conf.get()
    chosen = settings.TRANSPORT
    found: dict[str, list[str]] = {}
    if isinstance(chosen, str):
        if chosen != "database" and settings.QUEUES:
            found[chosen] = list(settings.QUEUES)
        return found
    for queue, transport in sorted(chosen.items()):
        if transport != "database":
            found.setdefault(transport, []).append(queue)
    return found


def broker(transport: str) -> Broker:
    """This thread's connection to ``transport``'s broker (made on first use)."""
    settings = conf.get()
    brokers: dict[tuple, Broker] = getattr(_local, "brokers", None) or {}
    _local.brokers = brokers
    url = (settings.BROKER_URLS or {})[transport]
    key = (transport, url, settings.BROKER_PREFIX, settings.BROKER_TIMEOUT)
    found = brokers.get(key)
    if found is None:
        if transport == "rabbitmq":
            from durable_jobs.transports.amqp import RabbitMQ

            found = RabbitMQ(url, prefix=settings.BROKER_PREFIX, timeout=settings.BROKER_TIMEOUT)
        else:
            from durable_jobs.transports.streams import RedisStreams

            found = RedisStreams(
                url, prefix=settings.BROKER_PREFIX, timeout=settings.BROKER_TIMEOUT
            )
        brokers[key] = found
    return found


def close_all() -> None:
    """Drop every broker connection this thread made (a slot ending, a test's teardown)."""
    brokers: dict[tuple, Broker] = getattr(_local, "brokers", None) or {}
    _local.brokers = {}
    for found in brokers.values():
        found.close()


class BrokerOutages:
    """One WARNING per broker outage and one INFO when it ends, however many calls fail."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._lock = threading.Lock()
        self._since: dict[str, float] = {}

    def down(self, transport: str) -> bool:
        return transport in self._since

    def failed(self, error: BrokerUnavailable, consequence: str) -> None:
        with self._lock:
            first = error.transport not in self._since
            self._since.setdefault(error.transport, time.monotonic())
        if first:
            self._log.warning("%s; %s", error, consequence)
        else:
            self._log.debug("%s (still)", error)

    def answered(self, transport: str) -> None:
        if transport not in self._since:
            return
        with self._lock:
            since = self._since.pop(transport, None)
        if since is not None:
            self._log.info(
                "the %s broker is reachable again after %.1fs", transport, time.monotonic() - since
            )


#: This process's publishing side (web requests, the reconciler, the worker's re-publishes).
PUBLISH_OUTAGES = BrokerOutages(log)


def publish_job(
    job_id: object,
    *,
    queue: str,
    kind: str,
    tenant: str,
    organization: str | None,
    delivery: Delivery,
    delay_ms: int = 0,
    using: str = DEFAULT_DB_ALIAS,
) -> bool:
    """Publish one delivery and record its message id; False when the broker did not take it.

    Invariant 31: a publish that fails loses nothing. The row is pending (or a released
    lease) with this pair; the reconciler's stale-pending pass re-drives it under a new
    pair once the broker answers again, so this message, should it surface late, is a
    straggler the claim refuses.
    """
    transport = conf.transport_of(queue, conf.get())
    message = Message(
        job_id=str(job_id),
        tenant=tenant,
        organization=organization,
        kind=kind,
        seq=delivery.seq,
        redrives=delivery.redrives,
    )
    try:
        message_id = broker(transport).publish(queue, message, delay_ms=max(0, delay_ms))
    except BrokerUnavailable as error:
        PUBLISH_OUTAGES.failed(
            error, "jobs published meanwhile are re-driven as stale pending once it is back"
        )
        return False
    PUBLISH_OUTAGES.answered(transport)
    try:
        store.record_enqueue(job_id, message_id, queue, delivery, using=using)
    except DatabaseError:  # only the cancel's shortcut is lost: the claim still refuses
        log.warning("job %s: its broker message id could not be recorded", job_id, exc_info=True)
    return True


def _current_delivery(job: Job) -> dict[str, Any]:
    """What ``publish_job`` needs of a row as a statement returned it."""
    return {
        "queue": job.queue_name,
        "kind": job.kind,
        "tenant": job.tenant_id,
        "organization": job.organization_id,
        "delivery": Delivery(seq=job.continuation_seq, redrives=job.redrives),
    }


def publish_row(job: Job, *, delay_ms: int = 0, using: str = DEFAULT_DB_ALIAS) -> bool:
    """``publish_job`` for a row as a statement returned it."""
    return publish_job(job.id, **_current_delivery(job), delay_ms=delay_ms, using=using)


def publish_after_commit(job: Job, *, delay_ms: int = 0, using: str = DEFAULT_DB_ALIAS) -> None:
    """Publish ``job``'s current delivery once the caller's transaction commits (invariant 9).

    A rolled-back start publishes nothing; a crash between the commit and the publish is
    the lost publish the stale-pending pass exists for.
    """
    publish_new_after_commit(job.id, **_current_delivery(job), delay_ms=delay_ms, using=using)


def publish_new_after_commit(
    job_id: object,
    *,
    queue: str,
    kind: str,
    tenant: str,
    organization: str | None,
    delivery: Delivery = FIRST_DELIVERY,
    delay_ms: int = 0,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """``publish_job`` once the caller's transaction commits, never raising into it."""
    transaction.on_commit(
        partial(
            _publish_quietly,
            job_id,
            queue=queue,
            kind=kind,
            tenant=tenant,
            organization=organization,
            delivery=delivery,
            delay_ms=delay_ms,
            using=using,
        ),
        using=using,
    )


def _publish_quietly(job_id: object, **delivery: object) -> None:
    # The caller's transaction has committed: nothing raised here may reach them.
    try:
        publish_job(job_id, **delivery)  # type: ignore[arg-type]
    except Exception:
        log.exception("job %s: publishing its delivery failed", job_id)


def start_delay_ms(job: Job, fields: dict[str, Any]) -> int:
    """How long after its commit a new job's first message may be delivered: never sooner
    than its run time, since a claim reads no run time (the seed's reason). A relative
    delay is the one asked for; an instant is measured from the start's transaction
    (``created_at``, the database's clock), earlier than the commit, so never early."""
    if fields["run_at"] is None or job.created_at is None:
        return int(fields["delay_ms"])
    return max(0, round((fields["run_at"] - job.created_at).total_seconds() * 1000))


def publish_started(
    brokered: list[tuple[dict[str, Any], Any]], scope: Scope, *, using: str = DEFAULT_DB_ALIAS
) -> None:
    """Publish a batch's new broker-queue jobs after commit (``start_many``), each delayed to
    its run time by the database's clock (one reading, only when an instant was given)."""
    now = database_now(using=using) if any(f["run_at"] for f, _ in brokered) else None
    for fields, result in brokered:
        delay_ms = fields["delay_ms"]
        if fields["run_at"] is not None and now is not None:
            delay_ms = max(0, round((fields["run_at"] - now).total_seconds() * 1000))
        publish_new_after_commit(
            result.id,
            queue=fields["queue"],
            kind=fields["kind"],
            tenant=scope.tenant,
            organization=scope.organization,
            delay_ms=delay_ms,
            using=using,
        )


def remove_after_commit(job: Job, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Take a cancelled job's message back once the cancel commits, when the broker can."""
    if not job.queue_job_id:
        return
    transaction.on_commit(partial(_remove_quietly, job), using=using)


def _remove_quietly(job: Job) -> None:
    try:
        removed = broker(conf.transport_of(job.queue_name, conf.get())).remove(
            job.queue_name, str(job.queue_job_id)
        )
    except BrokerUnavailable as error:
        PUBLISH_OUTAGES.failed(error, "a cancelled job's message is refused by the claim instead")
        return
    log.debug("job %s: message %s removed: %s", job.id, job.queue_job_id, removed)


def stale_candidate_queues(settings: conf.Settings) -> list[str] | None:
    """The queues whose lost deliveries the reconciler re-drives: [] when no queue is on a
    broker, None when every queue is (a string TRANSPORT naming a broker)."""
    chosen = settings.TRANSPORT
    if isinstance(chosen, str):
        return [] if chosen == "database" else None
    return sorted(q for q, transport in chosen.items() if transport != "database")


def holds_nothing(queue: str) -> bool:
    """True when ``queue``'s broker answers and holds no message for it, delayed messages
    aside (those are due later than a stale job, whose run time is PENDING_TTL past)."""
    transport = conf.transport_of(queue, conf.get())
    try:
        found = broker(transport).health([queue], peek=False)
    except BrokerUnavailable:
        return False
    return all(q.reachable and not q.backlog and not q.unacked for q in found)


def health(queues: Sequence[str] | None = None) -> list[QueueHealth]:
    """Every broker queue's health, for ``stats``, the console and the metrics."""
    report: list[QueueHealth] = []
    for transport, names in sorted(brokered_queues().items()):
        wanted = [q for q in names if queues is None or q in queues]
        if wanted:
            report.extend(broker(transport).health(wanted))
    return report


def describe(found: QueueHealth) -> str:
    """One line for an operator: ``rabbitmq/bulk: reachable, backlog 3, ...``."""
    if not found.reachable:
        return f"{found.transport}/{found.queue}: UNREACHABLE ({found.error})"

    def figure(value: float | int | None, unit: str = "") -> str:
        return "?" if value is None else f"{value:.1f}{unit}" if unit else str(value)

    return (
        f"{found.transport}/{found.queue}: reachable, backlog {figure(found.backlog)}, "
        f"delayed {figure(found.delayed)}, unacked {figure(found.unacked)}, "
        f"oldest {figure(found.oldest_age, 's')}"
    )
