"""RabbitMQ through pika's BlockingConnection: publisher confirms, delays by TTL and dead-letter.

Why pika: the RabbitMQ team's own Python client, synchronous and thread-confined, which
fits the worker's slot threads (one connection each) without an event loop; kombu adds a
portability layer (and its own retry and serialisation policy) over the same wire.

Delays: RabbitMQ 3.10 here has no delayed-message plugin, so a delayed delivery goes to
a delay queue whose *queue-level* TTL is the delay and whose dead-letter route is the
job's queue. A queue per delay, not one queue with per-message TTLs: RabbitMQ expires
messages only at a queue's head, so a 5-minute retry at the head would hold a 2-second
one behind it. Delays are rounded *up* to three significant digits (never sooner, since
a claim reads no run time; at most 1 % later), which bounds the number of delay queues;
each deletes itself (``x-expires``) a minute after it was last used. The stale-pending
pass waits ``PENDING_TTL`` past a job's run time, so at the default 15 minutes a delay
of up to a day is never mistaken for a lost delivery.

Acknowledgement: a message is acked once the claim committed (or refused it), never at
the end of the slice: a slice may run for hours, past RabbitMQ's consumer timeout, and
the row is the truth from the claim on. Prefetch is one message per slot's channel,
taken only while the slot is free.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pika  # type: ignore[import-untyped]
import pika.exceptions  # type: ignore[import-untyped]
from pika.adapters.utils.connection_workflow import (  # type: ignore[import-untyped]
    AMQPConnectorException,
)

from durable_jobs.transports.base import (
    Broker,
    BrokerUnavailable,
    Message,
    QueueHealth,
    Received,
    close_quietly,
)

# AMQPConnectorException: a connection that timed out in its handshake (a broker that
# accepts the connection and never answers) is raised as one, outside AMQPError.
_FAILURES = (pika.exceptions.AMQPError, AMQPConnectorException, OSError, AssertionError)

# pika logs every failed connection attempt at ERROR, with a traceback, from several of its
# modules: during an outage that is a screenful per retry per slot. This transport reports
# an outage itself, once (``BrokerOutages``); a project that configured pika's logger
# keeps its own choice.
if logging.getLogger("pika").level == logging.NOTSET:
    logging.getLogger("pika").setLevel(logging.CRITICAL)
DELAY_QUEUE_IDLE_MS = 60_000


def delay_bucket(delay_ms: int) -> int:
    """``delay_ms`` rounded up to three significant digits (at least 10 ms): never sooner,
    since a claim reads no run time and an early message would run its job early."""
    if delay_ms <= 10:
        return 10
    step = 10 ** max(0, int(math.log10(delay_ms)) - 2)
    return -(-delay_ms // step) * step


class RabbitMQ(Broker):
    name = "rabbitmq"

    def __init__(self, url: str, *, prefix: str, timeout: float) -> None:
        super().__init__(url, prefix=prefix, timeout=timeout)
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._declared: set[str] = set()

    # --- connection ---
    def _open(self) -> Any:
        if self._channel is not None and self._channel.is_open:
            try:
                # Answers the heartbeats missed while the connection sat idle, and finds a
                # connection the broker dropped meanwhile: a new one is made below.
                assert self._connection is not None
                self._connection.process_data_events(time_limit=0)
                return self._channel
            except _FAILURES:
                pass
        self.close()
        params = pika.URLParameters(self.url)
        params.socket_timeout = self.timeout
        params.stack_timeout = self.timeout
        params.blocked_connection_timeout = self.timeout
        params.connection_attempts = 1
        params.heartbeat = 30
        try:
            self._connection = pika.BlockingConnection(params)
            channel = self._connection.channel()
            channel.confirm_delivery()  # every publish waits for the broker's ack
            channel.basic_qos(prefetch_count=1, global_qos=True)
        except _FAILURES as error:
            self.close()
            raise BrokerUnavailable(self.name, _reason(error)) from error
        self._channel = channel
        return channel

    def _declare(self, channel: Any, name: str, arguments: dict[str, Any] | None = None) -> None:
        if name not in self._declared:
            channel.queue_declare(name, durable=True, arguments=arguments)
            self._declared.add(name)

    @property
    def connected(self) -> bool:
        return self._connection is not None

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        self._declared.clear()
        close_quietly(connection)

    def _failed(self, error: BaseException) -> BrokerUnavailable:
        self.close()
        return BrokerUnavailable(self.name, _reason(error))

    # --- publishing ---
    def _publish(self, queue: str, message: Message, *, delay_ms: int) -> str:
        channel = self._open()
        target = self.key(queue)
        message_id = uuid.uuid4().hex
        try:
            self._declare(channel, target)
            if delay_ms > 0:
                bucket = delay_bucket(delay_ms)
                delayed = f"{target}.delay.{bucket}"
                self._declare(
                    channel,
                    delayed,
                    {
                        "x-message-ttl": bucket,
                        "x-dead-letter-exchange": "",
                        "x-dead-letter-routing-key": target,
                        "x-expires": bucket + DELAY_QUEUE_IDLE_MS,
                    },
                )
                target = delayed
            channel.basic_publish(
                exchange="",
                routing_key=target,
                body=message.encode(),
                properties=pika.BasicProperties(
                    delivery_mode=pika.DeliveryMode.Persistent,
                    message_id=message_id,
                    content_type="application/json",
                    timestamp=int(time.time()),
                ),
                mandatory=True,  # an unroutable publish raises instead of vanishing
            )
        except _FAILURES as error:
            raise self._failed(error) from error
        return message_id

    # --- consuming ---
    def _receive(self, queues: Sequence[str], *, wait: float) -> Received | None:
        channel = self._open()
        got: list[Received] = []

        def on_message(ch: Any, method: Any, properties: Any, body: bytes) -> None:
            queue = method.routing_key.removeprefix(self.prefix + ".")
            got.append(Received(queue=queue, message=Message.decode(body), tag=method.delivery_tag))

        try:
            tags = []
            for queue in queues:
                self._declare(channel, self.key(queue))
                tags.append(channel.basic_consume(self.key(queue), on_message, auto_ack=False))
            deadline = time.monotonic() + wait
            while not got:
                assert self._connection is not None
                self._connection.process_data_events(
                    time_limit=max(0.0, min(0.25, deadline - time.monotonic()))
                )
                if time.monotonic() >= deadline:
                    break
            # One message at a time (prefetch 1 per channel): cancelling hands back
            # nothing but what pika buffered and never dispatched, which it rejects.
            for tag in tags:
                channel.basic_cancel(tag)
        except _FAILURES as error:
            raise self._failed(error) from error
        return got[0] if got else None

    def ack(self, received: Received) -> None:
        try:
            self._open().basic_ack(received.tag)
        except _FAILURES as error:
            # The claim already committed or refused: a redelivery claims nothing.
            raise self._failed(error) from error

    def requeue(self, received: Received) -> None:
        try:
            self._open().basic_nack(received.tag, requeue=True)
        except _FAILURES as error:
            raise self._failed(error) from error

    def remove(self, queue: str, message_id: str) -> bool:
        """RabbitMQ cannot take one message out of a queue: the claim refuses it instead."""
        return False

    # --- operators ---
    def health(self, queues: Sequence[str], *, peek: bool = True) -> list[QueueHealth]:
        try:
            channel = self._open()
        except BrokerUnavailable as error:
            return [
                QueueHealth(transport=self.name, queue=q, reachable=False, error=error.reason)
                for q in queues
            ]
        report = []
        for queue in queues:
            try:
                self._declare(channel, self.key(queue))
                declared = channel.queue_declare(self.key(queue), passive=True)
                report.append(
                    QueueHealth(
                        transport=self.name,
                        queue=queue,
                        reachable=True,
                        backlog=declared.method.message_count,
                        oldest_age=self._oldest_age(channel, queue) if peek else None,
                    )
                )
            except _FAILURES as error:
                self.close()
                report.append(
                    QueueHealth(
                        transport=self.name, queue=queue, reachable=False, error=_reason(error)
                    )
                )
        return report

    def _oldest_age(self, channel: Any, queue: str) -> float | None:
        """Age of the head message: AMQP's only look at it is to take it and put it back."""
        method, properties, _body = channel.basic_get(self.key(queue), auto_ack=False)
        if method is None:
            return None
        channel.basic_nack(method.delivery_tag, requeue=True)  # back at the head
        stamp = getattr(properties, "timestamp", None)
        return None if stamp is None else max(0.0, time.time() - stamp)


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]
