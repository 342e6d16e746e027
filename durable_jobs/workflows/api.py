"""Workflows, the public side: cancel a tree, send an event, read a job's children.

The handler's side (spawn, wait for children or an event, sleep) is on the slice context;
``start(after=[...])`` is ``durable_jobs.service.start``'s. See docs/workflows.rst.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from durable_jobs import conf, reads, store, validation
from durable_jobs.exceptions import JobNotFound
from durable_jobs.models import Job
from durable_jobs.service import _job_id, cancel, cancel_descendants, get, scope_of
from durable_jobs.states import Scope


def cancel_children(
    parent_id: Any, scope: Scope, *, by: str | None, using: str = DEFAULT_DB_ALIAS
) -> int:
    """Ask every live descendant of ``parent_id`` to cancel, in bounded batches; how many.

    ``service.cancel_descendants``: the parent itself is not touched (the failure policy
    ``cancel`` asks a waiting parent's siblings this way).
    """
    return cancel_descendants(parent_id, scope, by=by, using=using)


def cancel_tree(
    job_id: Any,
    *,
    scope: Scope | str | tuple | None = None,
    by: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Job:
    """The same as ``cancel``: the job and every live job it spawned (children, theirs, …).

    Kept as an alias from before ``cancel`` cancelled a job's descendants itself; its
    rules, errors and answer are ``cancel``'s.
    """
    return cancel(job_id, scope=scope, by=by, using=using)


def send_event(
    job: Any,
    name: str,
    payload: Any = None,
    *,
    scope: Scope | str | tuple | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> bool:
    """Send the event ``name`` to a live job, in the caller's transaction; True when kept.

    ``job`` is a job (or its id), or the idempotency key it was started with. The event
    is kept until the job consumes it (``job.received(name)`` inside ``job.fenced()``):
    an event sent before the job waits is not lost, and events of one name are kept in
    the order they were sent, each wait taking the oldest. A job waiting for ``name`` is
    woken at the caller's commit; a rollback sends nothing. False when the job has
    already finished (nothing is kept); ``JobNotFound`` when ``scope`` has no such job.
    """
    scope = scope_of(scope)
    validation.name("name", name)
    settings = conf.get()
    payload_json = validation.payload(
        "payload",
        payload,
        max_bytes=settings.MAX_PAYLOAD_BYTES,
        max_depth=settings.MAX_PAYLOAD_DEPTH,
    )
    target = _event_target(job, scope, using)
    return store.send_event(target, scope, name, payload_json, using=using) is not None


def _event_target(job: Any, scope: Scope, using: str) -> uuid.UUID:
    if isinstance(job, str):
        try:
            return uuid.UUID(job)
        except ValueError:
            found = store.find_by_idempotency_key(scope, validation.key("job", job), using=using)
            if found is None or found.organization_id != scope.organization:
                raise JobNotFound(job) from None
            return found.id
    target = _job_id(job)
    get(target, scope=scope, using=using)  # JobNotFound for another scope's job
    return target


def children(
    job_id: Any, *, scope: Scope | str | tuple | None = None, using: str = DEFAULT_DB_ALIAS
) -> list[Job]:
    """The jobs ``job_id`` spawned, in spawn-key order (``JobNotFound`` outside ``scope``)."""
    parent = get(job_id, scope=scope, using=using)
    found = Scope(tenant=parent.tenant_id, organization=parent.organization_id)
    return list(reads.children_of(parent.id, found, using=using))
