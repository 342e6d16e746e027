"""The public API: start, get, list, cancel, redrive.

Beside it in the same layer: schedules (``durable_jobs.schedules.api``), paused queues
(``durable_jobs.queues``), workflows' trees and events (``durable_jobs.workflows.api``),
and flow limits with ``explain`` (``durable_jobs.limits.api``); the package re-exports
them all.

Code, the admin and the management commands all act through these functions, so a
rule holds the same way whoever acts. Every call takes a ``scope``; leaving it out
means the default tenant's tenant-wide scope, so single-tenant projects never think
about tenants.
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, models, transaction

from durable_jobs import (
    conf,
    db,
    ids,
    metrics,
    reads,
    registry,
    signals,
    store,
    validation,
)
from durable_jobs import unique as uniqueness
from durable_jobs.exceptions import (
    BatchTooLarge,
    IdempotencyConflict,
    IdempotencyInputMismatch,
    InvalidInput,
    JobNotFound,
    UnknownKind,
    WrongState,
)
from durable_jobs.limits import claims
from durable_jobs.models import Job
from durable_jobs.states import LIVE_STATUSES, Scope, Status
from durable_jobs.transports import publishing as transports
from durable_jobs.waits import grammar as waits_grammar

MAX_PRIORITY = 100


def scope_of(scope: Scope | str | tuple[str, str | None] | None) -> Scope:
    """Normalise a scope argument: None, a tenant id, ``(tenant, organization)`` or a Scope."""
    if scope is None:
        return Scope(tenant=conf.get().DEFAULT_TENANT)
    if isinstance(scope, str):
        scope = Scope(tenant=scope)
    elif isinstance(scope, tuple):
        if len(scope) != 2:
            raise InvalidInput("scope", "must be (tenant, organization)")
        scope = Scope(tenant=scope[0], organization=scope[1])
    if not isinstance(scope, Scope):
        raise InvalidInput(
            "scope", f"must be a Scope, a tenant id or a pair, got {type(scope).__name__}"
        )
    validation.name("scope.tenant", scope.tenant)
    if scope.organization is not None:
        validation.name("scope.organization", scope.organization)
    return scope


def _subject(subject: Any) -> tuple[str | None, str | None]:
    if subject is None:
        return None, None
    return _subject_pair(subject)


def _subject_pair(subject: Any) -> tuple[str, str]:
    """The (type, id) pair of a subject that is not None."""
    if isinstance(subject, models.Model):
        if subject.pk is None:
            raise InvalidInput("subject", "is an unsaved model instance")
        return subject._meta.label_lower, validation.key("subject", str(subject.pk))
    if isinstance(subject, tuple) and len(subject) == 2:
        return validation.key("subject type", subject[0], max_length=200), validation.key(
            "subject id", subject[1]
        )
    raise InvalidInput("subject", "must be a saved model instance or a (type, id) pair")


def _schedule(run_after: datetime | timedelta | float | None) -> tuple[datetime | None, int]:
    """Return ``(absolute instant, delay ms)`` for the insert.

    A ``timedelta`` or number of seconds is a duration added to the database's clock. An
    aware ``datetime`` is the caller's chosen instant, stored as given: it is data, not a
    reading of this process's clock (its bounds are checked against the database's clock
    by ``_bound_instants`` once the connection is known).
    """
    checked = validation.run_after(run_after, max_ahead=conf.get().MAX_RUN_AFTER)
    if checked is None:
        return None, 0
    if isinstance(checked, datetime):
        return checked, 0
    return None, conf.ms(checked)


def _bound_instants(prepared: list[dict[str, Any]], using: str) -> None:
    """Refuse ``run_after`` instants too far past or ahead, by the database's clock
    (invariant 2), with one read for a whole batch and none when no instant was given."""
    instants = [fields["run_at"] for fields in prepared if fields["run_at"] is not None]
    afters = [fields["wait_after"] for fields in prepared if fields.get("wait_after") is not None]
    if not instants and not afters:
        return
    now = db.database_now(using=using)
    for instant in instants:
        validation.run_after_instant(instant, now, max_ahead=conf.get().MAX_RUN_AFTER)
    ceiling = conf.get().WAIT_AFTER_MAX_AHEAD
    for position, instant in afters:
        # Invariant 16: a bound on what a start may schedule, not on the hold. An instant
        # already past is fine: it has simply cleared.
        try:
            ahead = (instant - now).total_seconds()
        except OverflowError:
            ahead = float("-inf")
        if ahead > ceiling:
            raise InvalidInput(
                f"wait_for[{position}]",
                f"'after' is {ahead / 86400:.1f} days ahead; the limit is "
                f"{ceiling / 86400:g} days (DURABLE_JOBS['WAIT_AFTER_MAX_AHEAD'])",
            )


def _prepare(
    kind: str,
    *,
    input: Any = None,
    subject: Any = None,
    lock_key: str | None = None,
    idempotency_key: str | None = None,
    meta: dict[str, Any] | None = None,
    queue: str | None = None,
    priority: int = 0,
    run_after: datetime | timedelta | float | None = None,
    total_count: int | None = None,
    created_by: str | None = None,
    wait_for: list[dict[str, str]] | None = None,
    wait_key: str | None = None,
    unique: uniqueness.Unique | bool | list[str] | tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Validate one start's arguments into the insert's fields; InvalidInput names the field.

    The unique key needs the scope too: ``_set_unique_key`` completes it.
    """
    settings = conf.get()
    validation.name("kind", kind)
    handler = registry.get(kind)
    if handler is None and settings.REQUIRE_REGISTERED_KINDS:
        raise UnknownKind(kind)
    limits = {"max_bytes": settings.MAX_PAYLOAD_BYTES, "max_depth": settings.MAX_PAYLOAD_DEPTH}
    input_json = validation.payload("input", input, **limits)
    if meta is not None and not isinstance(meta, dict):
        raise InvalidInput("meta", "must be a dict")
    meta_json = validation.payload("meta", meta, **limits)
    subject_type, subject_id = _subject(subject)
    run_at, delay_ms = _schedule(run_after)
    if queue is None:
        queue = (handler.queue if handler else None) or settings.DEFAULT_QUEUE
    validation.name("queue", queue)
    undeclared = conf.undeclared_queue(queue, settings)
    if undeclared is not None:
        raise InvalidInput("queue", undeclared)
    return {
        "id": ids.uuid7(),
        "kind": kind,
        "input": input_json,
        "meta": meta_json,
        "idempotency_key": None
        if idempotency_key is None
        else validation.key("idempotency_key", idempotency_key),
        "lock_key": None if lock_key is None else validation.key("lock_key", lock_key),
        "subject_type": subject_type,
        "subject_id": subject_id,
        "progress_job_id": None,
        "created_by": None
        if created_by is None
        else validation.key("created_by", created_by, max_length=200),
        "queue": validation.name("queue", queue),
        "priority": validation.integer("priority", priority, low=-MAX_PRIORITY, high=MAX_PRIORITY),
        "total_count": None
        if total_count is None
        else validation.count("total_count", total_count),
        "run_at": run_at,
        "delay_ms": delay_ms,
        **_wait_fields(wait_for, wait_key),
        "unique": _unique_of(handler, unique),
        "unique_key": None,
        "unique_period_ms": None,
        "unique_states": None,
    }


