"""Redis Streams with a consumer group, through redis-py.

Why Redis Streams over NATS JetStream: the worker is threaded and synchronous, and
nats-py is asyncio-only (each slot would need an event loop of its own, or one loop
thread bridged to every slot); redis-py is synchronous, thread-safe per connection pool
and the client the Redis project maintains. Streams give what the seed's delivery needs:
a consumer group hands each entry to one consumer, an entry stays pending until acked,
and ``XAUTOCLAIM`` gives a dead consumer's pending entries to a live one.

Delays: a sorted set per queue, scored by the due instant in milliseconds on the Redis
server's clock (``TIME``), moved into the stream by a script any consumer runs before it
reads; exact to the delay asked for, give or take a consumer's read cycle (at most a
second). A cancel can take a message back: ``XDEL`` for a stream entry, ``ZREM`` for a
scheduled one (``queue_job_id`` says which). An acked entry is deleted (``XDEL``) with
its ack, so the stream holds only what is not yet handled and a job's message never
outlives its row by more than the claim that consumed it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.exceptions

from durable_jobs.transports.base import (
    Broker,
    BrokerUnavailable,
    Message,
    QueueHealth,
    Received,
    close_quietly,
)

_FAILURES = (redis.exceptions.RedisError, OSError)
GROUP = "durable_jobs"
#: An entry delivered to a consumer and not acked for this long belongs to a consumer that
#: died between taking it and claiming (claiming takes milliseconds): another takes it over.
REDELIVER_AFTER_MS = 30_000
RECLAIM_EVERY = 5.0
SCHEDULED = "z:"

# Move due scheduled messages into the stream, atomically (the server's clock decides).
_MOVE_DUE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 100)
for _, member in ipairs(due) do
  redis.call('XADD', KEYS[1], '*', 'm', member)
  redis.call('ZREM', KEYS[2], member)
end
return #due
"""

