"""Paused queues, the operator's side (invariant 27): stop claims from a queue, start them again.

The pause is a row of its own (``store.pause_queue``) that the dequeue statement reads in
the same statement that claims, so every worker on every host honours it from its next
claim on; nothing here caches it. See docs/howto/pause-queues.rst.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS

from durable_jobs import conf, store, validation
from durable_jobs.exceptions import InvalidInput
from durable_jobs.states import QueuePause

#: The longest reason a pause keeps (the column's size).
MAX_PAUSE_REASON = 500


def _queue(queue: Any, settings: conf.Settings) -> str:
    validation.name("queue", queue)
    undeclared = conf.undeclared_queue(queue, settings)
    if undeclared is not None:
        raise InvalidInput("queue", undeclared)
    return str(queue)


def pause_queue(
    queue: str, *, reason: str | None = None, by: str | None = None, using: str = DEFAULT_DB_ALIAS
) -> QueuePause:
    """Stop every worker, on every host, from claiming jobs of ``queue``; return the pause.

    Invariant 27: honoured inside the dequeue statement, from the first claim that starts
    after this commits. Running slices finish or yield as usual; pending, handed-back and
    retrying jobs wait, uncharged; ``start()`` still stores new jobs on the queue. Pausing
    a paused queue keeps the first pause (its time, author and reason): the answer's
    ``newly_paused`` is False then. A queue outside ``DURABLE_JOBS['QUEUES']`` (when
    declared) is refused. Runs in the caller's transaction, like ``start()``.
    """
    queue = _queue(queue, conf.get())
    if by is not None:
        by = validation.key("by", by, max_length=200)
    if reason is not None:
        reason = validation.key("reason", reason, max_length=MAX_PAUSE_REASON)
    return store.pause_queue(queue, by=by, reason=reason, using=using)


def resume_queue(queue: str, *, using: str = DEFAULT_DB_ALIAS) -> QueuePause | None:
    """Let workers claim from ``queue`` again and wake the idle ones; return the pause it ended.

    None when the queue was not paused (nothing changed). The wake-up is the NOTIFY a
    ``start()`` sends, delivered when this commits. A paused queue since removed from
    ``DURABLE_JOBS['QUEUES']`` can still be resumed; any other undeclared name is refused.
    """
    validation.name("queue", queue)
    settings = conf.get()
    ended = store.resume_queue(queue, notify_channel=settings.NOTIFY_CHANNEL, using=using)
    if ended is None:
        _queue(queue, settings)
    return ended


def paused_queues(*, using: str = DEFAULT_DB_ALIAS) -> list[QueuePause]:
    """Return every paused queue, by name, with when, by whom and why it was paused."""
    return store.list_paused_queues(using=using)