def _wait_fields(wait_for: Any, wait_key: Any) -> dict[str, Any]:
    """The wait columns of one start, validated (the grammar of ``durable_jobs.waits``)."""
    if wait_for is None:
        if wait_key is not None:
            raise InvalidInput(
                "wait_key", "needs wait_for: a wait key names the target a wait condition holds"
            )
        return {
            "wait_for": None,
            "wait_key": None,
            "wait_label": None,
            "wait_after": None,
            "wait_window_ms": 0,
        }
    settings = conf.get()
    stored = waits_grammar.validate(wait_for, profiles=settings.WAIT_PROFILES)
    after = next(
        (
            (position, waits_grammar.parse_instant(c["after"]))
            for position, c in enumerate(stored)
            if "after" in c
        ),
        None,
    )
    # A sibling that arrives just after the holder's wait cleared is coalesced for as long
    # as two checks of one condition can land apart: the backoff's settled cadence.
    base = max(settings.WAIT_CHECK_INTERVAL, settings.WAIT_CHECK_INTERVAL_FLOOR)
    return {
        "wait_for": db.dump_json(stored),
        "wait_key": None if wait_key is None else validation.wait_key("wait_key", wait_key),
        "wait_label": waits_grammar.label(stored),
        "wait_after": after,
        "wait_window_ms": conf.ms(max(settings.WAIT_CHECK_INTERVAL_CEILING, base)),
    }


