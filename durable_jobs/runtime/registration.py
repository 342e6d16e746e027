"""A worker process's entry in the live-worker list, kept up by a thread of its own.

Operators (``durable_jobs workers``, the admin) and ``explain`` ("no live worker serves
queue 'reprots'") read the list; nothing decides a job's fate from it: a job's liveness is
its lease. So this thread is best effort: it registers, renews the row every heartbeat
interval (with the kinds the process can run now), and deletes it on a clean stop; a
failed statement is retried at the next beat, and a worker killed outright leaves a row
whose beat expires after ``LEASE_TTL`` (listed by nobody, pruned by the next start).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from importlib import metadata

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, connections

from durable_jobs import conf, registry, store

log = logging.getLogger("durable_jobs.worker")


def package_version() -> str:
    try:
        return metadata.version("durable-jobs")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


class Registration:
    """Register ``identity`` now, beat it until ``stop()``, then remove it."""

    def __init__(
        self,
        identity: str,
        *,
        queues: list[str],
        slots: int,
        execution: str,
        using: str = DEFAULT_DB_ALIAS,
    ) -> None:
        self.identity = identity
        self.queues = queues
        self.slots = slots
        self.execution = execution
        self.using = using
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="durable-registration", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        settings = conf.get()
        registered = False
        try:
            while True:
                try:
                    if not registered or not store.beat_worker(
                        self.identity, kinds=registry.kinds(), using=self.using
                    ):
                        store.register_worker(
                            self.identity,
                            host=socket.gethostname(),
                            pid=os.getpid(),
                            version=package_version(),
                            queues=self.queues,
                            kinds=registry.kinds(),
                            slots=self.slots,
                            execution=self.execution,
                            ttl_ms=conf.ms(settings.LEASE_TTL),
                            using=self.using,
                        )
                        registered = True
                except (DatabaseError, InterfaceError) as error:
                    log.debug("worker %s: registration not renewed (%s)", self.identity, error)
                    connections[self.using].close()
                if self._stop.wait(settings.HEARTBEAT_INTERVAL):
                    break
            if registered:
                try:
                    store.unregister_worker(self.identity, using=self.using)
                except (DatabaseError, InterfaceError):
                    pass  # its beat expires after LEASE_TTL: listed by nobody
        finally:
            connections[self.using].close()
