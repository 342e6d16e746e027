"""A small metrics hook: counters and gauges, sent to whatever sinks are registered.

durable_jobs emits, by name (labels in brackets):

* ``jobs_started`` [kind], ``jobs_completed`` / ``jobs_failed`` / ``jobs_cancelled`` [kind]
* ``jobs_parked`` [kind, reason], ``orphans_taken`` [kind]
* ``slices`` [kind, outcome] and ``slice_seconds`` (an observation) [kind, outcome]
* gauge ``stale_pending`` (pending jobs due longer than PENDING_TTL)
* ``schedule_ticks_started`` / ``schedule_ticks_missed`` [schedule]: jobs a schedule's
  ticks started, and ticks its catch-up policy did not start after downtime

A sink is any callable ``sink(kind, name, value, labels)`` where kind is "counter",
"gauge" or "observe". Sinks must be cheap and must not raise; a raising sink is logged
and ignored so metrics can never break a job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("durable_jobs.metrics")

Sink = Callable[[str, str, float, dict[str, str]], None]
_sinks: list[Sink] = []


def add_sink(sink: Sink) -> None:
    _sinks.append(sink)


def remove_sink(sink: Sink) -> None:
    if sink in _sinks:
        _sinks.remove(sink)


def _send(kind: str, name: str, value: float, labels: dict[str, str]) -> None:
    for sink in list(_sinks):
        try:
            sink(kind, name, value, labels)
        except Exception:
            log.exception("metrics sink %r failed", sink)


def emit(name: str, value: float = 1, **labels: str) -> None:
    """Add ``value`` to counter ``name``."""
    if _sinks:
        _send("counter", name, value, labels)


def gauge(name: str, value: float, **labels: str) -> None:
    if _sinks:
        _send("gauge", name, value, labels)


def observe(name: str, value: float, **labels: str) -> None:
    if _sinks:
        _send("observe", name, value, labels)
