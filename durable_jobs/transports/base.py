"""What every broker transport shares: the message, the broker's interface, its errors.

Invariant 31: the broker only says "look at this job now". A message carries the job's
id, its scope and the delivery pair ``(continuation_seq, redrives)``; the row is the
truth, and a message claims only through ``store.claim``, whose WHERE clause refuses a
duplicate, a redelivery whose slice already ran, a straggler from an earlier epoch, and
a cancelled job. So a broker may deliver a message twice, late, or never: twice and
late claim nothing, and never is found by the stale-pending re-drive.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from durable_jobs.exceptions import DurableJobsError
from durable_jobs.states import Delivery, Scope

T = TypeVar("T")


class BrokerUnavailable(DurableJobsError):
    """A broker could not be reached, or did not confirm within ``BROKER_TIMEOUT``."""

    def __init__(self, transport: str, reason: str) -> None:
        self.transport = transport
        self.reason = reason
        super().__init__(f"the {transport} broker is unreachable: {reason}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One delivery of one job: what a consumer needs to claim it, and nothing else."""

    job_id: str
    tenant: str
    organization: str | None
    kind: str
    seq: int
    redrives: int

    @property
    def scope(self) -> Scope:
        return Scope(tenant=self.tenant, organization=self.organization)

    @property
    def delivery(self) -> Delivery:
        return Delivery(seq=self.seq, redrives=self.redrives)

    def encode(self) -> bytes:
        """JSON with a nonce, so two deliveries of one pair are two distinct messages."""
        fields = dataclasses.asdict(self)
        return json.dumps({**fields, "nonce": uuid.uuid4().hex}, sort_keys=True).encode()

    @classmethod
    def decode(cls, body: bytes | str) -> Message | None:
        """The message in ``body``; None for bytes this version cannot read (dropped, logged)."""
        try:
            raw = json.loads(body)
            return cls(
                job_id=str(raw["job_id"]),
                tenant=str(raw["tenant"]),
                organization=None if raw["organization"] is None else str(raw["organization"]),
                kind=str(raw["kind"]),
                seq=int(raw["seq"]),
                redrives=int(raw["redrives"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Received:
    """A message a consumer holds until it acks or requeues it."""

    queue: str
    message: Message | None  # None: unreadable bytes
    tag: Any  # the broker's handle for ack/requeue


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueHealth:
    """One broker queue, as an operator sees it (``stats``, the console, the metrics)."""

    transport: str
    queue: str
    reachable: bool
    backlog: int | None = None  # deliverable now, not yet taken by a consumer
    delayed: int | None = None  # scheduled for later (retries, yields, run_after)
    unacked: int | None = None  # taken by a consumer, not yet acked (claimed or died)
    oldest_age: float | None = None  # seconds the oldest deliverable message has waited
    error: str | None = None


class Broker(abc.ABC):
    """One thread's connection to one broker: not shared between threads (neither pika's
    nor a blocking Redis read is), so each slot and each publishing thread has its own."""

    name: str = ""

    def __init__(self, url: str, *, prefix: str, timeout: float) -> None:
        self.url = url
        self.prefix = prefix
        self.timeout = timeout

    def key(self, queue: str) -> str:
        """The broker-side name of ``queue``: the prefix keeps projects sharing a broker apart."""
        return f"{self.prefix}.{queue}"

    def publish(self, queue: str, message: Message, *, delay_ms: int) -> str:
        """Publish, confirmed by the broker; return its message id. BrokerUnavailable otherwise."""
        return self._once_more_if_stale(lambda: self._publish(queue, message, delay_ms=delay_ms))

    def receive(self, queues: Sequence[str], *, wait: float) -> Received | None:
        """Take at most one message from ``queues``, waiting up to ``wait`` seconds."""
        return self._once_more_if_stale(lambda: self._receive(queues, wait=wait))

    def _once_more_if_stale(self, attempt: Callable[[], T]) -> T:
        """Run ``attempt``; when it fails on a connection made earlier, once more on a new one.

        A connection that sat idle (a web thread between requests, a slot's connection
        during a slice of an hour, whose heartbeats nobody answered) may have been dropped
        by the broker: that is not an outage, and calling it one would log a WARNING and
        leave a start to the stale-pending pass. A failure on a fresh connection is one.
        """
        made_earlier = self.connected
        try:
            return attempt()
        except BrokerUnavailable:
            if not made_earlier:
                raise
        return attempt()  # the failed attempt closed the old connection

    @property
    @abc.abstractmethod
    def connected(self) -> bool:
        """Whether a connection was made (and not closed since): it may have gone stale."""

    @abc.abstractmethod
    def _publish(self, queue: str, message: Message, *, delay_ms: int) -> str:
        """One publish attempt (``publish``)."""

    @abc.abstractmethod
    def _receive(self, queues: Sequence[str], *, wait: float) -> Received | None:
        """One receive attempt (``receive``)."""

    @abc.abstractmethod
    def ack(self, received: Received) -> None:
        """The message was handled (claimed, or refused by the claim): the broker drops it."""

    @abc.abstractmethod
    def requeue(self, received: Received) -> None:
        """Leave the message for another consumer (a kind this worker cannot run)."""

    @abc.abstractmethod
    def remove(self, queue: str, message_id: str) -> bool:
        """Take a message back before delivery, when the broker can; False when it cannot."""

    @abc.abstractmethod
    def health(self, queues: Sequence[str], *, peek: bool = True) -> list[QueueHealth]:
        """Each queue's backlog, as far as this broker can tell; ``peek=False`` skips the
        oldest message's age where reading it means touching the message (RabbitMQ)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Drop the connection (the next call reconnects)."""


def close_quietly(resource: Any) -> None:
    """Close a connection that may already be broken: dropping it is all that is left."""
    if resource is None:
        return
    try:
        resource.close()
    except Exception:  # noqa: BLE001 - broken already; the next call reconnects
        pass
