"""What a transaction-mode pooler needs from a worker's connections (issue 14).

A session-level ``SET`` sticks to a pooled server connection and follows it to other
clients; a startup parameter is what PgBouncer tracks per client. These tests read
``pg_settings.source`` to tell the two apart, and run the listener's probe against a
real listener.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from durable_jobs import db
from durable_jobs.runtime import pooling

pytestmark = pytest.mark.django_db(transaction=True)

APPLICATION_NAME = "SELECT setting, source FROM pg_settings WHERE name = 'application_name'"


def _in_thread(name: str, work):
    out: dict = {}

    def run():
        try:
            out["value"] = work()
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            out["error"] = error
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join(30)
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_worker_thread_names_its_connection_in_the_startup_packet_not_with_set(monkeypatch):
    monkeypatch.setenv("PGAPPNAME", "durable-test-names")

    def work():
        pooling.name_connection("default")
        with connections["default"].cursor() as cursor:
            cursor.execute(APPLICATION_NAME)
            first = cursor.fetchone()
        connections["default"].close()  # a reconnect keeps the name
        with connections["default"].cursor() as cursor:
            cursor.execute(APPLICATION_NAME)
            return first, cursor.fetchone()

    first, again = _in_thread("durable-slot-7", work)
    assert first == ("durable-test-names/durable-slot-7", "client")
    assert again == first


def test_the_probe_comes_back_to_a_listener_and_is_not_a_wake_up():
    listener = pooling.new_raw_connection("default", "durable-listener")
    probe = pooling.Probe("default", "durable_jobs_probe_test", "test-identity")
    try:
        db.listen(listener, "durable_jobs_probe_test")
        probe.send()
        assert probe.check() is None  # sent, not back yet
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert len(payloads) == 1 and probe.seen(payloads[0]), payloads
        assert probe.check() is True
        assert not probe.seen("default"), "a queue name is a wake-up, never a probe"
        assert not probe.due(), "the next probe waits PROBE_EVERY"
    finally:
        probe.close()
        listener.close()


def test_a_probe_nobody_hears_is_reported_deaf_after_the_timeout(monkeypatch):
    monkeypatch.setattr(pooling, "PROBE_TIMEOUT", 0.2)
    probe = pooling.Probe("default", "durable_jobs_nobody_listens", "test-identity")
    try:
        probe.send()
        assert probe.check() is None
        time.sleep(0.3)
        assert probe.check() is False
    finally:
        probe.close()


def test_a_raw_connection_to_a_server_that_never_answers_gives_up(monkeypatch):
    """The listener's connect has a timeout: a half-open server cannot hold its thread."""
    import socket

    import psycopg

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # the kernel completes the handshake; nobody ever speaks
    monkeypatch.setattr(pooling, "RAW_CONNECT_TIMEOUT", 2)  # libpq's smallest
    settings = connections["default"].settings_dict
    monkeypatch.setitem(settings, "HOST", "127.0.0.1")
    monkeypatch.setitem(settings, "PORT", str(silent.getsockname()[1]))
    outcome: dict = {}

    def connect():
        try:
            outcome["raw"] = pooling.new_raw_connection("default", "durable-listener")
        except psycopg.OperationalError as error:
            outcome["error"] = error

    thread = threading.Thread(target=connect, daemon=True)
    try:
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), "the connect is still waiting on a server that never answers"
        assert "error" in outcome and "timeout" in str(outcome["error"]).lower(), outcome
    finally:
        silent.close()
