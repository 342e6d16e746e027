"""What a worker needs to run behind a transaction-mode pooler (PgBouncer and the like).

A transaction-mode pooler hands each transaction whichever server connection is free, so
nothing may live in a server session between two transactions:

* **Connection names** travel in the startup packet (``application_name``, which
  PgBouncer tracks per client and re-applies to every server connection it lends), never
  as a session-level ``SET``, which would stick to a pooled server connection and label
  other clients' work with this worker's role.
* **LISTEN** does not survive: the session that ran it goes back to the pool, and the
  notifications PostgreSQL sends it reach nobody. The listener may connect through its
  own alias (``DURABLE_JOBS["LISTEN_DATABASE"]``, a direct connection), and it proves at
  start, and every ``PROBE_EVERY`` seconds, that a NOTIFY sent through the worker's own
  database comes back to it (``Probe``); when none does, the worker says so loudly
  instead of silently living on its poll interval.

Prepared statements are left to Django, which turns psycopg's automatic preparation off
(``prepare_threshold = None``) unless ``OPTIONS`` asks for it (``start()``'s insert follows
that same setting, see ``store._start_cursor``); advisory locks are not used.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

from django.db import connections

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("durable_jobs.worker")

#: How long a probe NOTIFY has to come back before the listener is declared deaf (seconds).
PROBE_TIMEOUT = 5.0
#: How often a listener sends a probe after the first one (seconds).
PROBE_EVERY = 300.0
#: A probe's payload starts with this; a space is never part of a queue name, so no
#: wake-up is ever mistaken for a probe, nor a probe for a wake-up.
PROBE_PREFIX = "probe "
#: How long the listener's and the probe's own connections may take to connect (seconds),
#: unless the database's ``OPTIONS`` set ``connect_timeout``: a server that accepts the
#: socket and never answers must not hold the listener thread (and with it every wake-up)
#: for good. The reconnect loop retries with its backoff.
RAW_CONNECT_TIMEOUT = 10


def role_name(role: str) -> str:
    """``<PGAPPNAME or durable_jobs>/<role>``, cut to PostgreSQL's 63 bytes."""
    return f"{os.environ.get('PGAPPNAME', 'durable_jobs')}/{role}"[:63]


def name_connection(using: str, role: str | None = None) -> None:
    """Name this thread's connection to ``using`` after ``role`` (default: the thread's name).

    Django keeps one connection object per thread and alias; its connection parameters
    are extended with ``application_name``, so every connect (and reconnect) of this
    thread sends the name in the startup packet. Nothing is SET in the session.
    """
    name = role_name(role or threading.current_thread().name)
    connection = connections[using]
    if getattr(connection, "durable_jobs_name", None) == name:
        return
    base = type(connection).get_connection_params

    def get_connection_params() -> dict[str, Any]:
        params = base(connection)
        params["application_name"] = name
        return params

    # Instance attributes of this one connection object: the method is shadowed here
    # only, and the name is a mark of ours that Django's class does not declare.
    vars(connection).update(get_connection_params=get_connection_params, durable_jobs_name=name)


def new_raw_connection(using: str, role: str) -> psycopg.Connection[Any]:
    """A new autocommit psycopg connection to ``using``, outside Django's per-thread one."""
    connection = connections[using]
    params = connection.get_connection_params()
    params["application_name"] = role_name(role)
    params.setdefault("connect_timeout", RAW_CONNECT_TIMEOUT)
    raw = connection.get_new_connection(params)
    raw.autocommit = True
    return raw


class Probe:
    """Proves that NOTIFYs sent through the worker's database reach the listener.

    ``send`` issues ``pg_notify`` on a short-lived connection to ``using`` (the path a
    ``start()`` takes), ``seen`` is told every payload the listener receives, and
    ``check`` says what became of the probe in flight: ``None`` (still waiting, or none
    due), ``True`` (it came back) or ``False`` (``PROBE_TIMEOUT`` passed without it).
    """

    def __init__(self, using: str, channel: str, identity: str) -> None:
        self.using = using
        self.channel = channel
        self.identity = identity
        self._raw: psycopg.Connection[Any] | None = None
        self._payload: str | None = None
        self._sent_at = 0.0
        self._next_at = 0.0
        self._answer: bool | None = None

    def due(self) -> bool:
        return self._payload is None and time.monotonic() >= self._next_at

    def send(self) -> None:
        from durable_jobs import db

        self._payload = f"{PROBE_PREFIX}{self.identity} {secrets.token_hex(4)}"
        self._sent_at = time.monotonic()
        try:
            # A connection of its own for the moment of the probe: a worker keeps no
            # extra connection open for it.
            self._raw = new_raw_connection(self.using, "durable-probe")
            db.notify_probe(self._raw, self.channel, self._payload)
        except Exception:
            self._payload = None
            self._next_at = time.monotonic() + PROBE_TIMEOUT
            raise
        finally:
            self.close()

    def seen(self, payload: str) -> bool:
        """True when ``payload`` is a probe (ours or another worker's): not a wake-up."""
        if not payload.startswith(PROBE_PREFIX):
            return False
        if payload == self._payload:
            self._payload = None
            self._next_at = time.monotonic() + PROBE_EVERY
            self._answer = True
        return True

    def check(self) -> bool | None:
        answer, self._answer = self._answer, None
        if (
            answer is None
            and self._payload is not None
            and time.monotonic() - self._sent_at > PROBE_TIMEOUT
        ):
            self._payload = None
            self._next_at = time.monotonic() + PROBE_EVERY
            answer = False
        return answer

    def close(self) -> None:
        if self._raw is not None:
            try:
                self._raw.close()
            except Exception as error:  # noqa: BLE001 - closing a broken connection
                log.debug("probe connection close failed: %s", error)
            self._raw = None