# Schedule a message `delay` ms after the server's now.
_SCHEDULE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
return 1
"""


# Ack an entry and delete it, in one step: the stream keeps only what is not yet handled.
_ACK_AND_DELETE = """
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return redis.call('XDEL', KEYS[1], ARGV[2])
"""


class RedisStreams(Broker):
    name = "redis"

    def __init__(self, url: str, *, prefix: str, timeout: float) -> None:
        super().__init__(url, prefix=prefix, timeout=timeout)
        self._client: redis.Redis | None = None
        self._groups: set[str] = set()
        self._reclaimed_at = 0.0
        self.consumer = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"

    def scheduled_key(self, queue: str) -> str:
        return f"{self.key(queue)}.scheduled"

    def _open(self) -> redis.Redis:
        if self._client is None:
            # Every reply within BROKER_TIMEOUT, a publish's confirmation included; a
            # blocking read asks the server to answer well before that (``_receive``).
            self._client = redis.Redis.from_url(
                self.url,
                socket_timeout=self.timeout,
                socket_connect_timeout=self.timeout,
            )
        return self._client

    def _group(self, client: redis.Redis, stream: str) -> None:
        if stream in self._groups:
            return
        try:
            # From the stream's start: entries published before any consumer existed count.
            client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except redis.exceptions.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise
        self._groups.add(stream)

    @property
    def connected(self) -> bool:
        return self._client is not None

    def close(self) -> None:
        client, self._client = self._client, None
        self._groups.clear()
        close_quietly(client)

    def _failed(self, error: BaseException) -> BrokerUnavailable:
        self.close()
        text = str(error).strip().splitlines()
        return BrokerUnavailable(
            self.name, f"{type(error).__name__}: {text[0] if text else ''}"[:300]
        )

    # --- publishing ---
    def _publish(self, queue: str, message: Message, *, delay_ms: int) -> str:
        body = message.encode().decode()
        try:
            client = self._open()
            if delay_ms > 0:
                client.eval(_SCHEDULE, 1, self.scheduled_key(queue), delay_ms, body)
                return SCHEDULED + body
            # XADD returns once the server has the entry: Redis's publish confirmation.
            entry = client.xadd(self.key(queue), {"m": body})
        except _FAILURES as error:
            raise self._failed(error) from error
        return entry.decode() if isinstance(entry, bytes) else str(entry)

    # --- consuming ---
    def _receive(self, queues: Sequence[str], *, wait: float) -> Received | None:
        try:
            client = self._open()
            streams: dict[Any, Any] = {}
            for queue in queues:
                stream = self.key(queue)
                self._group(client, stream)
                client.eval(_MOVE_DUE, 2, stream, self.scheduled_key(queue))
                streams[stream] = ">"
            taken = self._reclaim(client, queues)
            if taken is None:
                block = int(min(wait, 1.0, self.timeout / 2) * 1000)
                reply = client.xreadgroup(
                    GROUP, self.consumer, streams, count=1, block=block if block > 0 else None
                )
                taken = _first(reply)
        except _FAILURES as error:
            raise self._failed(error) from error
        if taken is None:
            return None
        stream, entry_id, fields = taken
        body = fields.get(b"m") or fields.get("m") or b""
        return Received(
            queue=stream.removeprefix(self.prefix + "."),
            message=Message.decode(body),
            tag=(stream, entry_id),
        )

    def _reclaim(self, client: redis.Redis, queues: Sequence[str]) -> tuple[str, str, Any] | None:
        """An entry a dead consumer took and never acked, every few seconds (XAUTOCLAIM)."""
        now = time.monotonic()
        if now - self._reclaimed_at < RECLAIM_EVERY:
            return None
        self._reclaimed_at = now
        for queue in queues:
            stream = self.key(queue)
            reply = client.xautoclaim(
                stream, GROUP, self.consumer, REDELIVER_AFTER_MS, "0-0", count=1
            )
            claimed = reply[1] if len(reply) > 1 else []
            for entry_id, fields in claimed:
                if fields:  # a deleted entry leaves no fields
                    return stream, _text(entry_id), fields
        return None

    def ack(self, received: Received) -> None:
        stream, entry_id = received.tag
        try:
            self._open().eval(_ACK_AND_DELETE, 1, stream, GROUP, entry_id)
        except _FAILURES as error:
            raise self._failed(error) from error

    def requeue(self, received: Received) -> None:
        """Left pending for this consumer: XAUTOCLAIM hands it to another after a while."""

    def remove(self, queue: str, message_id: str) -> bool:
        try:
            client = self._open()
            if message_id.startswith(SCHEDULED):
                return bool(client.zrem(self.scheduled_key(queue), message_id[len(SCHEDULED) :]))
            return bool(client.xdel(self.key(queue), message_id))
        except _FAILURES as error:
            raise self._failed(error) from error

    # --- operators ---
    def health(self, queues: Sequence[str], *, peek: bool = True) -> list[QueueHealth]:
        report = []
        for queue in queues:
            try:
                client = self._open()
                stream = self.key(queue)
                self._group(client, stream)
                group = next(g for g in client.xinfo_groups(stream) if _text(g["name"]) == GROUP)
                first = client.xrange(stream, count=1)
                seconds, micros = client.time()
                oldest = None
                if first:
                    ms = int(_text(first[0][0]).split("-")[0])
                    oldest = max(0.0, seconds + micros / 1e6 - ms / 1000)
                pending = int(group.get("pending") or 0)
                # Acked entries are deleted: what the stream holds is either not yet
                # delivered or delivered and unacked (XINFO's "lag" is not kept exact
                # across deletions in Redis 7.0).
                report.append(
                    QueueHealth(
                        transport=self.name,
                        queue=queue,
                        reachable=True,
                        backlog=max(0, int(client.xlen(stream)) - pending),
                        delayed=int(client.zcard(self.scheduled_key(queue))),
                        unacked=pending,
                        oldest_age=oldest,
                    )
                )
            except _FAILURES as error:
                failed = self._failed(error)
                report.append(
                    QueueHealth(
                        transport=self.name, queue=queue, reachable=False, error=failed.reason
                    )
                )
        return report


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _first(reply: Any) -> tuple[str, str, Any] | None:
    for stream, entries in reply or []:
        for entry_id, fields in entries:
            return _text(stream), _text(entry_id), fields
    return None