def _unique_of(handler: registry.Handler | None, given: Any) -> uniqueness.Unique | None:
    """A start's uniqueness: its own ``unique`` (False: none), else its kind's default."""
    own = uniqueness.coerce("unique", given)
    if own is None:
        return handler.unique if handler is not None else None
    return own or None


def _set_unique_key(fields: dict[str, Any], scope: Scope) -> None:
    """Fill a prepared start's unique columns from its ``Unique`` and its scope (invariant 25)."""
    rule = fields["unique"]
    if rule is None:
        return
    given = None if fields["input"] is None else json.loads(fields["input"])
    fields["unique_key"] = uniqueness.key(
        rule, fields["kind"], scope.tenant, scope.organization, given
    )
    fields["unique_period_ms"] = rule.period_ms
    fields["unique_states"] = list(rule.states)


def start(
    kind: str,
    *,
    input: Any = None,
    scope: Scope | str | tuple[str, str | None] | None = None,
    subject: Any = None,
    lock_key: str | None = None,
    idempotency_key: str | None = None,
    meta: dict[str, Any] | None = None,
    queue: str | None = None,
    priority: int = 0,
    run_after: datetime | timedelta | float | None = None,
    total_count: int | None = None,
    created_by: str | None = None,
    wait_for: list[dict[str, str]] | None = None,
    wait_key: str | None = None,
    unique: uniqueness.Unique | bool | list[str] | tuple[str, ...] | None = None,
    after: Sequence[Any] | None = None,
    after_policy: str = "fail",
    using: str = DEFAULT_DB_ALIAS,
) -> Job:
    """Start a job in the caller's transaction and return it.

    Call it inside ``transaction.atomic()`` beside the domain rows it is about: the job
    exists exactly when they do, and the worker is woken only when the transaction
    commits (invariant 9). A second start with the same ``idempotency_key`` in the tenant
    returns the first job; a live job holding ``lock_key`` raises ``LockKeyHeld`` and
    leaves the caller's transaction usable.

    ``wait_for`` holds the job before its first slice until every condition has cleared
    (``{"after": instant}``, ``{"profile": name}``; see docs/waits.rst). A start whose
    ``wait_key`` a live job of the scope holds returns that job with ``coalesced`` True
    instead of starting a second run (invariant 22); every returned job has the flag.

    ``unique`` (True, a list of input keys, or a ``durable.Unique``; default: the kind's
    registration, ``False`` to turn that off) makes the start answer with the job of the
    same kind, scope and selected input that its key covers, flagged ``deduplicated``,
    instead of creating a second (invariant 25; see docs/unique.rst).

    ``after`` (jobs or ids of the same scope, which must exist: no cycle can be built)
    holds the job until they have all ended; ``after_policy`` says what a failed or
    cancelled one means: ``fail`` (the job ends ``failed``, code ``dependency_failed``) or
    ``run`` (it runs anyway). See docs/workflows.rst.
    """
    settings = conf.get()
    scope = scope_of(scope)
    dependencies = None if after is None else _dependencies(after, after_policy)
    fields = _prepare(
        kind,
        input=input,
        subject=subject,
        lock_key=lock_key,
        idempotency_key=idempotency_key,
        meta=meta,
        queue=queue,
        priority=priority,
        run_after=run_after,
        total_count=total_count,
        created_by=created_by,
        wait_for=wait_for,
        wait_key=wait_key,
        unique=unique,
    )
    _set_unique_key(fields, scope)
    fields["flow_key"] = claims.flow_key(fields, scope.tenant, scope.organization)
    _bound_instants([fields], using)
    if dependencies and transports.is_brokered(fields["queue"]):
        # Its hold is woken by its dependencies' terminal statements, which publish nothing.
        raise InvalidInput(
            "after",
            f"queue {fields['queue']!r} is delivered by a broker; a job started after "
            "others runs on a database queue",
        )
    if dependencies:
        result = _start_after(fields, scope, dependencies, after_policy, using)
    else:
        result = store.insert_job(
            fields, scope, notify_channel=settings.NOTIFY_CHANNEL, using=using
        )
    job = result.job
    job.coalesced = result.coalesced
    job.deduplicated = result.deduplicated
    if result.coalesced and job.kind != kind:
        # One target, one kind: answering a start of another kind with this job would
        # hide a caller's bug as surely as an idempotency key reused across kinds.
        raise InvalidInput(
            "wait_key",
            f"is held by job {job.id} of kind {job.kind!r}; a wait key names the "
            "target of one kind of job",
        )
    if (
        not result.created
        and not result.coalesced
        and not result.deduplicated
        and (job.kind != kind or job.organization_id != scope.organization)
    ):
        # The key is tenant-wide; answering with another organization's job would leak
        # it (so its id is not named either), and answering with a job of another kind
        # would hide a caller's bug.
        raise IdempotencyConflict(
            idempotency_key or "", job.id if job.organization_id == scope.organization else None
        )
    if (
        not result.created
        and not result.coalesced
        and not result.deduplicated
        and settings.IDEMPOTENCY_CHECKS_INPUT
        and not _same_input(job.input, fields["input"])
    ):
        raise IdempotencyInputMismatch(idempotency_key or "", job.id)
    if result.created:
        if transports.is_brokered(job.queue_name, settings):
            transports.publish_after_commit(
                job, delay_ms=transports.start_delay_ms(job, fields), using=using
            )
        metrics.emit("jobs_started", kind=kind)
        signals.job_started.send_robust(sender=Job, job=job)
    return job


def start_many(
    jobs: Iterable[Mapping[str, Any]],
    *,
    scope: Scope | str | tuple[str, str | None] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[uuid.UUID]:
    """Start many jobs in one statement, in the caller's transaction; return their ids in order.

    Each item holds ``start()``'s keyword arguments (``kind`` required), validated the same
    way before anything is written. All or nothing, with or without an outer
    ``transaction.atomic()``: a held lock key (or one used twice in the batch) raises
    ``LockKeyHeld``, an idempotency key naming another kind or organization's job raises
    ``IdempotencyConflict``, and either leaves no row and wakes nobody, while the caller's
    transaction stays usable. An idempotency key already used, even by a start racing
    this one, returns the existing job in its place; so does a unique key (``unique``, as
    for ``start()``) that a job holds, and a repeat of a key inside the batch answers with
    its first row's job. A batch bigger than
    ``MAX_BATCH_BYTES`` serialised raises ``BatchTooLarge`` before anything is written.
    """
    settings = conf.get()
    scope = scope_of(scope)
    prepared = []
    size = 0
    for position, spec in enumerate(jobs):
        spec = dict(spec)
        if "kind" not in spec:
            raise InvalidInput(f"jobs[{position}]", "needs a kind")
        unknown = set(spec) - _START_ARGUMENTS
        if unknown:
            raise InvalidInput(f"jobs[{position}]", f"unknown arguments {sorted(unknown)}")
        if spec.get("wait_for") is not None or spec.get("wait_key") is not None:
            raise InvalidInput(
                f"jobs[{position}]",
                "wait_for and wait_key are for start(): a held job's "
                "coalescing needs its own statement",
            )
        fields = _prepare(spec.pop("kind"), **spec)
        _set_unique_key(fields, scope)
        fields["flow_key"] = claims.flow_key(fields, scope.tenant, scope.organization)
        # Counted as the batch is read, so an oversized one is refused while holding no
        # more than the limit in memory. One job alone is never refused: start() takes it.
        size += _serialised_bytes(fields)
        if size > settings.MAX_BATCH_BYTES and position > 0:
            raise BatchTooLarge(size, settings.MAX_BATCH_BYTES, position + 1)
        prepared.append(fields)
    if not prepared:
        return []
    _bound_instants(prepared, using)
    # A transaction of its own (a savepoint inside the caller's): a refusal found only
    # after the insert, such as a key that names another organization's job, rolls the
    # whole batch back together with its NOTIFYs, and the caller's transaction carries on.
    with transaction.atomic(using=using):
        results = store.insert_jobs(
            prepared, scope, notify_channel=settings.NOTIFY_CHANNEL, using=using
        )
        for fields, result in zip(prepared, results, strict=True):
            if result.deduplicated:
                continue  # the holder of its unique key: same kind and scope by the key
            if not result.created and (
                result.kind != fields["kind"] or result.organization_id != scope.organization
            ):
                same_org = result.organization_id == scope.organization
                raise IdempotencyConflict(
                    fields["idempotency_key"] or "", result.id if same_org else None
                )
            if (
                not result.created
                and settings.IDEMPOTENCY_CHECKS_INPUT
                and not _same_input(result.input, fields["input"])
            ):
                raise IdempotencyInputMismatch(fields["idempotency_key"] or "", result.id)
    brokered = [
        (fields, result)
        for fields, result in zip(prepared, results, strict=True)
        if result.created and transports.is_brokered(fields["queue"], settings)
    ]
    if brokered:
        transports.publish_started(brokered, scope, using=using)
    created: dict[str, int] = {}
    for result in results:
        if result.created:
            created[result.kind] = created.get(result.kind, 0) + 1
    for kind, count in created.items():
        metrics.emit("jobs_started", count, kind=kind)
    return [result.id for result in results]


def _same_input(stored: Any, given_json: str | None) -> bool:
    """The stored input equals a start's (given as its validated JSON text)."""
    return stored == (None if given_json is None else json.loads(given_json))


#: What one job adds to a batch's serialised size besides its payloads and keys (its id,
#: the field names, numbers and an instant): an over-estimate, so the bound errs safe.
_ROW_OVERHEAD_BYTES = 400
_KEY_FIELDS = (
    "kind",
    "queue",
    "idempotency_key",
    "lock_key",
    "subject_type",
    "subject_id",
    "created_by",
    "unique_key",
)


def _serialised_bytes(fields: dict[str, Any]) -> int:
    """Bytes one prepared job adds to the batch ``store.insert_jobs`` sends as one parameter."""
    size = _ROW_OVERHEAD_BYTES
    for name in ("input", "meta"):  # already validated JSON text, embedded as it is
        if fields[name] is not None:
            size += len(fields[name].encode())
    for name in _KEY_FIELDS:  # at most 4 bytes a character in UTF-8, escapes included
        if fields[name] is not None:
            size += 4 * len(fields[name])
    return size


# What one item of start_many may hold: exactly _prepare's arguments, so the two never drift.
_START_ARGUMENTS = frozenset(inspect.signature(_prepare).parameters)


def get(
    job_id: Any, *, scope: Scope | str | tuple | None = None, using: str = DEFAULT_DB_ALIAS
) -> Job:
    """Return the job ``job_id`` of ``scope``; raise ``JobNotFound`` otherwise."""
    scope = scope_of(scope)
    parsed = _job_id(job_id)
    job = store.get_job(parsed, scope, using=using)
    if job is None:
        raise JobNotFound(job_id)
    return job


def list_jobs(
    *,
    scope: Scope | str | tuple | None = None,
    kind: str | None = None,
    status: str | Status | None = None,
    subject: Any = None,
    page: int = 1,
    page_size: int = 20,
    using: str = DEFAULT_DB_ALIAS,
) -> tuple[list[Job], int]:
    """Return ``(jobs, total)``: one page (at most 200) of the scope's jobs, newest first."""
    scope = scope_of(scope)
    if status is not None:
        status = str(status)
        if status not in {s.value for s in Status}:
            raise InvalidInput("status", f"must be one of {', '.join(s.value for s in Status)}")
    if kind is not None:
        validation.name("kind", kind)
    subject_pair = None
    if subject is not None:
        subject_pair = _subject_pair(subject)
    validation.integer("page", page, low=1, high=10**9)
    validation.integer("page_size", page_size, low=1, high=10**9)
    return reads.list_jobs(
        scope,
        kind=kind,
        status=status,
        subject=subject_pair,
        page=page,
        page_size=page_size,
        using=using,
    )


def cancel(
    job_id: Any,
    *,
    scope: Scope | str | tuple | None = None,
    by: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Job:
    """Ask for a job and every live job it spawned to be cancelled; return the job (invariant 8).

    Cancellation is a request: a running slice sees it at its next heartbeat and ends
    itself; a pending job is ended by the reconciler. The job's own request comes first,
    then its live descendants' (children, their children, …) a page of ``CANCEL_BATCH``
    per statement (``cancel_descendants``). Cancelling a child never cancels its parent: a
    parent waiting with policy ``fail`` or ``cancel`` ends ``child_failed`` on its own.

    A finished job raises ``WrongState`` (its descendants are left alone). A row held by a
    worker's transaction longer than ``OPERATOR_LOCK_WAIT`` raises ``JobBusy``, leaving
    the caller's transaction usable: behind the job's own row nothing changed; behind a
    descendant's the job and the descendants before it were asked, and calling ``cancel``
    again finishes the walk. Inside the caller's ``atomic()`` the job's row stays locked
    while its descendants are asked, so a child ending at that moment waits for the
    caller's commit; one that locked its own row first meets this call in a deadlock that
    PostgreSQL breaks after ``deadlock_timeout`` (the worker retries its write, or this
    call raises). In autocommit each statement is its own transaction and neither happens.
    """
    scope = scope_of(scope)
    parsed = _job_id(job_id)
    if by is not None:
        by = validation.key("by", by, max_length=200)
    lock_timeout_ms = conf.ms(conf.get().OPERATOR_LOCK_WAIT)
    job = store.request_cancel(parsed, scope, by=by, lock_timeout_ms=lock_timeout_ms, using=using)
    if job is None:
        existing = get(parsed, scope=scope, using=using)
        raise WrongState(existing.id, existing.status, "cancel", "it has already finished")
    if job.queue_job_id and job.lease_owner is None and transports.is_brokered(job.queue_name):
        transports.remove_after_commit(job, using=using)
    if job.children_total:
        cancel_descendants(
            job.id,
            Scope(tenant=job.tenant_id, organization=job.organization_id),
            by=by,
            lock_timeout_ms=lock_timeout_ms,
            using=using,
        )
    return job


#: How many children one cancel statement asks to cancel.
CANCEL_BATCH = 500


def cancel_descendants(
    parent_id: Any,
    scope: Scope,
    *,
    by: str | None,
    lock_timeout_ms: int | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> int:
    """Ask every live descendant of ``parent_id`` to cancel, a bounded page per statement.

    Each page is one statement (its own transaction when the caller has none), so a
    thousand children never make one giant transaction or pile of row locks. The parent
    itself is not touched. The walk descends into every live child with children, asked
    now or before, so running it again after it stopped part-way reaches what it missed.
    Returns how many were asked now. ``lock_timeout_ms``: see ``store.request_cancel_children``.
    """
    asked = 0
    parents = [parent_id]
    while parents:
        parent, after = parents.pop(), None
        while True:
            page = store.request_cancel_children(
                parent,
                scope,
                by=by,
                limit=CANCEL_BATCH,
                after=after,
                lock_timeout_ms=lock_timeout_ms,
                using=using,
            )
            asked += sum(1 for _, _, now in page if now)
            parents.extend(child for child, has_children, _ in page if has_children)
            if len(page) < CANCEL_BATCH:
                break
            after = page[-1][0]
    return asked


def redrive(
    job_id: Any,
    *,
    scope: Scope | str | tuple | None = None,
    force: bool = False,
    using: str = DEFAULT_DB_ALIAS,
) -> Job:
    """Re-issue a failed job under a new delivery, with fresh budgets (invariant 13).

    ``completed`` and ``cancelled`` are final. An ``unrecoverable`` failure needs
    ``force=True``. A running job is taken only once its lease has expired past the
    orphan grace (its worker is gone). A row held by a worker's transaction longer than
    ``OPERATOR_LOCK_WAIT`` raises ``JobBusy`` (nothing changed).
    """
    scope = scope_of(scope)
    parsed = _job_id(job_id)
    job = store.operator_redrive(
        parsed,
        scope,
        force=bool(force),
        grace_ms=conf.ms(conf.get().ORPHAN_GRACE),
        lock_timeout_ms=conf.ms(conf.get().OPERATOR_LOCK_WAIT),
        using=using,
    )
    if job is not None:
        if transports.is_brokered(job.queue_name):
            transports.publish_after_commit(job, using=using)  # its new pair (invariant 31)
        return job
    existing = get(parsed, scope=scope, using=using)
    if existing.status in (Status.COMPLETED.value, Status.CANCELLED.value):
        detail = "completed and cancelled jobs are final; start a new job instead"
    elif (
        "unrecoverable" in (existing.error_code, existing.error_class)
        and existing.status == Status.FAILED.value
    ):
        detail = "it failed as unrecoverable; re-drive with force"
    elif existing.status in LIVE_STATUSES:
        detail = "it is still live (a running job is taken only once its lease expired)"
    else:
        detail = "refused"
    raise WrongState(existing.id, existing.status, "redrive", detail)


def _job_id(job_id: Any) -> uuid.UUID:
    if isinstance(job_id, uuid.UUID):
        return job_id
    if isinstance(job_id, Job):
        return job_id.id
    try:
        return uuid.UUID(str(job_id))
    except ValueError:
        raise InvalidInput(
            "job_id", f"{validation.printable(str(job_id), limit=60)!r} is not a job id"
        ) from None


# --- workflows (durable_jobs.workflows) --------------------------------------------------

#: What a failed or cancelled dependency means to a job started ``after`` it.
AFTER_POLICIES = ("fail", "run")
#: The most jobs one start may wait for.
MAX_DEPENDENCIES = 1_000


def _dependencies(after: Any, policy: Any) -> list[uuid.UUID]:
    if isinstance(after, (str, bytes, Job)) or not isinstance(after, Iterable):
        raise InvalidInput("after", "must be a list of jobs or job ids")
    ids = list(dict.fromkeys(_job_id(job) for job in after))
    if len(ids) > MAX_DEPENDENCIES:
        raise InvalidInput("after", f"names {len(ids)} jobs; at most {MAX_DEPENDENCIES}")
    if policy not in AFTER_POLICIES:
        raise InvalidInput("after_policy", f"must be one of {', '.join(AFTER_POLICIES)}")
    return ids


def _start_after(
    fields: dict[str, Any], scope: Scope, after: list[uuid.UUID], policy: str, using: str
) -> store.InsertResult:
    """Insert the job and make it wait for ``after``, in one savepoint of the caller's
    transaction: no worker sees it before it is held, and a refusal leaves nothing."""
    with transaction.atomic(using=using):
        result = store.insert_job(
            fields, scope, notify_channel=conf.get().NOTIFY_CHANNEL, using=using
        )
        if not result.created:
            return result
        found = store.link_dependencies(result.job.id, after, scope, policy=policy, using=using)
        if found != len(after):
            # Only existing jobs of this scope can be named: no cycle, no leak (invariant 10).
            raise JobNotFound(", ".join(str(i) for i in after))
        held = store.get_job(result.job.id, scope, using=using)
        assert held is not None
        return store.InsertResult(held, created=True)
