"""Every statement that writes a job row, and the reads that go with them.

Each writing statement is a compare-and-set whose WHERE clause *is* the guarantee: "only
the holder of epoch N may write this row", "only the delivery (seq, redrives) may claim
it", "only one live job per lock key". They are written out as SQL, one named constant
and one function each, so the predicate is what a reviewer reads. Nothing else in the
project writes a job row (invariant 1); the ORM model refuses to.

The fencing protocol, in short:

* A claim bumps ``lease_epoch`` and names a ``lease_owner`` unique to that claim. The pair
  is the lease. Every write a lease holder makes (heartbeat, checkpoint, yield, fail,
  release) requires ``status = 'running'`` and both halves of the pair; the terminal CAS
  requires the epoch alone (see ``complete``). Whoever takes a job over (a claim, an
  orphan take, an operator redrive) bumps the epoch, so the old holder's next write finds
  zero rows and the caller learns it lost the lease (invariant 4).
* Time is the database's (invariant 2). Only durations (milliseconds) cross into SQL.
  Lease arithmetic uses ``clock_timestamp()``: ``now()`` is the *transaction's* start, and
  a lease extended at the end of a long domain transaction from ``now()`` would be born
  expired. Bookkeeping stamps (``updated_at``) use ``now()``.
* Verdicts are decided inside the UPDATE that has the row locked, from the row's own
  counters, never from a value read earlier (invariant 3).
* Every function reports a zero-row result (``None``/``False``) for its caller to handle:
  lease lost, wrong state, not found. Nothing "carries on".

Why this module is long (about 2,000 lines, past the ~600 the rest of the package keeps):
it is the one home of every fenced statement (invariant 1), and each statement's WHERE
clause is its guarantee, so each stands here in full beside its function and the
comment on the race it closes — some sixty statements, most of them ten to thirty lines
of SQL. Splitting it by caller would scatter the fences a reviewer must read together
(the claim, the lease-holder writes and the terminal CAS share one protocol). What is
not a fenced statement lives elsewhere: the connection plumbing in ``db``, the scoped
reads in ``reads``, the console's figures in ``console.queries``. The sections follow a
job's life: start, claim and lease (with flow control's predicates, shared by the claim
and explain), finish, operator, reconcile and redrive, waits, the Tasks framework's
attempts, paused queues and flow keys, and the testing helpers' fast-forward.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, IntegrityError, OperationalError, transaction
from django.db.models import NOT_PROVIDED

from durable_jobs import conf
from durable_jobs.db import (
    JOB_COLUMN_NAMES,
    JOB_COLUMNS,
    JOB_FIELDS,
    LOCK_NOT_AVAILABLE,
    NOT_RUN,
    SET_LOCAL_LOCK_TIMEOUT,
    SessionStatement,
    array_literal,
    array_text,
    build_job,
    compact_sql,
    dump_json,
    execute,
    fetch_job,
    fetch_jobs,
    fetch_jobs_with,
    fetch_value,
    sqlstate,
    start_cursor,
    with_lock_timeout,
)
from durable_jobs.exceptions import JobBusy, LockKeyHeld, UniqueKeyHeld, WaitKeyHeld
from durable_jobs.models import (
    ATTEMPT_TABLE,
    EVENT_TABLE,
    FLOW_KEY_TABLE,
    IDEMPOTENCY_INDEX,
    LEADER_TABLE,
    LOCK_KEY_INDEX,
    NO_ORGANIZATION,
    PAUSED_QUEUE_TABLE,
    SCHEDULE_TABLE,
    TABLE,
    TASK_ATTEMPT_TABLE,
    UNIQUE_LIVE_INDEX,
    UNIQUE_WINDOW_INDEX,
    WAIT_KEY_INDEX,
    WORKER_TABLE,
    Job,
    Schedule,
)
from durable_jobs.states import (
    VERDICT_CODES,
    Delivery,
    FailReply,
    FlowKeyState,
    Lease,
    QueuePause,
    Scope,
)

T = TypeVar("T")

_FIELDS = JOB_FIELDS
_FIELD_NAMES = tuple(f.attname for f in _FIELDS)
_JSON_COLUMNS = frozenset(f.column for f in _FIELDS if f.get_internal_type() == "JSONField")
COLUMNS = JOB_COLUMNS
_J_COLUMNS = ", ".join(f"j.{f.column}" for f in _FIELDS)

#: The live statuses, as SQL.
LIVE = "('pending', 'running')"
_VERDICTS = "(" + ", ".join(f"'{code}'" for code in VERDICT_CODES) + ")"


#: A duration parameter (milliseconds) as an interval.
def _ms(param: str) -> str:
    return f"(%({param})s::bigint * interval '1 millisecond')"


#: The scope predicate. A null organization matches only a null organization: it is a
#: value ("tenant-wide"), not a wildcard, and reading it as one would leak jobs across
#: organizations (invariant 10).
SCOPE = "tenant_id = %(tenant)s AND organization_id IS NOT DISTINCT FROM %(organization)s"


def _running(alias: str = "") -> str:
    """``status = 'running'`` for a statement that finds its rows by primary key.

    ``(status = 'running') IS TRUE`` means the same for a NOT NULL column, but no index can
    serve it and it implies no partial index's predicate, so the planner's one way to the
    row is its id. Under a pinned horizon the indexes on status (durable_jobs_status_recent,
    durable_jobs_live_kind, durable_jobs_leased) keep an entry for every row version that
    was ever running, while the statistics count only the few rows running now; a planner
    that trusted them looked the row up by status and walked every one of those entries:
    the batched completion went from 2 ms to 100 ms a statement and throughput from 1,000
    to 100 jobs/s (issue #27, the horizon benchmark). HEARTBEAT_LEASES met it first.
    """
    column = f"{alias}." if alias else ""
    return f"({column}status = 'running') IS TRUE"


#: The lease-holder fence (invariant 4), on a row found by its id.
LEASE_HELD = f"{_running()} AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s"

#: A job held by a workflow wait with nothing scheduled (children, dependencies, an event
#: without a timeout): not late, just waiting; woken by a statement, never by a re-drive.
_FLOW_HELD = "(next_run_at IS NULL AND flow_wait IS NOT NULL)"


# ---------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------


def scope_params(scope: Scope) -> dict[str, Any]:
    """The parameters ``SCOPE`` names."""
    return {"tenant": scope.tenant, "organization": scope.organization}


def _lease(lease: Lease) -> dict[str, Any]:
    return {"id": lease.job_id, "owner": lease.owner, "epoch": lease.epoch, "ttl_ms": lease.ttl_ms}


# ---------------------------------------------------------------------------------------
# 1. Start (invariant 9): the caller's transaction, the unique indexes as the authority
# ---------------------------------------------------------------------------------------

# Where each column of a new job's row comes from, spelled out once: a plain parameter, a
# literal, the server (read back), the same value as another column, or nothing (NULL or
# the column's zero default). A start does not read its new row back whole: it builds the
# Job from its own parameters and the few values only the server knows (its clock, the
# jsonb forms, the casts). tests/integration/test_start.py proves, field by field, that
# this Job equals the row as stored, and that these lists cover every column once.

#: column -> the parameter that is its value
START_FROM_PARAMS = {
    "id": "id", "tenant_id": "tenant", "organization_id": "organization", "kind": "kind",
    "created_by": "created_by", "idempotency_key": "idempotency_key", "lock_key": "lock_key",
    "subject_type": "subject_type", "subject_id": "subject_id",
    "progress_job_id": "progress_job_id", "queue_name": "queue", "priority": "priority",
    "wait_key": "wait_key", "wait_label": "wait_label", "flow_key": "flow_key",
}  # fmt: skip
#: column -> its literal value
START_LITERALS = {"status": "pending"}
#: columns whose value the server decides, in RETURNING order
START_RETURNING = ("created_at", "input", "meta", "total_count", "next_run_at", "wait_for")
#: column -> the returned column it equals (one now() per statement)
START_SAME_AS = {"updated_at": "created_at", "pending_since": "created_at"}

INSERT_JOB = f"""
INSERT INTO {TABLE} (
    id, tenant_id, organization_id, kind, status, created_by, created_at, updated_at,
    input, meta, idempotency_key, lock_key, subject_type, subject_id, progress_job_id,
    queue_name, priority, flow_key, total_count, next_run_at, pending_since,
    wait_for, wait_key, wait_label
) VALUES (
    %(id)s, %(tenant)s, %(organization)s, %(kind)s, 'pending', %(created_by)s, now(), now(),
    %(input)s::jsonb, %(meta)s::jsonb, %(idempotency_key)s, %(lock_key)s,
    %(subject_type)s, %(subject_id)s, %(progress_job_id)s,
    %(queue)s, %(priority)s, %(flow_key)s, %(total_count)s::bigint,
    coalesce(%(run_at)s::timestamptz, clock_timestamp() + {_ms("delay_ms")}), now(),
    %(wait_for)s::jsonb, %(wait_key)s, %(wait_label)s
)
"""
INSERT_NEW_JOB = INSERT_JOB.rstrip() + "\nRETURNING " + ", ".join(START_RETURNING) + "\n"
# The wake-up rides in the RETURNING list: evaluated once for the one row, after it is in.
# Unprepared (Django's default), the server parses and plans the statement on every start,
# and this form costs it about a fifth less than a CTE joined to a LATERAL pg_notify (the
# start profile). The void it returns is the last column, which _new_job does not read.
INSERT_NEW_JOB_AND_NOTIFY = INSERT_NEW_JOB.rstrip() + ", pg_notify(%(channel)s, %(queue)s)\n"

#: The wake-up. NOTIFY issued inside the caller's transaction is delivered by PostgreSQL
#: at commit and dropped on rollback, so a rolled-back start wakes nobody (invariant 9).
NOTIFY = "SELECT pg_notify(%(channel)s, %(queue)s)"


def _unset_default(field: Any) -> Any:
    """A column the insert does not name: NULL, or its ``db_default`` (a literal or a Value)."""
    return (
        None
        if field.db_default is NOT_PROVIDED
        else getattr(field.db_default, "value", field.db_default)
    )


# Worked out once: a start fills a copy of the defaults from its parameters and the
# returned row (a column-by-column walk cost a start more than dumping its parameters).
_NEW_DEFAULTS = [
    START_LITERALS.get(column, _unset_default(f))
    for f, column in zip(_FIELDS, JOB_COLUMN_NAMES, strict=True)
]
_NEW_FROM_PARAMS = tuple(
    (i, START_FROM_PARAMS[column])
    for i, column in enumerate(JOB_COLUMN_NAMES)
    if column in START_FROM_PARAMS
)
#: (field position, position in the returned row, jsonb text to parse)
_NEW_FROM_ROW = tuple(
    (i, START_RETURNING.index(START_SAME_AS.get(column, column)), column in _JSON_COLUMNS)
    for i, column in enumerate(JOB_COLUMN_NAMES)
    if START_SAME_AS.get(column, column) in START_RETURNING
)


def _new_job(row: Sequence[Any], params: dict[str, Any], using: str) -> Job:
    """The ``Job`` an ``INSERT_NEW_JOB`` row stands for, as ``_to_job`` would build it."""
    values = _NEW_DEFAULTS.copy()
    for position, name in _NEW_FROM_PARAMS:
        values[position] = params[name]
    for position, back, is_json in _NEW_FROM_ROW:
        value = row[back]
        values[position] = json.loads(value) if is_json and isinstance(value, str) else value
    return build_job(values, using)


class InsertResult:
    """The job a start produced or found, whether this call created it, and whether it
    was found as the holder of the start's wait key (coalesced, invariant 22) or of its
    unique key (deduplicated, invariant 25)."""

    __slots__ = ("coalesced", "created", "deduplicated", "job")

    def __init__(
        self, job: Job, created: bool, coalesced: bool = False, deduplicated: bool = False
    ) -> None:
        self.job = job
        self.created = created
        self.coalesced = coalesced
        self.deduplicated = deduplicated


def insert_job(
    fields: dict[str, Any],
    scope: Scope,
    *,
    notify_channel: str | None,
    using: str = DEFAULT_DB_ALIAS,
) -> InsertResult:
    """Insert a job in the caller's transaction, or return the one its idempotency key names.

    The idempotency and lock-key lookups run *before* the insert: a failed statement
    aborts the caller's whole transaction, so learning about a conflict from a unique
    violation would leave their transaction unusable. The unique indexes stay the
    authority for the race between the lookup and the insert; that insert runs in a
    savepoint, so losing the race rolls back only the savepoint and the caller's
    transaction stays usable, and the winner can even be looked up and named
    (invariant 9).

    A start with a wait key that a live job holds (or whose wait cleared within
    ``fields["wait_window_ms"]``) returns that job, flagged coalesced; the wait-key index
    settles the race between two such starts the same way (invariant 22). A start with a
    unique key that a job in a covered status holds returns that job, flagged
    deduplicated, its two indexes settling the race (invariant 25). Precedence: the
    idempotency key's job, then the unique key's holder, then the wait key's, then the
    lock key's refusal.

    Raises ``LockKeyHeld`` when a live job holds the lock key.
    """
    # A caller that predates flow control (or starts a job no policy limits) may leave
    # the flow key out: such a job has none.
    params = {"flow_key": None, **fields, **scope_params(scope), "channel": notify_channel}
    insert = INSERT_NEW_JOB_AND_NOTIFY if notify_channel else INSERT_NEW_JOB
    key = fields.get("idempotency_key")
    lock_key = fields.get("lock_key")
    wait_key = fields.get("wait_key")
    unique_key = fields.get("unique_key")
    if key is None and lock_key is None and wait_key is None and unique_key is None:
        # No unique key to race on: one statement, atomic by itself, in the caller's
        # transaction when there is one.
        job = _insert_new(using, insert, params)
        return InsertResult(job, created=True)
    with transaction.atomic(using=using):
        if key is not None:
            existing = find_by_idempotency_key(scope, key, using=using)
            if existing is not None:
                return InsertResult(existing, created=False)
        if unique_key is not None:
            holder = find_unique_holder(scope, fields, using=using)
            if holder is not None:
                return InsertResult(holder, created=False, deduplicated=True)
            insert = INSERT_UNIQUE_JOB_AND_NOTIFY if notify_channel else INSERT_UNIQUE_JOB
        if wait_key is not None:
            holder = find_wait_holder(
                scope, wait_key, window_ms=fields.get("wait_window_ms", 0), using=using
            )
            if holder is not None:
                return InsertResult(holder, created=False, coalesced=True)
        if lock_key is not None:
            holder = find_live_by_lock_key(scope, lock_key, using=using)
            if holder is not None:
                raise LockKeyHeld(lock_key, holder.id)
        try:
            with transaction.atomic(using=using):
                job = (_insert_new if unique_key is None else _insert_unique_new)(
                    using, insert, params
                )
        except IntegrityError as error:
            constraint = getattr(getattr(error.__cause__, "diag", None), "constraint_name", None)
            # Whichever index refused, a job under this idempotency key is the answer: a
            # retried request racing its original loses on the lock key it also carries,
            # yet must get the original back, exactly as when the two run one after another.
            if constraint in _START_INDEXES and key is not None:
                existing = find_by_idempotency_key(scope, key, using=using)
                if existing is not None:
                    return InsertResult(existing, created=False)
            if constraint in _START_INDEXES and unique_key is not None:
                # Lost to a start that committed meanwhile (our insert waited for it): a
                # fresh statement sees it. One that rolled back let our insert through.
                holder = find_unique_holder(scope, fields, using=using)
                if holder is not None:
                    return InsertResult(holder, created=False, deduplicated=True)
            if constraint == WAIT_KEY_INDEX and wait_key is not None:
                # Lost the race for the target to a start that committed meanwhile: our
                # insert waited for it, and a fresh statement now sees it.
                holder = find_wait_holder(
                    scope, wait_key, window_ms=fields.get("wait_window_ms", 0), using=using
                )
                if holder is not None:
                    return InsertResult(holder, created=False, coalesced=True)
            if constraint == LOCK_KEY_INDEX and lock_key is not None:
                holder = find_live_by_lock_key(scope, lock_key, using=using)
                raise LockKeyHeld(lock_key, holder.id if holder else None) from error
            raise
    assert job is not None
    return InsertResult(job, created=True)


#: The start's unique indexes: losing a race on any of them may mean another start of
#: the same intent won, so each is answered the same way (see insert_job).
_START_INDEXES = (
    IDEMPOTENCY_INDEX,
    LOCK_KEY_INDEX,
    UNIQUE_LIVE_INDEX,
    UNIQUE_WINDOW_INDEX,
)


#: The two plain starts, prepared in the server session where the connection prepares
#: nothing itself and runs them in autocommit (``db.SessionStatement``): unprepared, the
#: server's parse, analysis and plan of the insert cost about as much as the rest of it.
_SESSION_STARTS = {
    sql: SessionStatement("durable_jobs_start", sql)
    for sql in (INSERT_NEW_JOB, INSERT_NEW_JOB_AND_NOTIFY)
}


def _insert_new(using: str, sql: str, params: dict[str, Any]) -> Job:
    session = _SESSION_STARTS.get(sql)
    row = NOT_RUN if session is None else session.fetchone(params, using)
    if row is NOT_RUN:
        with start_cursor(using) as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
    assert row is not None
    return _new_job(row, params, using)


# The bulk twin of INSERT_JOB: one statement for the whole batch, the rows travelling as
# one jsonb array (one parameter, parsed server-side).
INSERT_JOBS = f"""
INSERT INTO {TABLE} (
    id, tenant_id, organization_id, kind, status, created_by, created_at, updated_at,
    input, meta, idempotency_key, lock_key, subject_type, subject_id,
    queue_name, priority, flow_key, total_count, next_run_at, pending_since
)
SELECT r.id, %(tenant)s, %(organization)s, r.kind, 'pending', r.created_by, now(), now(),
       r.input, r.meta, r.idempotency_key, r.lock_key, r.subject_type, r.subject_id,
       r.queue, r.priority, r.flow_key, r.total_count,
       coalesce(r.run_at, clock_timestamp() + r.delay_ms * interval '1 millisecond'), now()
  FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(
       id uuid, kind text, created_by text, input jsonb, meta jsonb, idempotency_key text, lock_key text,
       subject_type text, subject_id text, queue text, priority smallint, flow_key text,
       total_count bigint, run_at timestamptz, delay_ms bigint)
RETURNING id
"""

FIND_BY_IDEMPOTENCY_KEYS = f"""
SELECT idempotency_key, id, kind, organization_id, input FROM {TABLE}
 WHERE tenant_id = %(tenant)s AND idempotency_key = ANY(%(keys)s)
"""

FIND_LIVE_BY_LOCK_KEYS = f"""
SELECT {COLUMNS} FROM {TABLE}
 WHERE tenant_id = %(tenant)s
   AND coalesce(organization_id, '{NO_ORGANIZATION}') = coalesce(%(organization)s, '{NO_ORGANIZATION}')
   AND lock_key = ANY(%(lock_keys)s)
   AND status IN {LIVE}
"""


class BulkInsertResult:
    """One row of a bulk start: the job's id, whether this call created it, and, for a
    job found by its idempotency key, that job's kind, organization and input (to check
    them); ``deduplicated`` when the holder of the row's unique key answered it."""

    __slots__ = ("created", "deduplicated", "id", "input", "kind", "organization_id")

    def __init__(
        self,
        id: Any,
        created: bool,
        kind: str,
        organization_id: str | None,
        input: Any = None,
        deduplicated: bool = False,
    ) -> None:
        self.id, self.created, self.kind, self.organization_id = id, created, kind, organization_id
        self.input = input
        self.deduplicated = deduplicated


def insert_jobs(
    rows: list[dict[str, Any]],
    scope: Scope,
    *,
    notify_channel: str | None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[BulkInsertResult]:
    """Insert many jobs with one statement, in the caller's transaction (all or nothing).

    The same guarantees as ``insert_job``, batch-wide: idempotency keys already used
    answer with their job; a lock key held by a live job, or used twice in the batch,
    raises ``LockKeyHeld`` before anything is inserted; the unique indexes settle races,
    inside a savepoint so the caller's transaction stays usable. A start racing this one
    on a key makes our insert wait for it and then fail at the index: the insert is then
    planned again from a fresh look, which sees the winner (its transaction has ended),
    so a batch losing an idempotency race answers with the winner's job exactly as
    ``insert_job`` does, and one losing a lock-key race names the holder. Unique keys
    likewise (invariant 25): a row whose key is held answers with the holder, flagged
    deduplicated, and a repeat of a key inside the batch with the key's first row.
    """
    for row in rows:
        row.setdefault("flow_key", None)  # no key given: not limited (as in insert_job)
    unique = any(row.get("unique_key") is not None for row in rows)
    sql, columns = (
        (INSERT_UNIQUE_JOBS, _BULK_UNIQUE_FIELDS) if unique else (INSERT_JOBS, _BULK_FIELDS)
    )
    with transaction.atomic(using=using):
        for attempt in range(1, _RACE_ATTEMPTS + 1):
            answers, to_insert = _plan_bulk_insert(rows, scope, using)
            try:
                with transaction.atomic(using=using):
                    inserted: set[Any] = set()
                    if to_insert:
                        params = {**scope_params(scope), "rows": _rows_json(to_insert, columns)}
                        with execute(using, sql, params) as cursor:
                            inserted = {row[0] for row in cursor}
                break
            except IntegrityError as error:
                constraint = getattr(
                    getattr(error.__cause__, "diag", None), "constraint_name", None
                )
                if constraint in _START_INDEXES and attempt < _RACE_ATTEMPTS:
                    continue  # lost a race: look again (the winner is visible now) and retry
                if constraint == LOCK_KEY_INDEX:
                    raise LockKeyHeld("(one of the batch's lock keys)") from error
                raise
        if notify_channel:
            for queue in sorted({row["queue"] for row in to_insert}):
                fetch_value(using, NOTIFY, {"channel": notify_channel, "queue": queue})
    assert len(inserted) == len(to_insert)
    return [
        answers[row["id"]]
        if row["id"] in answers
        else BulkInsertResult(row["id"], True, row["kind"], scope.organization)
        for row in rows
    ]


def _json(value: Any) -> Any:
    """A jsonb value as Python: raw cursors (and the batch's own rows) carry it as text."""
    return json.loads(value) if isinstance(value, str) else value


#: Tries of a batch insert that keeps losing races. Each lost race shows one more winner
#: to the next look, so a few suffice; a caller whose snapshot cannot see winners
#: (REPEATABLE READ) gets the index's error after them, as from ``insert_job``.
_RACE_ATTEMPTS = 3


def _plan_bulk_insert(
    rows: list[dict[str, Any]], scope: Scope, using: str
) -> tuple[dict[Any, BulkInsertResult], list[dict[str, Any]]]:
    """Return the answers of the batch's rows that insert nothing (by row id), and the
    rows to insert.

    A row whose idempotency key names a job answers with it; then a row whose unique key
    a job holds answers with the holder. A key's first occurrence in the batch is
    inserted and its repeats answer with it. Raises ``LockKeyHeld`` when a row to insert
    carries a lock key held by a live job or by another row of the batch.
    """
    keys = [row["idempotency_key"] for row in rows if row["idempotency_key"] is not None]
    existing: dict[str, BulkInsertResult] = {}
    if keys:
        with execute(
            using, FIND_BY_IDEMPOTENCY_KEYS, {"tenant": scope.tenant, "keys": keys}
        ) as cursor:
            existing = {
                key: BulkInsertResult(job_id, False, kind, org, _json(value))
                for key, job_id, kind, org, value in cursor
            }
    unique_rows = [row for row in rows if row.get("unique_key") is not None]
    holders = find_unique_holders(scope, unique_rows, using=using) if unique_rows else {}
    answers, to_insert = _answer_rows(rows, existing, holders, scope)
    lock_keys = [row["lock_key"] for row in to_insert if row["lock_key"] is not None]
    if len(lock_keys) != len(set(lock_keys)):
        twice = next(key for key in lock_keys if lock_keys.count(key) > 1)
        raise LockKeyHeld(twice)
    if lock_keys:
        lock_holders = fetch_jobs(
            using, FIND_LIVE_BY_LOCK_KEYS, {**scope_params(scope), "lock_keys": lock_keys}
        )
        if lock_holders:
            raise LockKeyHeld(lock_holders[0].lock_key, lock_holders[0].id)
    return answers, to_insert


def _answer_rows(
    rows: list[dict[str, Any]],
    existing: dict[str, BulkInsertResult],
    holders: dict[str, Job],
    scope: Scope,
) -> tuple[dict[Any, BulkInsertResult], list[dict[str, Any]]]:
    """Walk the batch in order: each row is answered (by its idempotency key's job, its
    unique key's holder, or an earlier row with the same key) or inserted."""
    answers: dict[Any, BulkInsertResult] = {}
    to_insert: list[dict[str, Any]] = []
    # A key's answer, once its first row has one: its repeats get the same.
    by_key: dict[str, BulkInsertResult] = dict(existing)
    by_unique: dict[str, BulkInsertResult] = {}
    for row in rows:
        key, unique_key = row["idempotency_key"], row.get("unique_key")
        if key is not None and key in by_key:
            answers[row["id"]] = by_key[key]
            continue
        if unique_key is not None and unique_key in holders:
            holder = holders[unique_key]
            answer = BulkInsertResult(
                holder.id, False, holder.kind, holder.organization_id, holder.input, True
            )
            answers[row["id"]] = by_unique[unique_key] = answer
        elif unique_key is not None and unique_key in by_unique:
            answers[row["id"]] = answer = by_unique[unique_key]
        else:
            to_insert.append(row)
            answer = _answer_with(row, scope)
            if unique_key is not None:
                by_unique[unique_key] = _answer_with(row, scope, deduplicated=True)
        if key is not None:
            by_key[key] = answer
    return answers, to_insert


def _answer_with(
    earlier: dict[str, Any], scope: Scope, deduplicated: bool = False
) -> BulkInsertResult:
    """A repeat's answer: the job the batch's earlier row with the same key creates."""
    return BulkInsertResult(
        earlier["id"],
        False,
        earlier["kind"],
        scope.organization,
        _json(earlier["input"]),
        deduplicated,
    )


_BULK_FIELDS = (
    "id",
    "kind",
    "created_by",
    "idempotency_key",
    "lock_key",
    "subject_type",
    "subject_id",
    "queue",
    "priority",
    "flow_key",
    "total_count",
    "run_at",
    "delay_ms",
)


def _rows_json(rows: list[dict[str, Any]], columns: Sequence[str] = _BULK_FIELDS) -> str:
    """The batch as one JSON array; ``input`` and ``meta`` are already serialised JSON text."""
    parts = []
    for row in rows:
        plain = {name: _jsonable(row[name]) for name in columns}
        text = json.dumps(plain, ensure_ascii=False)
        embedded = "".join(
            f',"{name}":{row[name]}' for name in ("input", "meta") if row[name] is not None
        )
        parts.append(text[:-1] + embedded + "}")
    return "[" + ",".join(parts) + "]"


def _jsonable(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


FIND_BY_IDEMPOTENCY_KEY = f"""
SELECT {COLUMNS} FROM {TABLE} WHERE tenant_id = %(tenant)s AND idempotency_key = %(key)s
"""


def find_by_idempotency_key(scope: Scope, key: str, *, using: str = DEFAULT_DB_ALIAS) -> Job | None:
    """Return the job started with ``key`` in the scope's tenant (keys are tenant-wide)."""
    return fetch_job(using, FIND_BY_IDEMPOTENCY_KEY, {"tenant": scope.tenant, "key": key})


# Spelled exactly as the unique index is (coalesce to the same sentinel), so the lookup
# and the authority agree on what "the same scope" means.
FIND_LIVE_BY_LOCK_KEY = f"""
SELECT {COLUMNS} FROM {TABLE}
 WHERE tenant_id = %(tenant)s
   AND coalesce(organization_id, '{NO_ORGANIZATION}') = coalesce(%(organization)s, '{NO_ORGANIZATION}')
   AND lock_key = %(lock_key)s
   AND status IN {LIVE}
 LIMIT 1
"""


def find_live_by_lock_key(
    scope: Scope, lock_key: str, *, using: str = DEFAULT_DB_ALIAS
) -> Job | None:
    """Return the live (pending or running) job holding ``lock_key`` in ``scope``."""
    return fetch_job(using, FIND_LIVE_BY_LOCK_KEY, {**scope_params(scope), "lock_key": lock_key})


# ---------------------------------------------------------------------------------------
# 1b. Unique jobs by arguments (invariant 25: uniqueness is an index, not a read)
# ---------------------------------------------------------------------------------------
# A unique start writes three more columns: ``unique_key`` (computed in Python by
# durable_jobs.unique from kind, scope and the selected input), ``unique_states`` (the
# statuses it covers) and, when it has a period, ``unique_window``: the period and the
# index of the period's window holding the database's now(), computed here in SQL so a
# worker's clock never chooses a window (invariant 2). Two partial unique indexes are the
# authority: one live job per key (durable_jobs_unique_live), and one job per key and
# window among the statuses the row covers (durable_jobs_unique_window, predicate
# ``status = ANY(unique_states)``), so a job leaves it by itself when it moves to a status
# its key does not cover, and a start that rolls back leaves no entry behind. A start
# without ``unique`` runs INSERT_JOB, untouched: these columns cost it nothing.


def _window(period_ms: str) -> str:
    """The window of the database's now() for a period (milliseconds, an SQL expression)."""
    return f"({period_ms} || ':' || floor(extract(epoch FROM now()) * 1000 / {period_ms})::bigint)"


_UNIQUE_COLUMNS = "wait_for, wait_key, wait_label, unique_key, unique_window, unique_states\n)"
_UNIQUE_VALUES = (
    "%(wait_key)s, %(wait_label)s, %(unique_key)s,"
    f" {_window('%(unique_period_ms)s::bigint')}, %(unique_states)s::varchar(16)[]\n)"
)
#: INSERT_JOB with the three unique columns: the same statement otherwise, built from it
#: so the two never drift (checked at import).
INSERT_UNIQUE_JOB = INSERT_JOB.replace(
    "wait_for, wait_key, wait_label\n)", _UNIQUE_COLUMNS
).replace("%(wait_key)s, %(wait_label)s\n)", _UNIQUE_VALUES)
assert INSERT_UNIQUE_JOB.count("unique_") == 7, INSERT_UNIQUE_JOB
_UNIQUE_RETURNING = "\nRETURNING " + ", ".join((*START_RETURNING, "unique_window")) + "\n"
INSERT_UNIQUE_NEW_JOB = INSERT_UNIQUE_JOB.rstrip() + _UNIQUE_RETURNING
INSERT_UNIQUE_JOB_AND_NOTIFY = (
    INSERT_UNIQUE_NEW_JOB.rstrip() + ", pg_notify(%(channel)s, %(queue)s)\n"
)

#: INSERT_JOBS with the three unique columns, built from it the same way.
INSERT_UNIQUE_JOBS = (
    INSERT_JOBS.replace(
        "next_run_at, pending_since\n)",
        "next_run_at, pending_since,\n    unique_key, unique_window, unique_states\n)",
    )
    .replace(
        "interval '1 millisecond'), now()\n",
        "interval '1 millisecond'), now(),\n"
        f"       r.unique_key, {_window('r.unique_period_ms')}, r.unique_states\n",
    )
    .replace(
        "run_at timestamptz, delay_ms bigint)",
        "run_at timestamptz, delay_ms bigint,\n"
        "       unique_key text, unique_period_ms bigint, unique_states varchar(16)[])",
    )
)
assert INSERT_UNIQUE_JOBS.count("unique_") == 10, INSERT_UNIQUE_JOBS
_BULK_UNIQUE_FIELDS = (*_BULK_FIELDS, "unique_key", "unique_period_ms", "unique_states")


def _insert_unique_new(using: str, sql: str, params: dict[str, Any]) -> Job:
    """``_insert_new`` for a unique start: the same Job, with its unique columns."""
    with start_cursor(using) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    assert row is not None
    job = _new_job(row, params, using)
    job.unique_key = params["unique_key"]
    job.unique_states = list(params["unique_states"])
    job.unique_window = row[len(START_RETURNING)]
    return job


# The holders of some unique keys, one per key: a live job (the live index's predicate,
# spelled as it is, so the planner reads that index), else a job of the current window in
# a status its key covers (the window index's predicate). The two branches are a UNION
# rather than one OR so each reads its own partial index, proportional to the key's
# jobs, never to the table. The scope is checked as well (invariant 10), though the key's
# digest holds it already.
FIND_UNIQUE_HOLDERS = f"""
WITH wanted AS (
    SELECT * FROM jsonb_to_recordset(%(keys)s::jsonb) AS w(unique_key text, period_ms bigint)
)
SELECT DISTINCT ON (unique_key) {COLUMNS} FROM (
    SELECT j.*, 0 AS covered_by FROM {TABLE} j
     WHERE j.unique_key IN (SELECT unique_key FROM wanted)
       AND j.unique_key IS NOT NULL AND j.status IN {LIVE}
    UNION ALL
    SELECT j.*, 1 FROM wanted w JOIN {TABLE} j ON j.unique_key = w.unique_key
     WHERE j.unique_window = {_window("w.period_ms")}
       AND j.unique_window IS NOT NULL AND j.status = ANY(j.unique_states)
) AS holder
 WHERE {SCOPE}
 ORDER BY unique_key, covered_by, created_at DESC
"""


def find_unique_holders(
    scope: Scope, rows: Sequence[dict[str, Any]], *, using: str = DEFAULT_DB_ALIAS
) -> dict[str, Job]:
    """Return, by unique key, the job holding each of ``rows``' unique keys in ``scope``."""
    wanted = {row["unique_key"]: row["unique_period_ms"] for row in rows}
    keys = json.dumps([{"unique_key": k, "period_ms": p} for k, p in wanted.items()])
    jobs = fetch_jobs(using, FIND_UNIQUE_HOLDERS, {**scope_params(scope), "keys": keys})
    return {job.unique_key: job for job in jobs if job.unique_key is not None}


def find_unique_holder(
    scope: Scope, fields: dict[str, Any], *, using: str = DEFAULT_DB_ALIAS
) -> Job | None:
    """Return the job holding a start's unique key in ``scope``, or None."""
    return find_unique_holders(scope, [fields], using=using).get(fields["unique_key"])


# ---------------------------------------------------------------------------------------
# Attempt history (invariant 32): written by the failing transition's own statement
# ---------------------------------------------------------------------------------------

# Each statement that ends a slice without success (fail_slice, charge_interruption,
# take_orphan) records the attempt in two data-modifying CTEs driven by its UPDATE's
# RETURNING rows: an INSERT of the attempt row and a DELETE of the job's attempts past
# ATTEMPT_HISTORY_KEEP. They commit exactly when the transition does, and when the
# UPDATE's fence matches no row they insert and delete nothing: a stale holder leaves no
# history, as it leaves no transition. A slice that succeeds runs none of this.
#
# The attempt's number is one more than the job's highest, read in the statement. No
# two recording statements for one job can both apply from one snapshot: each requires a
# live owner (LEASE_HELD, or take_orphan's `lease_owner IS NOT NULL`) and clears it, so
# one that waited on the row lock re-checks its fence against the winner's row and finds
# nothing. The trim cannot see the row its own statement inserts (one snapshot), and
# needs not: it removes the attempts numbered `keep` or more below the new one.
_ATTEMPT_INSERT_COLUMNS = (
    "job_id, attempt, epoch, worker, started_at, heartbeat_at, ended_at, outcome, "
    "error_class, error_code, error_message, traceback"
)
_ATTEMPT_MESSAGE_CHARS = 2000


def _recording(source: str, values: str) -> str:
    """The two CTEs that record and trim, reading the UPDATE's rows from the CTE ``source``.

    ``values`` lists, for the columns after ``job_id, attempt``, the expressions over
    ``s`` (the UPDATE's returned row).
    """
    return f"""recorded AS (
    INSERT INTO {ATTEMPT_TABLE} ({_ATTEMPT_INSERT_COLUMNS})
    SELECT s.id,
           coalesce((SELECT max(a.attempt) FROM {ATTEMPT_TABLE} AS a WHERE a.job_id = s.id), 0) + 1,
           {values}
      FROM {source} AS s
    RETURNING job_id, attempt
), trimmed AS (
    DELETE FROM {ATTEMPT_TABLE} AS a USING recorded AS r
     WHERE a.job_id = r.job_id AND a.attempt <= r.attempt - %(keep)s::int
)"""


def clip_traceback(text: str | None, limit: int | None = None) -> str | None:
    """Cap a traceback at ``limit`` bytes of UTF-8 (default ATTEMPT_TRACEBACK_BYTES).

    A longer one keeps its last bytes, where a Python traceback has the innermost frames
    and the exception line, after a marker line saying how much was cut; the result,
    marker included, is never longer than the limit. NUL, which PostgreSQL's text
    cannot hold, is written ``\\x00``.
    """
    if text is None:
        return None
    limit = conf.get().ATTEMPT_TRACEBACK_BYTES if limit is None else limit
    # Lone surrogates (which PostgreSQL cannot store either) are written out as escapes.
    data = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return data.decode("utf-8")
    # The marker's number has at most as many digits as the whole length.
    room = limit - len(_CUT_MARKER.format(len(data)).encode())
    if room <= 0:
        return data[len(data) - limit :].decode("utf-8", "ignore")
    tail = data[len(data) - room :].decode("utf-8", "ignore")  # from a whole character on
    return _CUT_MARKER.format(len(data) - len(tail.encode("utf-8"))) + tail


_CUT_MARKER = "[traceback cut to ATTEMPT_TRACEBACK_BYTES: its first {} bytes are not kept]\n"


def _attempt_params(
    *,
    outcome: str,
    message: str | None,
    traceback: str | None,
    started_at: datetime.datetime | None,
) -> dict[str, Any]:
    message = None if message is None else message[:_ATTEMPT_MESSAGE_CHARS]
    return {
        "outcome": outcome,
        "attempt_message": message,
        "traceback": clip_traceback(traceback),
        "started_at": started_at,
        "keep": conf.get().ATTEMPT_HISTORY_KEEP,
    }


# ---------------------------------------------------------------------------------------
# 2. Claim and lease (invariant 4): the delivery fence, the heartbeat, checkpoints, yields
# ---------------------------------------------------------------------------------------


def _paused_row(queue: str) -> str:
    """The one definition of "``queue`` is paused" (invariant 27), shared by the dequeue
    statement and the reads that explain a waiting job (invariant 28)."""
    return f"FROM {PAUSED_QUEUE_TABLE} AS paused WHERE paused.queue_name = {queue}"


#: A job row's queue is not paused (the unaliased job table's ``queue_name``; a bare
#: ``queue_name`` inside the subquery would name the paused table's own column).
QUEUE_NOT_PAUSED = f"NOT EXISTS (SELECT 1 {_paused_row(f'{TABLE}.queue_name')})"


CLAIM = f"""
UPDATE {TABLE}
   SET status = 'running',
       lease_owner = %(owner)s,
       lease_epoch = lease_epoch + 1,
       lease_expires_at = clock_timestamp() + {_ms("ttl_ms")},
       heartbeat_at = clock_timestamp(),
       pending_since = NULL,
       next_run_at = NULL,
       started_at = coalesce(started_at, now()),
       updated_at = now()
 WHERE id = %(id)s AND {SCOPE}
   AND status IN {LIVE}
   AND continuation_seq = %(seq)s AND redrives = %(redrives)s
   AND (lease_expires_at IS NULL OR lease_expires_at < clock_timestamp())
   AND cancel_requested_at IS NULL
   AND {QUEUE_NOT_PAUSED}
   AND NOT {_FLOW_HELD}
RETURNING {COLUMNS}
"""


def claim(
    job_id: object,
    scope: Scope,
    delivery: Delivery,
    owner: str,
    ttl_ms: int,
    *,
    using: str = DEFAULT_DB_ALIAS,
) -> Job | None:
    """Accept one delivery and take the lease; None when the delivery is stale or the lease busy.

    Invariant 4, the delivery fence: ``(continuation_seq, redrives)`` must still match what
    the delivery carries, so a straggling copy of a slice that has moved on cannot run it
    again. It reads no scheduled time: a broker's clock scheduled the delivery, and a
    ``next_run_at <= now()`` clause would refuse (and so lose) a retry arriving a few
    milliseconds early. ``next_run_at`` is cleared: the delivery is consumed.

    A job whose cancellation was requested claims nothing, as the dequeue refuses it:
    a broker transport cannot always take back a message it holds, so a cancelled job's
    delivery must fail the claim and leave the job to the reconciler's cancel step
    (invariant 8; invariant 31: the broker only says "look now"). Nor does a job whose
    queue is paused (invariant 27, the dequeue's own predicate): the consumer hands such
    a message back to its broker instead of dropping it (``runtime.intake``). Nor does a
    job held by a workflow wait (invariant 30), whatever a delivery says.
    """
    return fetch_job(
        using,
        CLAIM,
        {
            "id": job_id,
            **scope_params(scope),
            "seq": delivery.seq,
            "redrives": delivery.redrives,
            "owner": owner,
            "ttl_ms": ttl_ms,
        },
    )


# The candidates sit in a MATERIALIZED CTE carrying the LIMIT and FOR UPDATE SKIP LOCKED:
# evaluated once, so the planner cannot re-run the limited subquery per outer row and
# claim more rows than asked for. Eligibility is decided inside it, under the row locks.
# A released lease (a failed slice waiting for its retry) is as deliverable as pending.
#
# One index scan per queue (the LATERAL over the queue names), each already in
# (priority, run time) order on durable_jobs_open_deliverable, merged and limited outside: a
# plain `queue_name = ANY(...)` cannot read that index in order and sorts the whole due
# backlog on every call (measured: 30 ms at 100k due jobs, against 0.06 ms this way).
# A row one queue's scan locked but the merge left out is claimed by nobody and is
# released when this statement's transaction ends.
#
# Within a queue the scan walks the priority levels present (a skip scan: one index
# probe per level, highest first, stopping as soon as the limit is met) and reads each
# level from its oldest run time up to now. A single scan in (priority, run time) order
# would have to step over every row scheduled for later at a higher priority: 100,000
# jobs parked for tomorrow at priority 5 (retries in backoff, held waits, scheduled
# starts) made every claim of a due priority-0 job read all of them (126 ms a claim).
# The cut-off is an InitPlan (one clock reading per statement), which PostgreSQL can use
# as an index bound; clock_timestamp() itself is volatile and would only filter. At most
# 2 * MAX_PRIORITY + 1 levels exist.
def _deliverable(alias: str = "") -> str:
    """A row a claim may take once its time has come: what the two deliverable indexes'
    predicates share (``_open_deliverable``, ``_flow_deliverable``), and a live status.

    The status is tested as ``(status IN LIVE) IS TRUE``, which no index can serve and
    which implies no partial index's predicate (``_running`` says why that matters under
    a pinned horizon): the deliverable indexes leave the status out of their predicates
    (every statement that ends a job clears ``next_run_at``), so the claim can reach them
    without naming durable_jobs_live_kind's or durable_jobs_status_recent's. With a plain
    ``status IN LIVE`` and statistics that counted few live rows, the planner searched for
    a queue's priority levels on durable_jobs_live_kind, stepping over every row version
    that was ever live: 50-250 ms a claim after two minutes of a pin (migration 0016).
    """
    column = f"{alias}." if alias else ""
    return (
        f"({column}status IN {LIVE}) IS TRUE"
        f" AND {column}lease_owner IS NULL AND {column}next_run_at IS NOT NULL"
    )


# ---------------------------------------------------------------------------------------
# 2b. Flow control (invariants 26 and 28): the predicates the claim and explain share
# ---------------------------------------------------------------------------------------
#
# A job with a flow key (durable_jobs.limits chose it at start) runs only while its key
# has room: fewer permits held than its concurrency limit, fewer slice starts inside the
# rate window than its rate. The key's row (FLOW_KEY_TABLE) keeps the permits the claim
# granted, each as (job id, the epoch it was claimed at, the claiming transaction), and
# the starts of the sliding window. Nothing but the claim writes them: a permit is
# *released* when its job's row no longer holds a lease at that epoch (a yield, a failed
# slice waiting out its backoff, the end, an orphan take or a redrive all clear the owner
# or bump the epoch), so no release path keeps any bookkeeping (invariant 26).
#
# Why the permits sit on the key's row rather than being counted from the job rows: a
# claim statement in READ COMMITTED reads every table from the snapshot it started
# with; a count of leased rows taken under a lock acquired later in the same statement
# misses a claim committed in between, and N + 1 jobs run. The key row is the one row
# the statement locks and re-reads at its newest version, so every grant committed
# before our lock is in it. Whether a permit is still held is then read from its job row
# in our snapshot, which can only err towards "held": a permit whose claiming transaction
# our snapshot cannot see yet is held (that claim is newer than our snapshot); one it can
# see is held exactly when the job row shows a live lease at the permit's epoch.


def _permit_held(entry: str) -> str:
    """A permit (a jsonb entry of ``holders``) is still held (invariant 26).

    A permit granted earlier in our own transaction counts as committed: its job row's
    lease is visible to us, and our snapshot lists our own transaction as running."""
    return f"""(NOT (pg_visible_in_snapshot(({entry} ->> 'xid')::xid8, pg_current_snapshot())
             OR coalesce(({entry} ->> 'xid')::xid8 = pg_current_xact_id_if_assigned(), false))
        OR EXISTS (SELECT 1 FROM {TABLE} AS holder
                    WHERE holder.id = ({entry} ->> 'id')::uuid
                      AND holder.lease_epoch = ({entry} ->> 'epoch')::bigint
                      AND holder.status = 'running' AND holder.lease_owner IS NOT NULL))"""


#: The statement's one reading of the clock, as epoch seconds (an InitPlan).
_FLOW_NOW = "(SELECT extract(epoch FROM clock_timestamp()))"


def _flow_settings(key: str, kind: str) -> str:
    """A key's limits from the settings (the key's FLOW_KEYS entry, else its kind's
    FlowControl), read from the one ``flow`` parameter once: a lateral row of
    (concurrency, rate, rate_window_ms, weight)."""
    fields = (
        ("concurrency", "int"),
        ("rate", "int"),
        ("rate_window_ms", "bigint"),
        ("weight", "float8"),
    )
    columns = ",\n               ".join(
        f"coalesce((cfg.flow #>> ARRAY['keys', {key}, '{name}'])::{cast},"
        f" (cfg.flow #>> ARRAY['kinds', {kind}, '{name}'])::{cast}) AS {name}"
        for name, cast in fields
    )
    return f"SELECT {columns}\n          FROM (SELECT %(flow)s::jsonb AS flow) AS cfg"


def _flow_in_force(row: str, settings: str, field: str) -> str:
    """A limit in force: the operator's (the key row's), else the settings'."""
    return f"coalesce({row}.{field}, {settings}.{field})"


def _flow_usage(row: str, settings: str) -> str:
    """A key row's permits still held and its starts inside the rate window (a sliding
    window), each as the kept jsonb list and its length: a lateral row of (holders,
    held, starts, recent). The one reading the claim's pre-check, its grant and explain
    share (invariants 26, 28)."""
    window_s = f"(coalesce({_flow_in_force(row, settings, 'rate_window_ms')}, 1000) / 1000.0)"
    return f"""SELECT held.holders, held.n AS held, recent.starts, recent.n AS recent
          FROM (SELECT coalesce(jsonb_agg(permit), '[]'::jsonb) AS holders, count(*) AS n
                  FROM jsonb_array_elements({row}.holders) AS permit
                 WHERE {_permit_held("permit")}) AS held,
               (SELECT coalesce(jsonb_agg(started), '[]'::jsonb) AS starts, count(*) AS n
                  FROM jsonb_array_elements({row}.starts) AS started
                 WHERE started::float8 > {_FLOW_NOW} - {window_s}) AS recent"""


def _flow_room(row: str, settings: str, usage: str) -> str:
    """How many more of the key's jobs may start now: the tighter of its two limits; a
    limit unset everywhere does not bind. The one definition of a full or rate-limited key
    (invariant 28)."""
    concurrency = _flow_in_force(row, settings, "concurrency")
    rate = _flow_in_force(row, settings, "rate")
    return f"""greatest(0, least(coalesce({concurrency} - {usage}.held, 2147483647),
                              coalesce({rate} - {usage}.recent, 2147483647)))"""


def _flow_weight(row: str, settings: str) -> str:
    return f"greatest(coalesce({_flow_in_force(row, settings, 'weight')}, 1), 0.001)"


def _flow_head_kind(queue: str, key: str) -> str:
    """The kind of a key's next job in a queue: the kind whose FlowControl sets the key's
    limits when the settings do not (DEQUEUE and explain read it alike)."""
    return f"""SELECT kind FROM {TABLE}
         WHERE queue_name = {queue} AND flow_key = {key} AND {_flow_deliverable()}
         ORDER BY priority DESC, next_run_at LIMIT 1"""


def _open_deliverable(alias: str = "") -> str:
    """The partial predicate of durable_jobs_open_deliverable: a deliverable row without a flow key."""
    column = f"{alias}." if alias else ""
    return f"{_deliverable(alias)} AND {column}flow_key IS NULL"


def _flow_deliverable(alias: str = "") -> str:
    """The partial predicate of durable_jobs_flow_deliverable: a deliverable row with a flow key."""
    column = f"{alias}." if alias else ""
    return f"{_deliverable(alias)} AND {column}flow_key IS NOT NULL"


def _due(alias: str = "") -> str:
    """A deliverable row's run time has come (one clock reading per statement: an InitPlan)."""
    column = f"{alias}." if alias else ""
    return f"{column}next_run_at <= (SELECT clock_timestamp())"


#: A deliverable row may be claimed now (besides its queue and its key): due, no cancel
#: asked, a kind this worker runs (invariant 14b). DEQUEUE and explain both read it.
def _claimable(alias: str = "") -> str:
    column = f"{alias}." if alias else ""
    return f"""{_due(alias)}
               AND {column}cancel_requested_at IS NULL
               AND (%(kinds)s::text[] IS NULL OR {column}kind = ANY(%(kinds)s::text[]))"""


def _first(array: str, count: str) -> str:
    """The first ``count`` items of a jsonb array, in order."""
    return (
        f"(SELECT coalesce(jsonb_agg(offered.item ORDER BY offered.at), '[]'::jsonb)"
        f" FROM jsonb_array_elements({array}) WITH ORDINALITY AS offered(item, at)"
        f" WHERE offered.at <= {count})"
    )


def _stamps(count: str) -> str:
    """``count`` slice starts at the statement's clock, for the sliding window's log."""
    return (
        f"(SELECT coalesce(jsonb_agg(to_jsonb({_FLOW_NOW}::float8)), '[]'::jsonb)"
        f" FROM generate_series(1, {count}))"
    )


#: A key that has no row yet: no operator limit, no permit, no start, no share used.
_NO_FLOW_ROW = """(SELECT NULL::int AS concurrency, NULL::int AS rate, NULL::bigint AS rate_window_ms,
        NULL::float8 AS weight, '[]'::jsonb AS holders, '[]'::jsonb AS starts) AS fresh_key"""


# Flow keys (invariant 26). Keyed rows are read off durable_jobs_flow_deliverable, one
# probe per distinct key of the queue (a skip scan) plus one for the kind of its next
# job, never per waiting job: a key whose permits are taken costs the same with one
# waiting job as with 100,000, and it cannot fill the batch and starve other keys (its
# room is 0, so its rows are not even locked). Keys with room are taken in fair-share
# order (each key's pass: stride scheduling, a claim advances it by 1/weight), at most
# `limit` of them, and each gives at most `room` of its due jobs in (priority, run time)
# order, so priority orders work within a key. Unkeyed rows compete as one more key.
# The room read here is the snapshot's, a guide only: the grant (grants) decides
# under the key row's lock, and a candidate it refuses is left unclaimed. The grant is an
# INSERT ... ON CONFLICT DO UPDATE rather than an UPDATE: it locks each key row and reads
# its newest version without an EvalPlanQual recheck of the whole plan (an UPDATE whose
# rows another claim had just changed crashed a PostgreSQL 18.6 backend under load), and
# it serves a key met for the first time in the same step.
#: The claim's own paused-queue filter (invariant 27): the queues asked for, less the
#: paused ones, evaluated once before any scan: a paused queue's rows are never probed
#: nor locked, and a pause committed before the statement's snapshot holds for every
#: worker (no cache to go stale).
_CLAIM_QUEUES = f"""queues AS MATERIALIZED (
    -- Invariant 27: paused queues are left out of the list, here in the statement that
    -- claims, so a pause committed before this statement's snapshot holds for every
    -- worker (no cache to go stale). Evaluated once, before any scan: a paused queue's
    -- rows are never probed nor locked.
    SELECT wanted.name FROM unnest(%(queues)s::text[]) AS wanted(name)
     WHERE NOT EXISTS (SELECT 1 {_paused_row("wanted.name")})
)"""

#: The unkeyed candidates: one index scan per queue and priority level on
#: durable_jobs_open_deliverable, in (priority, run time) order, locked SKIP LOCKED. Each
#: level's scan starts at its floor, if the claimer gave one (``floor_*``, parallel arrays
#: of queue, priority and run time; ``durable_jobs.runtime.claim_floors``): a pinned
#: horizon leaves the index entry of every row claimed since the pin in the scan's way,
#: and a claim that walked them all cost 100 ms and more within minutes (issue #27).
#: A floor is the oldest run time the claimer's last claim took at that level, as the
#: database returned it; the scan starts FLOOR_MARGIN_MS before it, so that a start
#: committed within that long of its insert is found by any claim, not only by a sweep.
FLOOR_MARGIN_MS = 2000
_GIVEN_FLOORS = """unnest(%(floor_queues)s::text[], %(floor_priorities)s::int[],
                          %(floor_at)s::timestamptz[]) AS given(queue, priority, at)"""
_UNKEYED_CANDIDATES = f"""
    SELECT due.id, due.priority, due.next_run_at FROM queues AS q
    CROSS JOIN LATERAL (
        -- The queue's lowest floor: where the search for its levels starts reading.
        SELECT coalesce(min(given.at) - {FLOOR_MARGIN_MS} * interval '1 millisecond', '-infinity')
               AS at FROM {_GIVEN_FLOORS}
         WHERE given.queue = q.name
    ) AS queue_floor
    CROSS JOIN LATERAL (
        WITH RECURSIVE levels(priority) AS (
            (SELECT priority FROM {TABLE}
              WHERE queue_name = q.name AND {_open_deliverable()}
                AND next_run_at >= queue_floor.at
              ORDER BY priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT lower.priority FROM {TABLE} AS lower
                     WHERE lower.queue_name = q.name AND lower.priority < levels.priority
                       AND {_open_deliverable("lower")} AND lower.next_run_at >= queue_floor.at
                     ORDER BY lower.priority DESC LIMIT 1)
              FROM levels WHERE levels.priority IS NOT NULL
        )
        SELECT level.id, level.priority, level.next_run_at FROM levels
        CROSS JOIN LATERAL (
            SELECT coalesce(max(given.at) - {FLOOR_MARGIN_MS} * interval '1 millisecond', '-infinity')
                   AS at FROM {_GIVEN_FLOORS}
             WHERE given.queue = q.name AND given.priority = levels.priority
        ) AS floor
        CROSS JOIN LATERAL (
            SELECT id, priority, next_run_at FROM {TABLE}
             WHERE queue_name = q.name AND priority = levels.priority AND {_open_deliverable()}
               AND {_claimable()} AND next_run_at >= floor.at
             ORDER BY next_run_at
             LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED
        ) AS level
        LIMIT %(limit)s
    ) AS due
    ORDER BY due.priority DESC, due.next_run_at
    LIMIT %(limit)s
"""

#: What a claim writes on each row it takes (invariant 4: a new epoch, an owner unique
#: to the claim).
_CLAIM_SET = f"""
   SET status = 'running',
       lease_owner = %(owner)s || ':' || j.id::text,
       lease_epoch = j.lease_epoch + 1,
       lease_expires_at = clock_timestamp() + {_ms("ttl_ms")},
       heartbeat_at = clock_timestamp(),
       pending_since = NULL,
       next_run_at = NULL,
       started_at = coalesce(j.started_at, now()),
       updated_at = now()
"""

# The default claim: no flow key anywhere in the worker's reach (``dequeue`` without
# ``flow``). Today's statement, reading only the rows without a key, so it costs what it
# did before flow control existed and never takes a keyed job.
DEQUEUE_OPEN = f"""
WITH {_CLAIM_QUEUES}, candidates AS MATERIALIZED ({_UNKEYED_CANDIDATES})
UPDATE {TABLE} AS j
{_CLAIM_SET}
  FROM candidates c
 WHERE j.id = c.id
RETURNING {_J_COLUMNS}, c.next_run_at
"""

DEQUEUE = f"""
WITH {_CLAIM_QUEUES}, unkeyed AS MATERIALIZED ({_UNKEYED_CANDIDATES}), keys AS MATERIALIZED (
    SELECT q.name AS queue, k.key, head.kind, s.fair_pass, s.served_at,
           cfg.concurrency, cfg.rate, cfg.rate_window_ms, cfg.weight AS set_weight,
           {_flow_room("s", "cfg", "used")} AS room,
           {_flow_weight("s", "cfg")} AS weight
      FROM queues AS q
     CROSS JOIN LATERAL (
        WITH RECURSIVE flow_keys(key) AS (
            (SELECT flow_key FROM {TABLE}
              WHERE queue_name = q.name AND {_flow_deliverable()}
              ORDER BY flow_key LIMIT 1)
            UNION ALL
            SELECT (SELECT nxt.flow_key FROM {TABLE} AS nxt
                     WHERE nxt.queue_name = q.name AND nxt.flow_key > flow_keys.key
                       AND {_flow_deliverable("nxt")}
                     ORDER BY nxt.flow_key LIMIT 1)
              FROM flow_keys WHERE flow_keys.key IS NOT NULL
        )
        SELECT key FROM flow_keys WHERE key IS NOT NULL
     ) AS k
     CROSS JOIN LATERAL ({_flow_head_kind("q.name", "k.key")}) AS head
      LEFT JOIN {FLOW_KEY_TABLE} AS s ON s.key = k.key
     CROSS JOIN LATERAL ({_flow_settings("k.key", "head.kind")}) AS cfg
     CROSS JOIN LATERAL ({_flow_usage("s", "cfg")}) AS used
), turns AS MATERIALIZED (
    SELECT keys.*, coalesce(keys.fair_pass, bottom.pass) - bottom.pass AS behind, bottom.pass AS floor
      FROM keys, (SELECT coalesce(min(fair_pass), 0) AS pass FROM keys) AS bottom
     WHERE keys.room > 0
     ORDER BY behind, keys.served_at NULLS FIRST, keys.key
     LIMIT %(limit)s
), keyed AS MATERIALIZED (
    SELECT head.*, turns.behind + (row_number() OVER (
               PARTITION BY turns.queue, turns.key ORDER BY head.priority DESC, head.next_run_at
           ) - 1) / turns.weight AS fair,
           turns.floor, turns.served_at, turns.concurrency, turns.rate, turns.rate_window_ms,
           turns.set_weight
      FROM turns
     CROSS JOIN LATERAL (
        SELECT id, flow_key, lease_epoch, priority, next_run_at FROM {TABLE}
         WHERE queue_name = turns.queue AND flow_key = turns.key AND {_flow_deliverable()}
           AND {_claimable()}
         ORDER BY priority DESC, next_run_at
         LIMIT least(turns.room, %(limit)s)
         FOR UPDATE SKIP LOCKED
     ) AS head
), candidates AS MATERIALIZED (
    SELECT * FROM (
        SELECT id, NULL::text AS flow_key, NULL::bigint AS lease_epoch, priority, next_run_at,
               (row_number() OVER (ORDER BY priority DESC, next_run_at) - 1)::float8 AS fair,
               NULL::float8 AS floor, NULL::timestamptz AS served_at, NULL::int AS concurrency,
               NULL::int AS rate, NULL::bigint AS rate_window_ms, NULL::float8 AS set_weight
          FROM unkeyed
        UNION ALL
        SELECT id, flow_key, lease_epoch, priority, next_run_at, fair, floor, served_at,
               concurrency, rate, rate_window_ms, set_weight
          FROM keyed
    ) AS both_kinds
    -- A tie between keys goes to the one served longest ago (a new key first).
    ORDER BY fair, served_at NULLS FIRST, priority DESC, next_run_at
    LIMIT %(limit)s
), offers AS MATERIALIZED (
    SELECT flow_key AS key, min(floor) AS floor, min(concurrency) AS concurrency,
           min(rate) AS rate, min(rate_window_ms) AS rate_window_ms, min(set_weight) AS weight,
           jsonb_agg(jsonb_build_object('id', id, 'epoch', lease_epoch + 1,
                                        'xid', pg_current_xact_id()::text)
                     ORDER BY fair, priority DESC, next_run_at) AS wanted
      FROM candidates WHERE flow_key IS NOT NULL
     GROUP BY flow_key
), grants AS (
    -- Invariant 26, decided here under each key row's lock, taken in key order (two
    -- claims never wait on each other in a circle): grant at most the room the key's
    -- newest row version has, prune the released permits and the starts past the
    -- window, and move the key's fair-share pass on by what it was granted. A key met
    -- for the first time is inserted with its first grants; one a concurrent claim
    -- inserts meanwhile is waited for, then updated like any other.
    INSERT INTO {FLOW_KEY_TABLE} AS s (key, holders, starts, fair_pass, served_at)
    SELECT o.key, {_first("o.wanted", "room.n")}, {_stamps("room.n")},
           o.floor + room.n / {_flow_weight("fresh_key", "o")}, clock_timestamp()
      FROM offers AS o, {_NO_FLOW_ROW}
     CROSS JOIN LATERAL (SELECT least(jsonb_array_length(o.wanted),
                                      {_flow_room("fresh_key", "o", "nothing")}) AS n
                           FROM (SELECT 0 AS held, 0 AS recent) AS nothing) AS room
     ORDER BY o.key
    ON CONFLICT (key) DO UPDATE
       SET (holders, starts, fair_pass, served_at) = (
           SELECT used.holders || {_first("o.wanted", "grant_n.n")},
                  used.starts || {_stamps("grant_n.n")},
                  greatest(s.fair_pass, o.floor) + grant_n.n / {_flow_weight("s", "o")},
                  clock_timestamp()
             FROM offers AS o
            CROSS JOIN LATERAL ({_flow_usage("s", "o")}) AS used
            CROSS JOIN LATERAL (SELECT least(jsonb_array_length(o.wanted),
                                             {_flow_room("s", "o", "used")}) AS n) AS grant_n
            WHERE o.key = s.key)
    RETURNING s.holders
)
UPDATE {TABLE} AS j
{_CLAIM_SET}
  FROM candidates c
 WHERE j.id = c.id
   AND (c.flow_key IS NULL OR c.id IN (
        SELECT (permit ->> 'id')::uuid
          FROM grants AS grant_rows,
               jsonb_array_elements(grant_rows.holders) AS permit
         WHERE permit ->> 'xid' = pg_current_xact_id()::text))
RETURNING {_J_COLUMNS}, c.next_run_at
"""


#: A claim's floors: (queue, priority, run time) of each level whose scan starts
#: FLOOR_MARGIN_MS before that run time.
Floors = Sequence[tuple[str, int, datetime.datetime]]


def claim_params(
    queues: Sequence[str],
    owner: str,
    ttl_ms: int,
    *,
    kinds: Sequence[str] | None,
    limit: int = 1,
    flow: str | None = None,
    floors: Floors = (),
) -> dict[str, Any]:
    """The parameters of DEQUEUE_OPEN and DEQUEUE (see ``dequeue``); the arrays as
    literals (``db.array_literal``: bound as one string, not quoted element by element
    on every claim)."""
    return {
        "queues": array_literal(queues),
        "owner": owner,
        "ttl_ms": ttl_ms,
        "limit": limit,
        "kinds": None if kinds is None else array_literal(kinds),
        "flow": flow or "{}",
        "floor_queues": array_literal(queue for queue, _, _ in floors),
        "floor_priorities": array_literal(priority for _, priority, _ in floors),
        "floor_at": array_literal(at.isoformat() for _, _, at in floors),
    }


def dequeue(
    queues: Sequence[str],
    owner: str,
    ttl_ms: int,
    *,
    kinds: Sequence[str] | None,
    limit: int = 1,
    flow: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[Job]:
    """Claim up to ``limit`` due jobs of ``kinds`` from ``queues``: the database transport (DESIGN §6).

    Each claimed row gets its own epoch and an owner unique to the claim (the worker's
    identity plus the job id), so a batched claim keeps every per-row fence.

    Invariant 14b: a worker claims only the kinds it can run (``kinds``: its registry), so
    a worker of an older deploy leaves a new kind's jobs for a worker that knows it and
    nothing is charged. The filter sits in the locked scan, so a job of another kind is
    never locked, let alone claimed. ``kinds=None`` claims any kind (operators' tools).
    Rows of kinds this worker lacks are stepped over in the index scan: their cost grows
    with how many of them are due ahead of a claimable row in the same queue.

    Invariant 26: a job with a flow key is claimed only when its key has room, decided
    under the key row's lock in this statement; ``flow`` is the JSON of the settings'
    and the kinds' limits (``durable_jobs.limits.claims.claim_settings``), the operator's
    runtime limits being read from the key rows themselves. Without ``flow`` the claim
    is DEQUEUE_OPEN, which takes only jobs without a flow key (and costs what the claim
    cost before flow control): a keyed job is never claimed but through its key.
    """
    claimed = dequeue_from(queues, owner, ttl_ms, kinds=kinds, limit=limit, flow=flow, using=using)
    return [job for job, _ in claimed]


def dequeue_from(
    queues: Sequence[str],
    owner: str,
    ttl_ms: int,
    *,
    kinds: Sequence[str] | None,
    limit: int = 1,
    flow: str | None = None,
    floors: Floors = (),
    using: str = DEFAULT_DB_ALIAS,
) -> list[tuple[Job, datetime.datetime]]:
    """``dequeue``, each unkeyed level's scan starting at its floor in ``floors``; each
    claimed job with the run time it was due at (what the caller's next floors come from).

    A floor skips every deliverable row of its level due before it: the caller must
    claim without floors now and then (``durable_jobs.runtime.claim_floors``).
    """
    params = claim_params(queues, owner, ttl_ms, kinds=kinds, limit=limit, flow=flow, floors=floors)
    # Prepared where the connection prepares (OPTIONS["prepare_threshold"]): on a quiet
    # server the claim's plan costs three times its execution (0.54 against 0.17 ms for one
    # job), about as much under load, and a slot whose slices take QUICK_SLICE or more
    # claims once per job.
    statement = DEQUEUE_OPEN if flow is None else DEQUEUE
    claimed = fetch_jobs_with(using, statement, params, server_bound=True)
    # In the order they are to run (DESIGN §6: priority, then run time). RETURNING gives
    # them in the order the plan joined them, which changes with the table's statistics:
    # a batch once ran a priority-3 job ahead of an older one of the same level.
    claimed.sort(key=lambda pair: (-pair[0].priority, pair[1]))
    return claimed


HEARTBEAT = f"""
UPDATE {TABLE}
   SET lease_expires_at = clock_timestamp() + {_ms("ttl_ms")},
       heartbeat_at = clock_timestamp(),
       processed_count = coalesce(%(processed)s::bigint, processed_count),
       total_count = CASE WHEN %(set_total)s THEN %(total)s::bigint ELSE total_count END,
       consecutive_failures = CASE WHEN %(committed)s THEN 0 ELSE consecutive_failures END,
       redrives_since_commit = CASE WHEN %(committed)s THEN 0 ELSE redrives_since_commit END,
       last_committed_at = CASE WHEN %(committed)s THEN clock_timestamp() ELSE last_committed_at END
 WHERE id = %(id)s AND {LEASE_HELD}
RETURNING cancel_requested_at IS NOT NULL
"""

#: "Not passed": ``total=None`` is a value (unknown), so absence needs its own marker.
UNSET: Any = object()


def heartbeat(
    lease: Lease,
    *,
    processed: int | None = None,
    total: Any = UNSET,
    committed: bool = False,
    lock_timeout_ms: int | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> bool | None:
    """Extend the lease and record progress; return the cancel flag, or None if the lease is gone.

    ``committed=True`` says the slice durably committed a unit of work, which resets both
    suspicion budgets (invariant 7). ``total=None`` is a value ("unknown"), so whether a
    total was passed travels separately from the total itself.

    Touches no indexed column, so it is a HOT update (invariant 12): a job heartbeating
    for days must not bloat the indexes.
    """
    set_total = total is not UNSET
    params = {
        **_lease(lease),
        "processed": processed,
        "set_total": set_total,
        "total": total if set_total else None,
        "committed": committed,
    }
    if lock_timeout_ms is None:
        return fetch_value(using, HEARTBEAT, params)
    # For a caller that must not queue behind the slice's own fenced transaction
    # (invariant 5): it gives up after the timeout (OperationalError) and tries again.
    return with_lock_timeout(
        lock_timeout_ms, lambda: fetch_value(using, HEARTBEAT, params), using=using
    )


# Every lease a worker holds, extended by one statement per tick. A row locked by its own
# slice's fenced transaction (or a mirror, or an operator's statement) is skipped rather
# than waited for: the fence extends the lease itself at commit, and waiting here would
# delay every other lease behind one slow row (a tick's beats once added up past a lease
# TTL this way). The final SELECT tells the caller, per lease, which of three things
# happened: extended (the cancel flag), busy (locked, still ours in the committed
# snapshot: try next tick), or lost (another claim owns the row now).
#
# Every row is found by its primary key (``_running``): the planner cannot pick
# durable_jobs_leased (keyed on lease_epoch, which most running rows share) for the
# lookup. With statistics taken while few rows ran it did: the statement read every
# running row once per lease, and a worker's 500 leases among 10,000 running rows took
# 0.9 s of server time per beat instead of 37 ms (the benchmark's bookkeeping scenario).
HEARTBEAT_LEASES = f"""
WITH leases AS (
    SELECT * FROM jsonb_to_recordset(%(leases)s::jsonb) AS l(id uuid, owner text, epoch bigint, ttl_ms bigint)
), free AS MATERIALIZED (
    SELECT j.id FROM {TABLE} AS j JOIN leases AS l ON j.id = l.id
     WHERE {_running("j")} AND j.lease_owner = l.owner AND j.lease_epoch = l.epoch
     FOR UPDATE OF j SKIP LOCKED
), beaten AS (
    UPDATE {TABLE} AS j
       SET lease_expires_at = clock_timestamp() + l.ttl_ms * interval '1 millisecond',
           heartbeat_at = clock_timestamp()
      FROM leases AS l, free AS f
     WHERE j.id = l.id AND j.id = f.id
       AND {_running("j")} AND j.lease_owner = l.owner AND j.lease_epoch = l.epoch
    RETURNING j.id, j.cancel_requested_at IS NOT NULL AS cancel
)
SELECT l.id, b.cancel,
       b.id IS NULL AND EXISTS (
           SELECT 1 FROM {TABLE} AS j
            WHERE j.id = l.id AND {_running("j")} AND j.lease_owner = l.owner AND j.lease_epoch = l.epoch
       ) AS busy
  FROM leases AS l LEFT JOIN beaten AS b ON b.id = l.id
"""

#: What ``heartbeat_leases`` learned about one lease.
BEATEN, CANCEL_REQUESTED, BUSY, LOST = "beaten", "cancel_requested", "busy", "lost"


def heartbeat_leases(leases: Sequence[Lease], *, using: str = DEFAULT_DB_ALIAS) -> dict[Any, str]:
    """Extend many leases in one statement; return each job id's answer.

    ``BEATEN`` or ``CANCEL_REQUESTED``: extended (invariant 12: a HOT update).
    ``BUSY``: the row is locked by a transaction (its own slice's fence, a mirror):
    skipped, never waited for (invariant 5). ``LOST``: another claim owns the job.
    """
    if not leases:
        return {}
    rows = json.dumps(
        [
            {
                "id": str(lease.job_id),
                "owner": lease.owner,
                "epoch": lease.epoch,
                "ttl_ms": lease.ttl_ms,
            }
            for lease in leases
        ]
    )
    answers: dict[Any, str] = {}
    with execute(using, HEARTBEAT_LEASES, {"leases": rows}) as cursor:
        for job_id, cancel, busy in cursor:
            if cancel is not None:
                answers[job_id] = CANCEL_REQUESTED if cancel else BEATEN
            else:
                answers[job_id] = BUSY if busy else LOST
    return answers


ASSERT_LEASE = f"SELECT 1 FROM {TABLE} WHERE id = %(id)s AND {LEASE_HELD} FOR UPDATE"


def assert_lease(lease: Lease, *, using: str = DEFAULT_DB_ALIAS) -> bool:
    """Re-assert the lease inside the caller's transaction, locking the row until it ends.

    Invariant 5: this is what makes a fenced write a fence rather than a hope. The
    domain writes and this check commit or roll back together, and while the row is
    locked nobody can take the job over, so a worker whose lease is gone lands nothing.
    """
    return fetch_value(using, ASSERT_LEASE, _lease(lease)) is not None


WRITE_CHECKPOINT = f"""
UPDATE {TABLE}
   SET checkpoint = %(checkpoint)s::jsonb,
       lease_expires_at = clock_timestamp() + {_ms("ttl_ms")},
       heartbeat_at = clock_timestamp(),
       processed_count = coalesce(%(processed)s::bigint, processed_count),
       total_count = CASE WHEN %(set_total)s THEN %(total)s::bigint ELSE total_count END,
       consecutive_failures = 0,
       redrives_since_commit = 0,
       last_committed_at = clock_timestamp(),
       updated_at = now()
 WHERE id = %(id)s AND {LEASE_HELD}
RETURNING 1
"""


def write_checkpoint(
    lease: Lease,
    checkpoint: Any,
    *,
    processed: int | None = None,
    total: Any = UNSET,
    using: str = DEFAULT_DB_ALIAS,
) -> bool:
    """Record a checkpoint under the fence; a committed unit (resets the budgets, invariant 7).

    Extends the lease from ``clock_timestamp()``: this runs at the end of a domain
    transaction that may have lasted longer than the lease, and a lease computed from the
    transaction's start (``now()``) would be written already expired.
    """
    set_total = total is not UNSET
    return (
        fetch_value(
            using,
            WRITE_CHECKPOINT,
            {
                **_lease(lease),
                "checkpoint": dump_json(checkpoint),
                "processed": processed,
                "set_total": set_total,
                "total": total if set_total else None,
            },
        )
        is not None
    )


YIELD_SLICE = f"""
UPDATE {TABLE}
   SET status = 'pending',
       continuation_seq = continuation_seq + 1,
       interruptions = interruptions + CASE WHEN %(interrupted)s THEN 1 ELSE 0 END,
       lease_owner = NULL,
       lease_expires_at = clock_timestamp(),
       pending_since = now(),
       next_run_at = clock_timestamp() + {_ms("delay_ms")},
       updated_at = now()
 WHERE id = %(id)s AND {LEASE_HELD}
RETURNING continuation_seq, redrives
"""


def yield_slice(
    lease: Lease, *, interrupted: bool = False, delay_ms: int = 0, using: str = DEFAULT_DB_ALIAS
) -> Delivery | None:
    """Hand the rest of the work back; return the next delivery, or None if the lease is gone.

    Invariant 6: yielding is the mechanism working, not failing. It bumps
    ``continuation_seq`` (minting the next delivery and retiring this one) and spends no
    retry budget. An interruption (shutdown) is counted on its own counter, which no
    verdict reads, so deploys never park a healthy job.
    """
    with execute(
        using, YIELD_SLICE, {**_lease(lease), "interrupted": interrupted, "delay_ms": delay_ms}
    ) as cursor:
        row = cursor.fetchone()
    return None if row is None else Delivery(seq=row[0], redrives=row[1])


# The verdict and the backoff are both computed from the counter this statement
# increments (invariant 3): a committed heartbeat earlier in the slice reset it, and the
# CASE sees that reset, so a slice that made progress is never failed on a stale count.
# A verdict makes the row deliverable at once: if the terminal transaction that records
# it never commits, the next claim finds the verdict and records it without running
# the handler again.
_FAILED_ATTEMPT = """s.lease_epoch, %(owner)s, %(started_at)s::timestamptz, s.heartbeat_at,
           clock_timestamp(), %(outcome)s, s.error_class, s.error_code, %(attempt_message)s,
           %(traceback)s"""

FAIL_SLICE = f"""
WITH slice AS (
UPDATE {TABLE}
   SET lease_owner = NULL,
       lease_expires_at = clock_timestamp(),
       consecutive_failures = consecutive_failures + 1,
       error_class = %(error_class)s,
       error_message = %(message)s,
       error_code = CASE
           WHEN %(error_class)s = 'unrecoverable' THEN 'unrecoverable'
           WHEN %(error_class)s = 'terminal' THEN 'terminal'
           WHEN consecutive_failures + 1 >= %(max_failures)s THEN 'retry_exhausted'
           -- A handler's own code never reads as a verdict: only the class and the
           -- counter decide one.
           WHEN %(code)s IN {_VERDICTS} THEN 'reported_' || %(code)s
           ELSE %(code)s END,
       next_run_at = CASE
           WHEN %(error_class)s IN ('unrecoverable', 'terminal')
             OR consecutive_failures + 1 >= %(max_failures)s THEN clock_timestamp()
           ELSE clock_timestamp() + least(
               %(backoff_max_ms)s::float8,
               %(backoff_base_ms)s::float8 * power(2, consecutive_failures)
           ) * (0.5 + random() / 2) * interval '1 millisecond' END,
       updated_at = now()
 WHERE id = %(id)s AND {LEASE_HELD}
RETURNING id, lease_epoch, heartbeat_at, consecutive_failures, error_class, error_code
), {_recording("slice", _FAILED_ATTEMPT)}
SELECT consecutive_failures, error_code FROM slice
"""


def fail_slice(
    lease: Lease,
    *,
    error_class: str,
    code: str | None,
    message: str | None,
    max_failures: int,
    backoff_base_ms: int,
    backoff_max_ms: int,
    outcome: str = "failed",
    traceback: str | None = None,
    started_at: datetime.datetime | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> FailReply | None:
    """Count a failed slice and release the lease; the job stays ``running`` for its retry.

    The retry delay is capped exponential in the failure count with jitter on the upper
    half, drawn in SQL from the same counter the verdict reads. Returns None if the lease
    is gone.

    Invariant 32: the same statement records the attempt (``outcome`` ``failed`` or
    ``time_limit``, its ``traceback`` capped, ``started_at`` the claim's own stamp as the
    claim returned it) and trims the job's history; a stale lease records nothing.
    """
    with execute(
        using,
        FAIL_SLICE,
        {
            **_lease(lease),
            "error_class": error_class,
            "code": code,
            "message": message,
            "max_failures": max_failures,
            "backoff_base_ms": backoff_base_ms,
            "backoff_max_ms": backoff_max_ms,
            **_attempt_params(
                outcome=outcome, message=message, traceback=traceback, started_at=started_at
            ),
        },
    ) as cursor:
        row = cursor.fetchone()
    return None if row is None else FailReply(consecutive_failures=row[0], error_code=row[1])


RELEASE_LEASE = f"""
UPDATE {TABLE}
   SET lease_owner = NULL,
       lease_expires_at = clock_timestamp(),
       next_run_at = clock_timestamp() + {_ms("delay_ms")},
       updated_at = now()
 WHERE id = %(id)s AND {LEASE_HELD}
RETURNING {COLUMNS}
"""


def release_lease(lease: Lease, *, delay_ms: int, using: str = DEFAULT_DB_ALIAS) -> Job | None:
    """Give the lease back without counting anything; the same delivery may claim again.

    Used when a terminal transaction rolled back (its mirror failed): that is not a slice
    failure, so it spends no retry budget and keeps a pending cancellation pending
    (invariant 11).
    """
    return fetch_job(using, RELEASE_LEASE, {**_lease(lease), "delay_ms": delay_ms})


# ---------------------------------------------------------------------------------------
# 3. Finish: terminal transitions, run inside the terminal transaction beside the mirror
# ---------------------------------------------------------------------------------------

# Fenced on the epoch alone, not the owner: on the failure path fail_slice has already
# cleared lease_owner, while on the path that records a verdict found by a later claim
# the owner is that claim's. The epoch is what both share, and it is what identifies the
# generation of the lease: any takeover bumps it.
_TERMINAL_FENCE = f"id = %(id)s AND {_running()} AND lease_epoch = %(epoch)s"

# The terminal statements stamp domain_mirrored_at themselves: the kind's mirror runs in
# the same transaction right after, so the stamp commits exactly when the mirror did
# (and with no mirror, the transition is the whole terminal transaction: one statement).
COMPLETE = f"""
UPDATE {TABLE}
   SET status = 'completed', finished_at = now(), domain_mirrored_at = now(), lease_owner = NULL,
       lease_expires_at = clock_timestamp(), next_run_at = NULL,
       error_class = NULL, error_code = NULL, error_message = NULL,
       result = %(result)s::jsonb,
       processed_count = coalesce(%(processed)s::bigint, processed_count),
       total_count = coalesce(%(total)s::bigint, total_count),
       updated_at = now()
 WHERE {_TERMINAL_FENCE}
RETURNING {COLUMNS}
"""


def complete(
    lease: Lease,
    *,
    result: Any = None,
    processed: int | None = None,
    total: int | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Job | None:
    """Mark the job completed (epoch-fenced, invariant 4); None when the epoch moved on."""
    params = {**_lease(lease), "result": dump_json(result), "processed": processed, "total": total}
    return _end(using, COMPLETE_LEAF, COMPLETE, params)


def _end(using: str, leaf: str, telling: str, params: dict[str, Any]) -> Job | None:
    """Run a terminal statement: its leaf form first, its telling form when that ends nothing.

    Most jobs have no parent and no dependents, and the telling form's CTEs cost twice the
    leaf's time on the server (planning, mostly). The leaf form matches only a row nobody
    waits on, decided on the row version it locks, so a dependent linked a moment before
    makes it end nothing and the telling form ends the row (or finds the lease gone).
    """
    return fetch_job(using, leaf, params) or fetch_job(using, telling, params)


# The batched twin of COMPLETE, for a worker slot that ran several quick slices: each
# row is still fenced on its own epoch, so one taken-over job never blocks the others.
# The ids come a second time as an array: the planner takes a JSON row set for 100 rows
# whatever its length, and costed 100 primary-key lookups above a scan of the whole table
# (a table of 5,000 rows was read in full to complete two); an array's length it knows.
COMPLETE_MANY = f"""
UPDATE {TABLE} AS j
   SET status = 'completed', finished_at = now(), domain_mirrored_at = now(), lease_owner = NULL,
       lease_expires_at = clock_timestamp(), next_run_at = NULL,
       error_class = NULL, error_code = NULL, error_message = NULL,
       result = d.result, updated_at = now()
  FROM jsonb_to_recordset(%(rows)s::jsonb) AS d(id uuid, epoch bigint, result jsonb)
 WHERE j.id = ANY(%(ids)s::uuid[]) AND j.id = d.id AND {_running("j")} AND j.lease_epoch = d.epoch
RETURNING j.id
"""


def complete_many(
    items: Sequence[tuple[Lease, str | None]], *, using: str = DEFAULT_DB_ALIAS
) -> set[Any]:
    """Complete several jobs at once, each epoch-fenced; return the ids that completed.

    ``items`` pairs each lease with its result as serialised JSON text (or None). The leaf
    form goes first (see ``_end``); whatever it left goes through the telling form.
    """
    with execute(using, COMPLETE_MANY_LEAF, _completions(items)) as cursor:
        ended = {row[0] for row in cursor}
    if len(ended) < len(items):
        done = {str(job_id) for job_id in ended}
        rest = [item for item in items if str(item[0].job_id) not in done]
        with execute(using, COMPLETE_MANY, _completions(rest)) as cursor:
            ended.update(row[0] for row in cursor)
    return ended


def _completions(items: Sequence[tuple[Lease, str | None]]) -> dict[str, Any]:
    """COMPLETE_MANY's parameters: ``rows``, a JSON array of ``{id, epoch, result}``, and
    ``ids``, the same ids as an array."""
    # Each id made text once, for both parameters (a UUID's str() is a measurable share of
    # a no-op job's completion).
    ids = [str(lease.job_id) for lease, _ in items]
    rows = ",".join(
        '{"id":"%s","epoch":%d,"result":%s}'  # noqa: UP031 - the hot path: %-formatting measured fastest
        % (job_id, lease.epoch, result if result is not None else "null")
        for job_id, (lease, result) in zip(ids, items, strict=True)
    )
    # The ids as one array literal: a list would be quoted element by element on every
    # completion.
    return {"rows": f"[{rows}]", "ids": array_text(ids)}


FAIL_TERMINAL = f"""
UPDATE {TABLE}
   SET status = 'failed', finished_at = now(), domain_mirrored_at = now(), lease_owner = NULL,
       lease_expires_at = clock_timestamp(), next_run_at = NULL,
       error_code = %(code)s, error_class = %(error_class)s,
       error_message = coalesce(%(message)s, error_message), updated_at = now()
 WHERE {_TERMINAL_FENCE}
RETURNING {COLUMNS}
"""


def fail_terminal(
    lease: Lease,
    *,
    code: str,
    error_class: str,
    message: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Job | None:
    """Mark the job failed with its verdict (epoch-fenced); None when the epoch moved on."""
    params = {**_lease(lease), "code": code, "error_class": error_class, "message": message}
    return _end(using, FAIL_TERMINAL_LEAF, FAIL_TERMINAL, params)


FINISH_CANCELLED = f"""
UPDATE {TABLE}
   SET status = 'cancelled', finished_at = now(), domain_mirrored_at = now(), lease_owner = NULL,
       lease_expires_at = clock_timestamp(), next_run_at = NULL, updated_at = now()
 WHERE {_TERMINAL_FENCE}
RETURNING {COLUMNS}
"""


def finish_cancelled(lease: Lease, *, using: str = DEFAULT_DB_ALIAS) -> Job | None:
    """End a running job the holder saw cancelled (epoch-fenced); None when the epoch moved on."""
    return fetch_job(using, FINISH_CANCELLED, _lease(lease))


# Its own autocommit statement, never inside the transaction it counts: that transaction
# rolled back, and a counter written in it would roll back too, leaving a job that
# retries its mirror forever with nothing to show for it (invariant 11). It also gives
# the lease back (the attempt is over) and, once the budget is spent, parks the job
# `mirror_failed` — the verdict decided from the counter this statement increments
# (invariant 3). Fenced on the epoch alone, like the terminal CAS it follows: on the
# failure path fail_slice has already cleared the owner.
BUMP_MIRROR_ATTEMPTS = f"""
UPDATE {TABLE}
   SET mirror_attempts = mirror_attempts + 1,
       lease_owner = NULL,
       lease_expires_at = clock_timestamp(),
       status = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s THEN 'failed' ELSE status END,
       parked_at = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s THEN now() ELSE parked_at END,
       finished_at = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s THEN now() ELSE finished_at END,
       error_code = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s THEN 'mirror_failed' ELSE error_code END,
       error_class = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s
                          THEN coalesce(error_class, 'terminal') ELSE error_class END,
       error_message = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s
                            THEN %(message)s ELSE error_message END,
       next_run_at = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s THEN NULL
                          ELSE clock_timestamp() + {_ms("delay_ms")} END,
       updated_at = now()
 WHERE id = %(id)s AND {_running()} AND lease_epoch = %(epoch)s
RETURNING {COLUMNS}
"""


def bump_mirror_attempts(
    lease: Lease,
    *,
    max_attempts: int,
    delay_ms: int,
    message: str | None,
    using: str = DEFAULT_DB_ALIAS,
) -> Job | None:
    """Count a failed mirror, release the lease, and park the job once the budget is spent.

    Returns the row as written (``status == 'failed'`` when it was parked), or None when
    the epoch moved on. Spends no retry budget: the work did not fail, its reflection did.
    """
    return fetch_job(
        using,
        BUMP_MIRROR_ATTEMPTS,
        {**_lease(lease), "max_attempts": max_attempts, "delay_ms": delay_ms, "message": message},
    )


# The pending twin: a cancel_pending whose mirror failed. The `pending` status and the
# cancel request are the fence; past the budget the job is parked for an operator.
BUMP_PENDING_MIRROR_ATTEMPTS = f"""
UPDATE {TABLE}
   SET mirror_attempts = mirror_attempts + 1,
       status = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s THEN 'failed' ELSE status END,
       parked_at = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s THEN now() ELSE parked_at END,
       finished_at = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s THEN now() ELSE finished_at END,
       pending_since = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s THEN NULL ELSE pending_since END,
       next_run_at = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s THEN NULL ELSE next_run_at END,
       error_code = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s THEN 'mirror_failed' ELSE error_code END,
       error_class = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s
                          THEN coalesce(error_class, 'terminal') ELSE error_class END,
       error_message = CASE WHEN mirror_attempts + 1 >= %(max_attempts)s
                            THEN %(message)s ELSE error_message END,
       updated_at = now()
 WHERE id = %(id)s AND status = 'pending' AND cancel_requested_at IS NOT NULL
RETURNING {COLUMNS}
"""


def bump_pending_mirror_attempts(
    job_id: object, *, max_attempts: int, message: str | None, using: str = DEFAULT_DB_ALIAS
) -> Job | None:
    """Count a failed mirror of a pending cancellation; park the job once the budget is spent."""
    return fetch_job(
        using,
        BUMP_PENDING_MIRROR_ATTEMPTS,
        {"id": job_id, "max_attempts": max_attempts, "message": message},
    )


# Telling a parked job's subject: the reconciler calls the kind's mirror with "failed" for
# a job parked (poison, mirror_failed) while its domain row still says "running". The stamp
# runs in the mirror's transaction, like the terminal CAS it stands in for, so "mirrored"
# commits exactly when the mirror did. Fenced on the parked state and the epoch the
# candidate was selected at: an operator redrive in between (epoch + 1, stamp cleared)
# makes it a no-op.
_PARKED_UNTOLD = "status = 'failed' AND parked_at IS NOT NULL AND domain_mirrored_at IS NULL"

STAMP_PARKED_MIRRORED = f"""
UPDATE {TABLE} SET domain_mirrored_at = now(), updated_at = now()
 WHERE id = %(id)s AND {_PARKED_UNTOLD} AND lease_epoch = %(epoch)s
RETURNING {COLUMNS}
"""


def stamp_parked_mirrored(
    job_id: object, *, epoch: int, using: str = DEFAULT_DB_ALIAS
) -> Job | None:
    """Record that a parked job's subject was told; run it beside the mirror, in one transaction.

    Returns the row the mirror gets (``parked_at`` set, ``error_code`` the park reason), or
    None when the job is no longer parked-and-untold at ``epoch``.
    """
    return fetch_job(using, STAMP_PARKED_MIRRORED, {"id": job_id, "epoch": epoch})


# Its own autocommit statement, after the mirror's transaction rolled back (invariant 11):
# a count written inside that transaction would roll back with it, and a mirror that
# always fails would be called for ever. The caller stops once the count reaches the
# kind's MAX_MIRROR_ATTEMPTS (the candidate selection leaves such rows out).
BUMP_PARK_MIRROR_ATTEMPTS = f"""
UPDATE {TABLE} SET park_mirror_attempts = park_mirror_attempts + 1, updated_at = now()
 WHERE id = %(id)s AND {_PARKED_UNTOLD} AND lease_epoch = %(epoch)s
RETURNING park_mirror_attempts
"""


def bump_park_mirror_attempts(
    job_id: object, *, epoch: int, using: str = DEFAULT_DB_ALIAS
) -> int | None:
    """Count a failed attempt to tell a parked job's subject; the new count (None: moved on)."""
    return fetch_value(using, BUMP_PARK_MIRROR_ATTEMPTS, {"id": job_id, "epoch": epoch})


# ---------------------------------------------------------------------------------------
# 4. Operator: cancellation requests (invariant 8)
# ---------------------------------------------------------------------------------------

SHOW_LOCK_TIMEOUT = "SELECT current_setting('lock_timeout')"


def _waiting_at_most(
    lock_timeout_ms: int | None,
    job_id: object,
    operation: str,
    run: Callable[[], T],
    *,
    using: str,
) -> T:
    """Run an operator's statement in a savepoint; wait at most ``lock_timeout_ms`` for row locks.

    Invariant 5 lets a worker's ``fenced()`` hold the job row for as long as its domain
    transaction lasts; an operator must not hang behind it. The timeout is set for this
    statement only: these run in the caller's transaction, so the caller's own setting is
    put back afterwards (and a timeout rolls back only the savepoint, which also undoes the
    SET LOCAL), leaving their transaction usable. Raises ``JobBusy`` on the timeout.
    """
    if lock_timeout_ms is None:
        with transaction.atomic(using=using):
            return run()
    try:
        with transaction.atomic(using=using):
            previous = fetch_value(using, SHOW_LOCK_TIMEOUT, {})
            fetch_value(using, SET_LOCAL_LOCK_TIMEOUT, {"ms": f"{int(lock_timeout_ms)}ms"})
            result = run()
            fetch_value(using, SET_LOCAL_LOCK_TIMEOUT, {"ms": previous})
            return result
    except OperationalError as error:
        if sqlstate(error) != LOCK_NOT_AVAILABLE:
            raise
        raise JobBusy(job_id, operation, waited=lock_timeout_ms / 1000) from error


REQUEST_CANCEL = f"""
UPDATE {TABLE}
   SET cancel_requested_at = coalesce(cancel_requested_at, now()),
       cancelled_by = coalesce(cancelled_by, %(by)s),
       updated_at = now()
 WHERE id = %(id)s AND {SCOPE} AND status IN {LIVE}
RETURNING {COLUMNS}
"""


def request_cancel(
    job_id: object,
    scope: Scope,
    *,
    by: str | None,
    lock_timeout_ms: int | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Job | None:
    """Record the wish to cancel (invariant 8); None unless the job is live in ``scope``.

    Never writes ``status``: a running slice sees the flag at its next heartbeat and ends
    itself through ``cancel``; a pending job is ended by the reconciler's ``cancel_pending``.
    The first request's time and author are kept. With ``lock_timeout_ms``, raises
    ``JobBusy`` rather than wait longer behind a transaction holding the row.
    """
    params = {"id": job_id, **scope_params(scope), "by": by}
    return _waiting_at_most(
        lock_timeout_ms,
        job_id,
        "cancel",
        lambda: fetch_job(using, REQUEST_CANCEL, params),
        using=using,
    )


# The `pending` status is the fence: there is no lease to check.
CANCEL_PENDING = f"""
UPDATE {TABLE}
   SET status = 'cancelled', finished_at = now(), domain_mirrored_at = now(), lease_owner = NULL,
       lease_expires_at = clock_timestamp(), next_run_at = NULL, pending_since = NULL,
       updated_at = now()
 WHERE id = %(id)s AND status = 'pending' AND cancel_requested_at IS NOT NULL
RETURNING {COLUMNS}
"""


def cancel_pending(job_id: object, *, using: str = DEFAULT_DB_ALIAS) -> Job | None:
    """End a pending job whose cancellation was requested; None when it is not both."""
    return fetch_job(using, CANCEL_PENDING, {"id": job_id})


# The admin's bulk cancel ("all N matching", run by the durable_jobs.bulk_action job): one
# statement per chunk instead of one per job. Each job is matched by id *and* its own scope
# (invariant 10); only live jobs are touched (invariant 8: a request, never a status
# write); a row a worker's transaction holds is skipped, not waited for (operators never
# hang), and the caller reports it as busy.
REQUEST_CANCEL_MANY = f"""
WITH wanted AS (
    SELECT j.id
      FROM {TABLE} j
      JOIN unnest(%(ids)s::uuid[], %(tenants)s::text[], %(organizations)s::text[])
           AS w(id, tenant, organization)
        ON j.id = w.id AND j.tenant_id = w.tenant AND j.organization_id IS NOT DISTINCT FROM w.organization
     WHERE j.status IN {LIVE}
       FOR UPDATE OF j SKIP LOCKED
)
UPDATE {TABLE} AS t
   SET cancel_requested_at = coalesce(t.cancel_requested_at, now()),
       cancelled_by = coalesce(t.cancelled_by, %(by)s),
       updated_at = now()
  FROM wanted
 WHERE t.id = wanted.id
RETURNING t.id
"""


def request_cancel_many(
    items: Sequence[tuple[Any, str, str | None]], *, by: str | None, using: str = DEFAULT_DB_ALIAS
) -> set[Any]:
    """Request cancellation of each live ``(job id, tenant, organization)``; return the ids changed.

    An id missing from the answer was finished, not in that scope, or held by another
    transaction at that moment (skipped, never waited for).
    """
    if not items:
        return set()
    params = {
        "ids": [i[0] for i in items],
        "tenants": [i[1] for i in items],
        "organizations": [i[2] for i in items],
        "by": by,
    }
    with execute(using, REQUEST_CANCEL_MANY, params) as cursor:
        return {row[0] for row in cursor.fetchall()}


# ---------------------------------------------------------------------------------------
# 5. Reconcile and redrive: one core, three predicates and budgets
# ---------------------------------------------------------------------------------------

_REDRIVE_CORE = """status = 'pending', lease_owner = NULL, lease_epoch = lease_epoch + 1,
       lease_expires_at = clock_timestamp(), redrives = redrives + 1, pending_since = now(),
       updated_at = now()"""

# An orphan is a running job whose lease expired, past a grace, *under a live claim*
# (lease_owner set) and nothing else (DESIGN §6). A failed slice waiting for its retry has
# a released lease and is merely queued: taking it would spend its budget and eventually
# park a healthy job as poison. Verdict rows are finished by the reconciler instead of
# being run again; cancel-requested rows are ended by its cancel step.
# The poison verdict is decided here, from the counter this statement increments
# (invariant 3): past the budget the orphan is parked instead of re-driven.
_POISON = "%(max_redrives)s::int IS NOT NULL AND redrives_since_commit + 1 > %(max_redrives)s::int"

# The crash charge, shared by the reconciler's orphan take and the worker's own report of
# an abrupt interruption: a new delivery (redrives + 1, epoch + 1 fences off whatever is
# left of the old holder), counted against the poison budget, parked past it.
_REDRIVE_OR_PARK_POISON = f"""lease_owner = NULL, lease_epoch = lease_epoch + 1, lease_expires_at = clock_timestamp(),
       redrives = redrives + 1, updated_at = now(),
       redrives_since_commit = redrives_since_commit + 1,
       next_run_at = CASE WHEN {_POISON} THEN NULL ELSE clock_timestamp() + {_ms("backoff_ms")} END,
       status = CASE WHEN {_POISON} THEN 'failed' ELSE 'pending' END,
       pending_since = CASE WHEN {_POISON} THEN NULL ELSE now() END,
       parked_at = CASE WHEN {_POISON} THEN now() ELSE parked_at END,
       finished_at = CASE WHEN {_POISON} THEN now() ELSE finished_at END,
       error_code = CASE WHEN {_POISON} THEN 'poison' ELSE error_code END,
       error_class = CASE WHEN {_POISON} THEN coalesce(error_class, 'terminal') ELSE error_class END,
       error_message = CASE WHEN {_POISON}
           THEN 're-driven ' || (redrives_since_commit + 1) || ' times without committing any work (budget '
                || %(max_redrives)s::int || ')' || coalesce('; last: ' || %(reason)s::text, '')
           ELSE coalesce(%(reason)s::text, error_message) END"""

# The attempt names the lease owner the take fenced off; the UPDATE clears it, so it is
# read from the row locked in the same statement (`was`: FOR UPDATE waits for, and then
# reads, the row's latest version, the one the UPDATE re-checks its fence against).
# A parking take records the verdict it reached ('poison'); a plain take, none.
_LOST_ATTEMPT = """s.lease_epoch - 1, s.was_owner, NULL, s.heartbeat_at, clock_timestamp(),
           'lease_lost', CASE WHEN s.status = 'failed' THEN s.error_class END,
           CASE WHEN s.status = 'failed' THEN s.error_code END,
           'its worker stopped heartbeating: the lease expired past ORPHAN_GRACE and the '
           || 'reconciler took the job over', NULL"""

TAKE_ORPHAN = f"""
WITH taken AS (
UPDATE {TABLE} AS j
   SET {_REDRIVE_OR_PARK_POISON}
  FROM (SELECT id, lease_owner FROM {TABLE} WHERE id = %(id)s FOR UPDATE) AS was
 WHERE j.id = was.id AND {_running("j")} AND j.lease_owner IS NOT NULL
   AND j.lease_expires_at < clock_timestamp() - {_ms("grace_ms")}
   AND j.cancel_requested_at IS NULL
   AND (j.error_code IS NULL OR j.error_code NOT IN {_VERDICTS})
RETURNING {_J_COLUMNS}, was.lease_owner AS was_owner
), {_recording("taken", _LOST_ATTEMPT)}
SELECT {COLUMNS} FROM taken
"""


def take_orphan(
    job_id: object,
    *,
    grace_ms: int,
    backoff_ms: int,
    max_redrives: int | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Job | None:
    """Take an orphan back to pending under a new delivery (redrives + 1, epoch + 1).

    The epoch bump is what stops the old holder: if it wakes up, its heartbeat and every
    fenced write find zero rows. Counts against ``redrives_since_commit`` (the poison
    budget), which any committed unit resets; once that count exceeds ``max_redrives``
    the same statement parks the job ``poison`` (``status == 'failed'`` in the reply).

    Invariant 32: the same statement records the lost slice (outcome ``lease_lost``,
    its worker the owner it fenced off, epoch the one that slice held).
    """
    return fetch_job(
        using,
        TAKE_ORPHAN,
        {
            "id": job_id,
            "grace_ms": grace_ms,
            "backoff_ms": backoff_ms,
            "max_redrives": max_redrives,
            "reason": None,
            "keep": conf.get().ATTEMPT_HISTORY_KEEP,
        },
    )


# An interruption the worker saw itself (its connection cut mid-slice, the server
# restarted, the child process running the handler died) is a crash it lived to report:
# charged exactly as the orphan take would charge it (DESIGN §2, "interruption"), only
# sooner, and fenced on the lease like every holder's write.
_INTERRUPTED_ATTEMPT = """s.lease_epoch - 1, %(owner)s, %(started_at)s::timestamptz, s.heartbeat_at,
           clock_timestamp(), 'interrupted', CASE WHEN s.status = 'failed' THEN s.error_class END,
           CASE WHEN s.status = 'failed' THEN s.error_code END, %(attempt_message)s,
           %(traceback)s"""

CHARGE_INTERRUPTION = f"""
WITH charged AS (
UPDATE {TABLE}
   SET {_REDRIVE_OR_PARK_POISON}
 WHERE id = %(id)s AND {LEASE_HELD}
RETURNING {COLUMNS}
), {_recording("charged", _INTERRUPTED_ATTEMPT)}
SELECT {COLUMNS} FROM charged
"""


def charge_interruption(
    lease: Lease,
    *,
    reason: str,
    backoff_ms: int,
    max_redrives: int | None,
    traceback: str | None = None,
    started_at: datetime.datetime | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Job | None:
    """Hand back a slice that an abrupt interruption ended, charged to the poison budget.

    Invariant 14a: never ``consecutive_failures`` (the work did not fail), never free (a
    handler that kills its process each time must end parked ``poison``). Returns the row
    (``status == 'failed'`` when parked), or None if the lease is gone. Invariant 32: the
    same statement records the attempt (outcome ``interrupted``, ``reason`` its message).
    """
    return fetch_job(
        using,
        CHARGE_INTERRUPTION,
        {
            **_lease(lease),
            "reason": reason,
            "backoff_ms": backoff_ms,
            "max_redrives": max_redrives,
            **_attempt_params(
                outcome="interrupted", message=reason, traceback=traceback, started_at=started_at
            ),
        },
    )


# Awaiting a delivery a broker may have lost: pending, or a released lease (a failed slice
# waiting for its retry, whose delayed delivery is as losable as a start's), and due for
# longer than the pending TTL. A running job under a live claim is the orphan take's.
# Neither a job held by a workflow wait (woken by a statement, never lost) nor one on a
# paused queue (invariant 27: nobody may claim it, so it is not late) awaits a delivery.
_AWAITING_DELIVERY = f"""(status = 'pending' OR (status = 'running' AND lease_owner IS NULL))
   AND cancel_requested_at IS NULL AND NOT {_FLOW_HELD}
   AND greatest(pending_since, coalesce(next_run_at, pending_since))
       < clock_timestamp() - {_ms("pending_ttl_ms")}
   AND {QUEUE_NOT_PAUSED}"""

REDRIVE_PENDING = f"""
UPDATE {TABLE}
   SET {_REDRIVE_CORE},
       redrives_since_commit = redrives_since_commit + 1,
       next_run_at = clock_timestamp()
 WHERE id = %(id)s AND {_AWAITING_DELIVERY}
RETURNING {COLUMNS}
"""


def redrive_pending(
    job_id: object, *, pending_ttl_ms: int, using: str = DEFAULT_DB_ALIAS
) -> Job | None:
    """Re-issue a job whose delivery a broker lost under a new pair (broker transports only).

    Invariant 31: a start whose publish never reached the broker (a crash between commit
    and publish, a broker down, a publish timed out) is found here and published again
    under ``(seq, redrives + 1)``, so a late copy of the lost message is a straggler.
    Charged to ``redrives_since_commit``, the seed's budget for lost deliveries; the
    caller parks the job (``park``) once that budget is spent. Covers a released lease
    too: a failed slice's delayed retry is a delivery the broker can lose as well.

    The database transport never calls this: a pending row cannot lose its delivery, and
    spending budget because no worker ran would park healthy jobs (DESIGN §6).
    """
    return fetch_job(using, REDRIVE_PENDING, {"id": job_id, "pending_ttl_ms": pending_ttl_ms})


PARK = f"""
UPDATE {TABLE}
   SET status = 'failed', parked_at = now(), finished_at = now(),
       lease_owner = NULL, lease_expires_at = clock_timestamp(), next_run_at = NULL,
       pending_since = NULL, error_code = %(reason)s,
       error_class = coalesce(error_class, 'terminal'),
       error_message = coalesce(%(message)s, error_message), updated_at = now()
 WHERE id = %(id)s AND lease_epoch = %(epoch)s AND status IN {LIVE}
RETURNING {COLUMNS}
"""


def park(
    job_id: object, epoch: int, reason: str, message: str | None, *, using: str = DEFAULT_DB_ALIAS
) -> Job | None:
    """Fail a job with a reason only an operator re-drives; fenced on the epoch the caller saw."""
    return fetch_job(
        using, PARK, {"id": job_id, "epoch": epoch, "reason": reason, "message": message}
    )


GET_JOB = f"SELECT {COLUMNS} FROM {TABLE} WHERE id = %(id)s AND {SCOPE}"


def get_job(job_id: object, scope: Scope, *, using: str = DEFAULT_DB_ALIAS) -> Job | None:
    """Return the job with ``job_id`` in ``scope``; another scope's job is simply absent."""
    return fetch_job(using, GET_JOB, {"id": job_id, **scope_params(scope)})


# Resets the budgets (a wait's fault streak too; its hold clock is kept: written once),
# because an operator asking for a re-drive is asking for more attempts; keeps `redrives`
# (identity, not budget: a retained broker message may carry the old pair). Clears the
# cancellation too: an explicit re-drive supersedes a request the failed slice never
# honoured. `completed` and `cancelled` are never re-drivable (invariant 13);
# `unrecoverable` only with force.
OPERATOR_REDRIVE = f"""
UPDATE {TABLE}
   SET {_REDRIVE_CORE},
       redrives_since_commit = 0, consecutive_failures = 0, mirror_attempts = 0,
       park_mirror_attempts = 0, parked_at = NULL, error_code = NULL, error_class = NULL, finished_at = NULL,
       domain_mirrored_at = NULL, cancel_requested_at = NULL, cancelled_by = NULL,
       wait_faults = 0, wait_denials = 0,
       next_run_at = clock_timestamp()
 WHERE id = %(id)s AND {SCOPE}
   -- A parked job's code is the park reason; its class still says unrecoverable.
   AND (%(force)s OR (error_code IS DISTINCT FROM 'unrecoverable'
                      AND error_class IS DISTINCT FROM 'unrecoverable'))
   AND (status = 'failed'
        OR (status = 'running' AND lease_owner IS NOT NULL
            AND lease_expires_at < clock_timestamp() - {_ms("grace_ms")}))
RETURNING {COLUMNS}
"""


def operator_redrive(
    job_id: object,
    scope: Scope,
    *,
    force: bool,
    grace_ms: int,
    lock_timeout_ms: int | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Job | None:
    """Re-issue a failed job (or take an expired lease by hand); None when refused.

    Raises ``LockKeyHeld`` when the failed job's lock key has since been taken by a live
    job: making this one live again would be a second live job on the key (and
    ``WaitKeyHeld`` likewise for its wait key, ``UniqueKeyHeld`` for its unique key). The UPDATE runs
    in a savepoint, so the refusal leaves the caller's transaction usable. With
    ``lock_timeout_ms``, raises ``JobBusy`` rather than wait longer behind a transaction
    holding the row.
    """
    params = {"id": job_id, **scope_params(scope), "force": force, "grace_ms": grace_ms}

    def redrive() -> Job | None:
        # A failed child made live again is uncounted on its parent in the same
        # transaction, its old status read under the row lock (invariant 30).
        was = lock_child(job_id, scope, using=using)
        job = fetch_job(using, OPERATOR_REDRIVE, params)
        if job is not None and was is not None and was[0] == "failed" and was[1] is not None:
            uncount_child(was[1], using=using)
        return job

    try:
        return _waiting_at_most(lock_timeout_ms, job_id, "redrive", redrive, using=using)
    except IntegrityError as error:
        constraint = getattr(getattr(error.__cause__, "diag", None), "constraint_name", None)
        if constraint == WAIT_KEY_INDEX:
            job = get_job(job_id, scope, using=using)
            holder = (
                find_wait_holder(scope, job.wait_key, window_ms=0, using=using)
                if job and job.wait_key
                else None
            )
            raise WaitKeyHeld(
                job.wait_key if job else None, holder.id if holder else None
            ) from error
        if constraint in (UNIQUE_LIVE_INDEX, UNIQUE_WINDOW_INDEX):
            # Invariant 25: back to pending would make a second job on its unique key.
            job = get_job(job_id, scope, using=using)
            raise UniqueKeyHeld(job.unique_key if job else None) from error
        if constraint != LOCK_KEY_INDEX:
            raise
        job = get_job(job_id, scope, using=using)
        holder = (
            find_live_by_lock_key(scope, job.lock_key, using=using)
            if job and job.lock_key
            else None
        )
        raise LockKeyHeld(job.lock_key if job else None, holder.id if holder else None) from error


RECORD_ENQUEUE = f"""
UPDATE {TABLE} SET queue_job_id = %(queue_job_id)s, updated_at = now()
 WHERE id = %(id)s AND queue_name = %(queue)s AND status IN {LIVE} AND lease_owner IS NULL
   AND continuation_seq = %(seq)s AND redrives = %(redrives)s
RETURNING 1
"""


def record_enqueue(
    job_id: object,
    queue_job_id: str,
    queue: str,
    delivery: Delivery,
    *,
    using: str = DEFAULT_DB_ALIAS,
) -> bool:
    """Record the message id a broker transport accepted, so a later cancel can remove it.

    Only for a job still awaiting *that* delivery (pending, or a released lease, with the
    pair the message carries): a slow publish of an older pair, finishing after the
    stale-pending re-drive published the current one, must not overwrite the current
    message's id, or a cancel would remove the straggler and leave the live message.
    False when the job moved on (claimed, re-driven, finished): nothing to remove then.
    """
    return (
        fetch_value(
            using,
            RECORD_ENQUEUE,
            {
                "id": job_id,
                "queue_job_id": queue_job_id,
                "queue": queue,
                "seq": delivery.seq,
                "redrives": delivery.redrives,
            },
        )
        is not None
    )


# ---------------------------------------------------------------------------------------
# Reconciler leadership: one leased row per leadership name, so that every worker can run
# the reconciler loop and only one at a time does. A row rather than an advisory lock: a
# pooler in transaction mode hands a session lock to whoever borrows the server
# connection next. Leadership is an economy, not a fence for job rows: passes are safe
# side by side (invariant 14), so a leader that stalls past its lease and wakes up next
# to its successor does no harm. The epoch counts takeovers, like a job's lease epoch.
# ---------------------------------------------------------------------------------------

# One statement for both taking and renewing: the row is taken when it is free (resigned
# or expired, on the database clock) and renewed when this owner still holds it; any
# other holder's live lease refuses it (no row returned).
ACQUIRE_LEADERSHIP = f"""
INSERT INTO {LEADER_TABLE} AS l (name, owner, epoch, expires_at)
VALUES (%(name)s, %(owner)s, 1, clock_timestamp() + {_ms("ttl_ms")})
ON CONFLICT (name) DO UPDATE
   SET owner = excluded.owner,
       epoch = CASE WHEN l.owner = excluded.owner THEN l.epoch ELSE l.epoch + 1 END,
       expires_at = excluded.expires_at
 WHERE l.owner = excluded.owner OR l.owner IS NULL OR l.expires_at < clock_timestamp()
RETURNING epoch
"""


def acquire_leadership(
    name: str, owner: str, *, ttl_ms: int, using: str = DEFAULT_DB_ALIAS
) -> int | None:
    """Take or renew leadership ``name`` for ``ttl_ms``; its epoch, or None if another owner holds it.

    A takeover (from an expired or resigned holder) bumps the epoch; a renewal keeps it.
    """
    return fetch_value(using, ACQUIRE_LEADERSHIP, {"name": name, "owner": owner, "ttl_ms": ttl_ms})


# Keeps the row and its epoch (so the next holder's epoch is still one more), frees it
# at once: on a graceful stop, leadership moves without waiting out the lease.
RESIGN_LEADERSHIP = f"""
UPDATE {LEADER_TABLE} SET owner = NULL, expires_at = clock_timestamp()
 WHERE name = %(name)s AND owner = %(owner)s
RETURNING epoch
"""


def resign_leadership(name: str, owner: str, *, using: str = DEFAULT_DB_ALIAS) -> bool:
    """Give leadership ``name`` up if ``owner`` holds it; False when it did not."""
    return fetch_value(using, RESIGN_LEADERSHIP, {"name": name, "owner": owner}) is not None


# ---------------------------------------------------------------------------------------
# Reconciler candidates. FOR UPDATE SKIP LOCKED lets reconcilers run side by side, each
# taking a disjoint share instead of blocking or acting twice (invariant 14). The tenant
# filter lets a fleet shard the loop. Call these inside a transaction.
# ---------------------------------------------------------------------------------------

_TENANT_FILTER = "(%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)"
# The same predicate picks a batch (no id) or re-takes one candidate (its id) in the short
# transaction that acts on it, so that user mirror code only ever runs with that one row
# locked. Parameters are bound client-side, so the planner sees a constant NULL and drops
# the clause from the batch query.
_ONE_OR_ALL = "(%(job_id)s::uuid IS NULL OR id = %(job_id)s::uuid)"

# Only jobs no worker is running: a live slice ends itself at its next heartbeat, and
# locking it here would only hold up its heartbeat and fill the batch, starving the rest.
SELECT_CANCELLING = f"""
SELECT {COLUMNS} FROM {TABLE}
 WHERE cancel_requested_at IS NOT NULL AND status IN {LIVE}
   AND (status = 'pending' OR lease_owner IS NULL
        OR lease_expires_at < clock_timestamp() - {_ms("grace_ms")})
   AND {_TENANT_FILTER} AND {_ONE_OR_ALL}
 ORDER BY cancel_requested_at
 LIMIT %(limit)s
 FOR UPDATE SKIP LOCKED
"""


def select_cancelling(
    *,
    grace_ms: int,
    limit: int,
    tenant: str | None = None,
    job_id: object = None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[Job]:
    """Lock and return live jobs whose cancellation was requested and that no worker is running.

    With ``job_id``, only that job (if it still qualifies and nobody holds its row).
    """
    return fetch_jobs(
        using,
        SELECT_CANCELLING,
        {"grace_ms": grace_ms, "limit": limit, "tenant": tenant, "job_id": job_id},
    )


SELECT_ORPHANS = f"""
SELECT {COLUMNS} FROM {TABLE}
 WHERE status = 'running' AND lease_owner IS NOT NULL
   AND lease_expires_at < clock_timestamp() - {_ms("grace_ms")}
   AND {_TENANT_FILTER} AND {_ONE_OR_ALL}
 ORDER BY lease_expires_at
 LIMIT %(limit)s
 FOR UPDATE SKIP LOCKED
"""


def select_orphans(
    *,
    grace_ms: int,
    limit: int,
    tenant: str | None = None,
    job_id: object = None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[Job]:
    """Lock and return running jobs whose lease expired past the grace (orphans and dead verdicts).

    With ``job_id``, only that job (if it still qualifies and nobody holds its row).
    """
    return fetch_jobs(
        using,
        SELECT_ORPHANS,
        {"grace_ms": grace_ms, "limit": limit, "tenant": tenant, "job_id": job_id},
    )


# Parked jobs whose subject has not been told, of the kinds this process knows (a kind
# it does not know waits for a reconciler that does: stamping it unmirrored would lie),
# each under its own kind's bound on attempts. Reads durable_jobs_parked_untold.
SELECT_PARKED_UNTOLD = f"""
SELECT {COLUMNS} FROM {TABLE} AS j
 WHERE {_PARKED_UNTOLD}
   AND park_mirror_attempts < (SELECT b.most FROM unnest(%(kinds)s::text[], %(bounds)s::int[]) AS b(kind, most)
                                WHERE b.kind = j.kind)
   AND {_TENANT_FILTER} AND {_ONE_OR_ALL}
 ORDER BY parked_at
 LIMIT %(limit)s
 FOR UPDATE SKIP LOCKED
"""


def select_parked_untold(
    bounds: dict[str, int],
    *,
    limit: int,
    tenant: str | None = None,
    job_id: object = None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[Job]:
    """Lock and return parked jobs whose domain rows were never told, of the kinds in ``bounds``.

    ``bounds`` maps each kind to its MAX_MIRROR_ATTEMPTS: a job whose attempts reached it
    is left alone. With ``job_id``, only that job.
    """
    kinds = sorted(bounds)
    return fetch_jobs(
        using,
        SELECT_PARKED_UNTOLD,
        {
            "kinds": kinds,
            "bounds": [bounds[k] for k in kinds],
            "limit": limit,
            "tenant": tenant,
            "job_id": job_id,
        },
    )


# Invariant 27: a paused queue's backlog waits by design. It is neither stale (no warning,
# no stale_pending gauge to page anyone) nor re-driven (a broker transport's re-drive
# would spend redrives_since_commit on a job nobody was allowed to claim).
SELECT_STALE_PENDING = f"""
SELECT {COLUMNS} FROM {TABLE}
 WHERE (%(queues)s::text[] IS NULL OR queue_name = ANY(%(queues)s::text[]))
   AND {_AWAITING_DELIVERY}
   AND {_TENANT_FILTER}
 ORDER BY next_run_at NULLS FIRST
 LIMIT %(limit)s
 FOR UPDATE SKIP LOCKED
"""


def select_stale_pending(
    *,
    queues: Sequence[str] | None,
    pending_ttl_ms: int,
    limit: int,
    tenant: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[Job]:
    """Lock and return jobs of ``queues`` awaiting a delivery for longer than the pending TTL.

    Only the broker queues are passed (DESIGN §6): on the database transport a due row is
    its own delivery, and re-driving it would spend budget because no worker ran. None:
    every queue (one broker carries them all).
    """
    return fetch_jobs(
        using,
        SELECT_STALE_PENDING,
        {
            "queues": None if queues is None else list(queues),
            "pending_ttl_ms": pending_ttl_ms,
            "limit": limit,
            "tenant": tenant,
        },
    )


COUNT_STALE_PENDING = f"""
SELECT count(*) FROM {TABLE}
 WHERE status = 'pending' AND cancel_requested_at IS NULL AND NOT {_FLOW_HELD}
   AND greatest(pending_since, coalesce(next_run_at, pending_since))
       < clock_timestamp() - {_ms("pending_ttl_ms")}
   AND {QUEUE_NOT_PAUSED}
   AND {_TENANT_FILTER}
"""


def count_stale_pending(
    *, pending_ttl_ms: int, tenant: str | None = None, using: str = DEFAULT_DB_ALIAS
) -> int:
    """Count pending jobs due for longer than the pending TTL (a warning, never a re-drive)."""
    return int(
        fetch_value(
            using, COUNT_STALE_PENDING, {"pending_ttl_ms": pending_ttl_ms, "tenant": tenant}
        )
        or 0
    )


# Retention. Bounded batches, SKIP LOCKED so it never waits on (or races) anyone.
# Parked jobs are kept: they are waiting for an operator. Oldest first, read in order
# from durable_jobs_finished (finished_at, unparked rows only), so a batch costs the same
# at ten million finished rows as at a thousand. The batch's rows are deleted by their
# physical address (ctid, a TID scan): going back through the random-UUID primary key
# cost as many index page reads as the rows themselves (measured: 35,180 buffers against
# 20,180 per 5,000 rows, 2-3x the time). The rows are locked by this statement from the
# moment they are chosen, so their ctid cannot change before the DELETE reaches them.
DELETE_FINISHED = f"""
DELETE FROM {TABLE} WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {TABLE}
     WHERE finished_at IS NOT NULL AND parked_at IS NULL
       AND status IN ('completed', 'failed', 'cancelled')
       -- now(), not clock_timestamp(): a stable value lets durable_jobs_finished bound
       -- the scan (a volatile one made this read the whole table every pass). This runs
       -- as its own statement, so now() is the moment it starts.
       AND finished_at < now() - {_ms("older_than_ms")}
       AND {_TENANT_FILTER}
     ORDER BY finished_at
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED
))
"""


def delete_finished(
    *, older_than_ms: int, limit: int, tenant: str | None = None, using: str = DEFAULT_DB_ALIAS
) -> int:
    """Delete up to ``limit`` finished, unparked jobs older than the retention; return how many."""
    with execute(
        using, DELETE_FINISHED, {"older_than_ms": older_than_ms, "limit": limit, "tenant": tenant}
    ) as cursor:
        return cursor.rowcount


# ---------------------------------------------------------------------------------------
# 6. Waits (durable_jobs.waits). A held job is `pending`, `held_since` set,
# `wait_satisfied_at` null; its next check is `next_run_at` and it holds no lease while it
# waits, so the reconciler never mistakes it for an orphan and the stale-pending warning
# never counts it (its next_run_at is ahead). Every write here is made by the worker
# holding the claim that picked the job up, fenced like any lease holder's (invariant 4),
# before the handler's first slice. The hold spends no budget: no counter a verdict of
# the work reads is touched, and `continuation_seq` stays (the first slice has not run).
# ---------------------------------------------------------------------------------------

# The wait key's holder: a live job (the unique index's own predicate, organization
# folded the same way), else a job whose wait on the key cleared within the window and
# that completed. Two starts for one target can never both hold (the index), so the
# window covers the one remaining duplicate: a sibling that arrives just after the
# holder's wait cleared and its (short) run already finished. It is the backoff ceiling by
# default, the longest two checks of one condition can land apart; past it a start is a
# new intent, never coalesced with history. A failed or cancelled run did not serve the
# intent, so it coalesces nothing.
FIND_WAIT_HOLDER = f"""
SELECT {COLUMNS} FROM {TABLE}
 WHERE tenant_id = %(tenant)s
   AND coalesce(organization_id, '{NO_ORGANIZATION}') = coalesce(%(organization)s, '{NO_ORGANIZATION}')
   AND wait_key = %(wait_key)s
   AND (status IN {LIVE}
        OR (status = 'completed' AND wait_satisfied_at > clock_timestamp() - {_ms("window_ms")}))
 ORDER BY status IN {LIVE} DESC, wait_satisfied_at DESC
 LIMIT 1
"""


def find_wait_holder(
    scope: Scope, wait_key: str, *, window_ms: int, using: str = DEFAULT_DB_ALIAS
) -> Job | None:
    """The job a start with ``wait_key`` in ``scope`` coalesces onto, or None (invariant 22)."""
    return fetch_job(
        using,
        FIND_WAIT_HOLDER,
        {**scope_params(scope), "wait_key": wait_key, "window_ms": window_ms},
    )


# Back to `pending` without a lease, until the instant (`until`, the `after` tier: one
# exact reschedule) or for `delay_ms` (a check said "not yet", or could not run). The hold
# clock starts once (invariant 18): coalesce keeps the first pickup's stamp across every
# re-pick, restart and worker. `started_at` is cleared: the claim stamped it, but no slice
# has started. A hold with `reset_faults` counts a real answer (faults are consecutive).
HOLD_JOB = f"""
UPDATE {TABLE}
   SET status = 'pending',
       lease_owner = NULL,
       lease_expires_at = clock_timestamp(),
       held_since = coalesce(held_since, clock_timestamp()),
       next_run_at = coalesce(%(until)s::timestamptz, clock_timestamp() + {_ms("delay_ms")}),
       pending_since = now(),
       started_at = NULL,
       wait_checks = wait_checks + %(checks)s,
       wait_faults = CASE WHEN %(reset_faults)s THEN 0 ELSE wait_faults END,
       wait_denials = CASE WHEN %(denied)s THEN wait_denials + 1 ELSE 0 END,
       updated_at = now()
 WHERE id = %(id)s AND {LEASE_HELD} AND wait_satisfied_at IS NULL
RETURNING {COLUMNS}
"""


def hold_job(
    lease: Lease,
    *,
    until: Any = None,
    delay_ms: int = 0,
    checks: int = 0,
    reset_faults: bool = False,
    denied: bool = False,
    using: str = DEFAULT_DB_ALIAS,
) -> Job | None:
    """Hold a claimed job until ``until`` (aware datetime) or for ``delay_ms``; None: lease gone.

    ``checks`` counts the check runs of this pickup; ``denied`` counts a pickup refused a
    check turn (consecutive: any other hold resets it).
    """
    return fetch_job(
        using,
        HOLD_JOB,
        {
            **_lease(lease),
            "until": until,
            "delay_ms": delay_ms,
            "checks": checks,
            "reset_faults": reset_faults,
            "denied": denied,
        },
    )


# A check that could not answer: counted, and the fault verdict decided from the counter
# this statement increments (invariant 3), never from the count the claim read.
COUNT_WAIT_FAULT = f"""
UPDATE {TABLE}
   SET wait_checks = wait_checks + %(checks)s,
       wait_faults = wait_faults + 1,
       wait_denials = 0,
       updated_at = now()
 WHERE id = %(id)s AND {LEASE_HELD} AND wait_satisfied_at IS NULL
RETURNING wait_faults, wait_faults >= %(max_faults)s
"""


def count_wait_fault(
    lease: Lease, *, checks: int, max_faults: int, using: str = DEFAULT_DB_ALIAS
) -> tuple[int, bool] | None:
    """Count a "cannot tell"; ``(consecutive faults, exhausted)``, or None if the lease is gone."""
    with execute(
        using, COUNT_WAIT_FAULT, {**_lease(lease), "checks": checks, "max_faults": max_faults}
    ) as cursor:
        row = cursor.fetchone()
    return None if row is None else (row[0], bool(row[1]))


# Checks that answered without clearing the wait for good ("never"): counted before the
# terminal transaction records the failure, with the fault streak reset (an answer).
COUNT_WAIT_CHECKS = f"""
UPDATE {TABLE}
   SET wait_checks = wait_checks + %(checks)s, wait_faults = 0, wait_denials = 0, updated_at = now()
 WHERE id = %(id)s AND {LEASE_HELD} AND wait_satisfied_at IS NULL
RETURNING wait_checks
"""


def count_wait_checks(lease: Lease, *, checks: int, using: str = DEFAULT_DB_ALIAS) -> int | None:
    """Count check runs that answered; return the total, or None if the lease is gone."""
    return fetch_value(using, COUNT_WAIT_CHECKS, {**_lease(lease), "checks": checks})


# Every condition cleared: stamped once, under the claim that will run the first slice.
# From here the gate never runs again for this job, whatever happens to its slices.
SATISFY_WAIT = f"""
UPDATE {TABLE}
   SET wait_satisfied_at = clock_timestamp(),
       wait_checks = wait_checks + %(checks)s,
       wait_faults = CASE WHEN %(checks)s > 0 THEN 0 ELSE wait_faults END,
       wait_denials = 0,
       updated_at = now()
 WHERE id = %(id)s AND {LEASE_HELD} AND wait_satisfied_at IS NULL
RETURNING {COLUMNS}
"""


def satisfy_wait(lease: Lease, *, checks: int, using: str = DEFAULT_DB_ALIAS) -> Job | None:
    """Record that the job's wait cleared (``checks`` ran this pickup); None: the lease is gone."""
    return fetch_job(using, SATISFY_WAIT, {**_lease(lease), "checks": checks})


# ---------------------------------------------------------------------------------------
# 7. Django's Tasks framework (durable_jobs.tasks.backend): one attempt row per run of a task job.
# Only the tasks backend's handler calls these, so ordinary jobs write nothing here.
# Neither statement touches the job row (a task's attempts are not committed units: they
# must not reset the failure counter that max_attempts is read from), yet both are fenced
# on its lease, read in the same statement: an attempt lands only while its claim holds.
# ---------------------------------------------------------------------------------------

_TASK_ATTEMPT_HELD = f"""EXISTS (SELECT 1 FROM {TABLE} AS j
               WHERE j.id = %(id)s AND {_running("j")} AND j.lease_owner = %(owner)s
                 AND j.lease_epoch = %(epoch)s)"""

# ON CONFLICT: one claim is one attempt; a handler process replaced mid-slice (its
# bookkeeping retried) finds its attempt already there and carries on with it.
BEGIN_TASK_ATTEMPT = f"""
INSERT INTO {TASK_ATTEMPT_TABLE} (job_id, epoch, worker_id, started_at)
SELECT %(id)s, %(epoch)s, %(worker_id)s, clock_timestamp()
 WHERE {_TASK_ATTEMPT_HELD}
ON CONFLICT (job_id, epoch) DO UPDATE SET worker_id = {TASK_ATTEMPT_TABLE}.worker_id
RETURNING started_at
"""


def begin_task_attempt(lease: Lease, worker_id: str, *, using: str = DEFAULT_DB_ALIAS) -> Any:
    """Record that this claim starts running the task; its start, or None if the lease is gone."""
    return fetch_value(using, BEGIN_TASK_ATTEMPT, {**_lease(lease), "worker_id": worker_id[:200]})


END_TASK_ATTEMPT = f"""
UPDATE {TASK_ATTEMPT_TABLE}
   SET finished_at = clock_timestamp(), exception_class_path = %(exception_class_path)s, traceback = %(traceback)s
 WHERE job_id = %(id)s AND epoch = %(epoch)s AND finished_at IS NULL AND {_TASK_ATTEMPT_HELD}
RETURNING finished_at
"""


def end_task_attempt(
    lease: Lease,
    *,
    exception_class_path: str | None = None,
    traceback: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> bool:
    """Record how this claim's attempt ended (an exception's path and traceback when it raised).

    False when the lease is gone or the attempt was already ended: nothing was written.
    """
    return (
        fetch_value(
            using,
            END_TASK_ATTEMPT,
            {
                **_lease(lease),
                "exception_class_path": exception_class_path,
                # The Tasks backend formats this traceback itself, from the exception: it
                # is redacted here, where it is stored (REDACT_ERROR).
                "traceback": conf.redact(traceback),
            },
        )
        is not None
    )


# ---------------------------------------------------------------------------------------
# Live workers (durable_jobs.models.WorkerProcess): the operators' list, never a job's
# liveness (that is its lease). A row whose beat is older than its TTL is a worker that
# died: the next registration prunes such rows, so the table stays as small as the fleet.
# ---------------------------------------------------------------------------------------

REGISTER_WORKER = f"""
WITH pruned AS (
    DELETE FROM {WORKER_TABLE} WHERE beat_at < clock_timestamp() - {_ms("ttl_ms")}
)
INSERT INTO {WORKER_TABLE}
    (identity, host, pid, version, queues, kinds, slots, execution, started_at, beat_at)
VALUES (%(identity)s, %(host)s, %(pid)s, %(version)s, %(queues)s::jsonb, %(kinds)s::jsonb,
        %(slots)s, %(execution)s, clock_timestamp(), clock_timestamp())
ON CONFLICT (identity) DO UPDATE
   SET queues = EXCLUDED.queues, kinds = EXCLUDED.kinds, beat_at = EXCLUDED.beat_at
"""


def register_worker(
    identity: str,
    *,
    host: str,
    pid: int,
    version: str,
    queues: Sequence[str],
    kinds: Sequence[str],
    slots: int,
    execution: str,
    ttl_ms: int,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Say that this worker process is up and what it serves; prune workers that died."""
    params = {
        "identity": identity,
        "host": host[:200],
        "pid": pid,
        "version": version[:50],
        "queues": dump_json(sorted(queues)),
        "kinds": dump_json(sorted(kinds)),
        "slots": slots,
        "execution": execution,
        "ttl_ms": ttl_ms,
    }
    with execute(using, REGISTER_WORKER, params):
        pass


BEAT_WORKER = f"""
UPDATE {WORKER_TABLE} SET beat_at = clock_timestamp(), kinds = %(kinds)s::jsonb
 WHERE identity = %(identity)s
"""


def beat_worker(identity: str, *, kinds: Sequence[str], using: str = DEFAULT_DB_ALIAS) -> bool:
    """Renew this worker's row (and the kinds it can run now); False when it is gone."""
    with execute(
        using, BEAT_WORKER, {"identity": identity, "kinds": dump_json(sorted(kinds))}
    ) as cursor:
        return cursor.rowcount == 1


UNREGISTER_WORKER = f"DELETE FROM {WORKER_TABLE} WHERE identity = %(identity)s"


def unregister_worker(identity: str, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Remove this worker from the list as it stops."""
    with execute(using, UNREGISTER_WORKER, {"identity": identity}):
        pass


# ---------------------------------------------------------------------------------------
# Paused queues (invariant 27): one row per paused queue, read by DEQUEUE in the same
# statement that claims. Pausing writes no job row: running slices go on, yield and fail
# under their own fences; what is pending, handed back or waiting out a retry simply
# waits, uncharged, because nothing claims it. Both writes are decided under the primary
# key (a unique index), never read-then-write.
# ---------------------------------------------------------------------------------------

# Idempotent: pausing a paused queue keeps the first pause (its paused_at, by and
# reason) and reports it as not new. ON CONFLICT DO UPDATE (a no-op assignment) rather
# than DO NOTHING: it locks and returns the existing row even when that row committed
# after this statement's snapshot, where a separate SELECT would see nothing.
# xmax = 0 only on a row this statement inserted.
PAUSE_QUEUE = f"""
INSERT INTO {PAUSED_QUEUE_TABLE} AS paused (queue_name, paused_at, paused_by, reason)
VALUES (%(queue)s, clock_timestamp(), %(by)s, %(reason)s)
ON CONFLICT (queue_name) DO UPDATE SET queue_name = paused.queue_name
RETURNING queue_name, paused_at, paused_by, reason, (xmax = 0) AS newly_paused
"""


def pause_queue(
    queue: str, *, by: str | None, reason: str | None, using: str = DEFAULT_DB_ALIAS
) -> QueuePause:
    """Pause ``queue``; return the pause in force (``newly_paused`` False: it already was).

    Invariant 27: from the first dequeue statement whose snapshot sees this commit on,
    no worker claims from ``queue``. Nothing else changes.
    """
    with execute(using, PAUSE_QUEUE, {"queue": queue, "by": by, "reason": reason}) as cursor:
        *row, newly = cursor.fetchone()
    return _paused(row, newly_paused=bool(newly))


# The wake-up rides in the same statement as the delete: PostgreSQL delivers a NOTIFY at
# commit, so idle workers look at the queue exactly when the resume is visible (the same
# channel and payload a start() sends), and a rolled-back resume wakes nobody.
RESUME_QUEUE = f"""
WITH resumed AS (
    DELETE FROM {PAUSED_QUEUE_TABLE} WHERE queue_name = %(queue)s
    RETURNING queue_name, paused_at, paused_by, reason
)
SELECT queue_name, paused_at, paused_by, reason,
       CASE WHEN %(channel)s::text IS NOT NULL THEN pg_notify(%(channel)s, queue_name) END
  FROM resumed
"""


def resume_queue(
    queue: str, *, notify_channel: str | None, using: str = DEFAULT_DB_ALIAS
) -> QueuePause | None:
    """Resume ``queue`` and wake idle workers; the pause it ended, or None if it was not paused."""
    with execute(using, RESUME_QUEUE, {"queue": queue, "channel": notify_channel}) as cursor:
        row = cursor.fetchone()
    return None if row is None else _paused(row[:4])


GET_PAUSED_QUEUE = f"SELECT queue_name, paused_at, paused_by, reason {_paused_row('%(queue)s')}"


def get_paused_queue(queue: str, *, using: str = DEFAULT_DB_ALIAS) -> QueuePause | None:
    """Return ``queue``'s pause, read with DEQUEUE's own predicate (invariant 28); None if running."""
    with execute(using, GET_PAUSED_QUEUE, {"queue": queue}) as cursor:
        row = cursor.fetchone()
    return None if row is None else _paused(row)


LIST_PAUSED_QUEUES = (
    f"SELECT queue_name, paused_at, paused_by, reason FROM {PAUSED_QUEUE_TABLE} ORDER BY queue_name"
)


def list_paused_queues(*, using: str = DEFAULT_DB_ALIAS) -> list[QueuePause]:
    """Return every paused queue, by name."""
    with execute(using, LIST_PAUSED_QUEUES, {}) as cursor:
        return [_paused(row) for row in cursor.fetchall()]


def _paused(row: Sequence[Any], *, newly_paused: bool = False) -> QueuePause:
    queue, paused_at, paused_by, reason = row
    return QueuePause(
        queue=queue,
        paused_at=paused_at,
        paused_by=paused_by,
        reason=reason,
        newly_paused=newly_paused,
    )


# ---------------------------------------------------------------------------------------
# Periodic jobs (durable_jobs.schedules, invariant 24). The schedule row says which tick
# fires next; firing it is a compare-and-set on that value, committed in one transaction
# with the tick's job, whose idempotency key is derived from the schedule and the tick.
# Two leaders (a stalled one waking beside its successor, one killed mid-tick and the
# next) race on the row: the first to advance it wins, the other's CAS finds zero rows
# and its transaction, job included, rolls back; and should two CASes ever both pass,
# the idempotency index still answers the second start with the first's job. Every
# instant in a predicate is the database's; tick instants come from its clock too.
# ---------------------------------------------------------------------------------------

SCHEDULE_COLUMNS = ", ".join(str(f.column) for f in Schedule._meta.concrete_fields)
_SCHEDULE_FIELD_NAMES = tuple(f.attname for f in Schedule._meta.concrete_fields)
_SCHEDULE_JSON = frozenset(
    i for i, f in enumerate(Schedule._meta.concrete_fields) if f.get_internal_type() == "JSONField"
)
#: A schedule that fires: neither paused by an operator nor removed from code.
SCHEDULE_ACTIVE = "paused_at IS NULL AND removed_at IS NULL"
#: The NOTIFY payload that says "the schedules changed": never a queue name (no "!"
#: there), so a worker's listener tells it apart and wakes its scheduler, not a slot.
SCHEDULES_CHANGED = "!schedules"


def _schedules(using: str, sql: str, params: dict[str, Any]) -> list[Schedule]:
    with execute(using, sql, params) as cursor:
        rows = cursor.fetchall()
    return [
        Schedule.from_db(
            using,
            _SCHEDULE_FIELD_NAMES,
            [
                json.loads(v) if i in _SCHEDULE_JSON and isinstance(v, str) else v
                for i, v in enumerate(row)
            ],
        )
        for row in rows
    ]


# Upsert what code declares, and mark removed what it no longer declares, in one
# statement (both parts see one snapshot; they touch disjoint rows). A schedule whose
# expression or zone changed, or that comes back after a removal, starts from the next
# tick the caller computed from the database's clock; an unchanged one keeps its own
# next tick, so a worker restarting mid-minute neither skips nor repeats a tick. The
# operator's pause survives a deploy. Ordered by name, so two workers syncing at once
# lock rows in one order.
SYNC_SCHEDULES = f"""
WITH declared AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(
        name text, kind text, expression text, zone text, input jsonb, queue text,
        priority int, catch_up text, next_tick_at timestamptz)
), upserted AS (
    INSERT INTO {SCHEDULE_TABLE} AS s (
        name, kind, expression, zone, input, queue_name, priority, catch_up, next_tick_at,
        missed_ticks, seen_at, created_at, updated_at)
    SELECT name, kind, expression, zone, NULLIF(input, 'null'::jsonb), queue, priority,
           catch_up, next_tick_at, 0, now(), now(), now()
      FROM declared ORDER BY name
    ON CONFLICT (name) DO UPDATE
       SET next_tick_at = CASE
               WHEN s.removed_at IS NOT NULL OR s.expression <> excluded.expression
                 OR s.zone <> excluded.zone THEN excluded.next_tick_at
               ELSE s.next_tick_at END,
           kind = excluded.kind, expression = excluded.expression, zone = excluded.zone,
           input = excluded.input, queue_name = excluded.queue_name,
           priority = excluded.priority, catch_up = excluded.catch_up,
           removed_at = NULL, seen_at = now(), updated_at = now()
    RETURNING name
), removed AS (
    UPDATE {SCHEDULE_TABLE} SET removed_at = now(), updated_at = now()
     WHERE removed_at IS NULL AND name NOT IN (SELECT name FROM declared)
    RETURNING name
)
SELECT (SELECT count(*) FROM upserted), (SELECT count(*) FROM removed)
"""


def sync_schedules(
    rows: Sequence[dict[str, Any]], *, notify_channel: str | None, using: str = DEFAULT_DB_ALIAS
) -> tuple[int, int]:
    """Write the declared schedules (``rows``: name, kind, expression, zone, input as JSON
    text, queue, priority, catch_up, next_tick_at) and mark the others removed; return
    ``(written, removed)``, and wake the schedulers at commit.

    A removed schedule keeps its row and its jobs; it never fires (``SCHEDULE_ACTIVE``).
    """
    declared = [
        {
            **row,
            "input": None if row["input"] is None else json.loads(row["input"]),
            "next_tick_at": row["next_tick_at"].isoformat(),
        }
        for row in sorted(rows, key=lambda row: row["name"])
    ]
    with transaction.atomic(using=using):
        with execute(using, SYNC_SCHEDULES, {"rows": json.dumps(declared)}) as cursor:
            written, removed = cursor.fetchone()
        notify_schedules(notify_channel, using=using)
    return written, removed


# The leader's one statement between ticks, read through the partial index
# durable_jobs_schedule_due: seconds until the earliest active tick (negative: overdue),
# NULL when no schedule is active.
# Both statements see only the kinds the leader can start (as a worker claims only kinds
# it can run, invariant 14b): a leader from an older deploy leaves a newer kind's ticks
# due, instead of failing them, or waking for them, over and over.
NEXT_SCHEDULE_TICK = f"""
SELECT extract(epoch FROM next_tick_at - clock_timestamp())::float8
  FROM {SCHEDULE_TABLE} WHERE {SCHEDULE_ACTIVE} AND kind = ANY(%(kinds)s)
 ORDER BY next_tick_at LIMIT 1
"""


def next_schedule_tick(*, kinds: Sequence[str], using: str = DEFAULT_DB_ALIAS) -> float | None:
    """Seconds (database clock) until the earliest active tick of ``kinds``; None when there is none."""
    return fetch_value(using, NEXT_SCHEDULE_TICK, {"kinds": list(kinds)})


# Candidates only: no lock is taken here, the CAS below decides.
SELECT_DUE_SCHEDULES = f"""
SELECT {SCHEDULE_COLUMNS} FROM {SCHEDULE_TABLE}
 WHERE {SCHEDULE_ACTIVE} AND next_tick_at <= clock_timestamp() AND kind = ANY(%(kinds)s)
 ORDER BY next_tick_at LIMIT %(limit)s
"""


def select_due_schedules(
    *, kinds: Sequence[str], limit: int, using: str = DEFAULT_DB_ALIAS
) -> list[Schedule]:
    """Active schedules of ``kinds`` whose next tick has come (database clock), earliest first."""
    return _schedules(using, SELECT_DUE_SCHEDULES, {"kinds": list(kinds), "limit": limit})


# Invariant 24: the compare-and-set on the tick. Only the transaction that moves
# next_tick_at off the value it planned from may start that tick's job; a second leader
# blocks on the row lock, then finds the value moved and updates nothing. The tick must
# be due by the database's clock, whatever the leader's clock says.
ADVANCE_SCHEDULE = f"""
UPDATE {SCHEDULE_TABLE}
   SET next_tick_at = %(following)s, last_tick_at = coalesce(%(last_tick)s, last_tick_at),
       missed_ticks = missed_ticks + %(missed)s, updated_at = now()
 WHERE name = %(name)s AND next_tick_at = %(due)s AND {SCHEDULE_ACTIVE}
   AND next_tick_at <= clock_timestamp()
RETURNING name
"""


def advance_schedule(
    name: str,
    *,
    due: datetime.datetime,
    following: datetime.datetime,
    last_tick: datetime.datetime | None,
    missed: int,
    using: str = DEFAULT_DB_ALIAS,
) -> bool:
    """Move schedule ``name`` from tick ``due`` to ``following``; False when another got there first.

    Call it inside the transaction that starts the tick's jobs (invariant 24).
    """
    params = {
        "name": name,
        "due": due,
        "following": following,
        "last_tick": last_tick,
        "missed": missed,
    }
    return fetch_value(using, ADVANCE_SCHEDULE, params) is not None


RECORD_SCHEDULE_JOB = f"""
UPDATE {SCHEDULE_TABLE} SET last_job_id = %(job_id)s, updated_at = now()
 WHERE name = %(name)s
RETURNING name
"""


def record_schedule_job(name: str, job_id: uuid.UUID, *, using: str = DEFAULT_DB_ALIAS) -> bool:
    """Remember the job a schedule started last (in the transaction that started it)."""
    return fetch_value(using, RECORD_SCHEDULE_JOB, {"name": name, "job_id": job_id}) is not None


PAUSE_SCHEDULE = f"""
UPDATE {SCHEDULE_TABLE} SET paused_at = now(), updated_at = now()
 WHERE name = %(name)s AND {SCHEDULE_ACTIVE}
RETURNING {SCHEDULE_COLUMNS}
"""


def pause_schedule(name: str, *, using: str = DEFAULT_DB_ALIAS) -> Schedule | None:
    """Stop schedule ``name`` from firing; None when it is not active (paused, removed, unknown)."""
    rows = _schedules(using, PAUSE_SCHEDULE, {"name": name})
    return rows[0] if rows else None


# Ticks that fell while paused are not missed ticks: the operator did not want them. The
# schedule resumes from the first tick after now, which the caller computed from the
# database's clock. The NOTIFY (delivered at commit) wakes the leader, whose sleep may
# be longer than the time to this tick.
RESUME_SCHEDULE = f"""
UPDATE {SCHEDULE_TABLE} SET paused_at = NULL, next_tick_at = %(following)s, updated_at = now()
 WHERE name = %(name)s AND paused_at IS NOT NULL AND removed_at IS NULL
RETURNING {SCHEDULE_COLUMNS}
"""


def resume_schedule(
    name: str,
    *,
    following: datetime.datetime,
    notify_channel: str | None,
    using: str = DEFAULT_DB_ALIAS,
) -> Schedule | None:
    """Let paused schedule ``name`` fire again from tick ``following``; None when it is not paused."""
    with transaction.atomic(using=using):
        rows = _schedules(using, RESUME_SCHEDULE, {"name": name, "following": following})
        if rows:
            notify_schedules(notify_channel, using=using)
    return rows[0] if rows else None


def notify_schedules(channel: str | None, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Wake the schedulers at commit (``SCHEDULES_CHANGED``); nothing without a channel."""
    if channel:
        with execute(using, NOTIFY, {"channel": channel, "queue": SCHEDULES_CHANGED}):
            pass


# 7b. Flow keys: an operator's runtime limits, and the reads explain and the console make
# ---------------------------------------------------------------------------------------

# An operator's limits for one key, effective from the next claim statement on (every
# claim reads the key row under its lock: nothing to restart, no cache). A field left
# None keeps its value unless `clear` names it; the permits and the window are the
# claim's and are never touched here.
SET_FLOW_LIMIT = f"""
INSERT INTO {FLOW_KEY_TABLE} AS s (key, concurrency, rate, rate_window_ms, weight, holders, starts,
                                   fair_pass, changed_at, changed_by)
VALUES (%(key)s, %(concurrency)s, %(rate)s, %(rate_window_ms)s, %(weight)s, '[]'::jsonb, '[]'::jsonb,
        coalesce((SELECT min(fair_pass) FROM {FLOW_KEY_TABLE}), 0), now(), %(changed_by)s)
ON CONFLICT (key) DO UPDATE
   SET concurrency = CASE WHEN 'concurrency' = ANY(%(clear)s::text[]) THEN NULL
                          ELSE coalesce(EXCLUDED.concurrency, s.concurrency) END,
       rate = CASE WHEN 'rate' = ANY(%(clear)s::text[]) THEN NULL ELSE coalesce(EXCLUDED.rate, s.rate) END,
       rate_window_ms = CASE WHEN 'rate' = ANY(%(clear)s::text[]) THEN NULL
                             ELSE coalesce(EXCLUDED.rate_window_ms, s.rate_window_ms) END,
       weight = CASE WHEN 'weight' = ANY(%(clear)s::text[]) THEN NULL ELSE coalesce(EXCLUDED.weight, s.weight) END,
       changed_at = now(), changed_by = EXCLUDED.changed_by
RETURNING key
"""


def set_flow_limit(
    key: str,
    *,
    concurrency: int | None = None,
    rate: int | None = None,
    rate_window_ms: int | None = None,
    weight: float | None = None,
    clear: Sequence[str] = (),
    changed_by: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Set (or ``clear``) an operator's limits on ``key``; the next claim applies them."""
    params = {
        "key": key,
        "concurrency": concurrency,
        "rate": rate,
        "rate_window_ms": rate_window_ms,
        "weight": weight,
        "clear": list(clear),
        "changed_by": changed_by,
    }
    fetch_value(using, SET_FLOW_LIMIT, params)


# Whether any job with a flow key waits in these queues: a worker none of whose kinds has
# a flow policy asks this now and then, to know whether it must claim through DEQUEUE
# (keys) or may use DEQUEUE_OPEN. One probe of durable_jobs_flow_deliverable per queue.
# A paused queue's keyed jobs wait for the resume (invariant 27): they must not move every
# worker serving the queue onto the keyed claim meanwhile.
HAS_KEYED_WORK = f"""
SELECT EXISTS (SELECT 1 FROM unnest(%(queues)s::text[]) AS q(name)
                WHERE NOT EXISTS (SELECT 1 {_paused_row("q.name")})
                  AND EXISTS (SELECT 1 FROM {TABLE}
                               WHERE queue_name = q.name AND {_flow_deliverable()}))
"""


def has_keyed_work(queues: Sequence[str], *, using: str = DEFAULT_DB_ALIAS) -> bool:
    """True when a job with a flow key waits to be claimed in one of ``queues``."""
    return bool(fetch_value(using, HAS_KEYED_WORK, {"queues": list(queues)}))


# Why a job is not claimed, read with the claim's own fragments (invariant 28): the same
# due and cancel test (_claimable), the same paused-queue row (_paused_row), the same
# limits (_flow_head_kind, _flow_settings, _flow_in_force), the same usage (_flow_usage:
# the permits still held, by _permit_held, and the starts inside the window) and the same
# room (_flow_room) as DEQUEUE; then who holds the key and when the window frees a start.
# `kinds` is NULL: explain asks about the job, not about a worker's kinds (those are the
# live workers' answer, read beside it).
_J_SCOPE = SCOPE.replace("tenant_id", "j.tenant_id").replace("organization_id", "j.organization_id")
EXPLAIN_JOB = f"""
SELECT clock_timestamp(),
       ({_claimable("j")}) AS claimable,
       coalesce({_due("j")}, false) AS due,
       EXISTS (SELECT 1 {_paused_row("j.queue_name")}) AS paused,
       CASE WHEN j.flow_key IS NULL THEN NULL ELSE {_flow_room("k", "cfg", "used")} END AS room,
       {_flow_in_force("k", "cfg", "concurrency")} AS concurrency,
       {_flow_in_force("k", "cfg", "rate")} AS rate,
       coalesce({_flow_in_force("k", "cfg", "rate_window_ms")}, 1000) / 1000.0 AS window_s,
       (SELECT coalesce(array_agg((permit ->> 'id')::uuid), '{{}}')
          FROM jsonb_array_elements(used.holders) AS permit) AS holders,
       (SELECT to_timestamp(min(started::float8)
                            + coalesce({_flow_in_force("k", "cfg", "rate_window_ms")}, 1000) / 1000.0)
          FROM jsonb_array_elements(used.starts) AS started) AS rate_frees_at,
       k.fair_pass - (SELECT min(fair_pass) FROM {FLOW_KEY_TABLE}) AS behind,
       (SELECT other.id FROM {TABLE} AS other
         WHERE j.lock_key IS NOT NULL AND other.id <> j.id AND other.lock_key = j.lock_key
           AND other.tenant_id = j.tenant_id
           AND other.organization_id IS NOT DISTINCT FROM j.organization_id
           AND other.status IN {LIVE} LIMIT 1) AS lock_holder
  FROM {TABLE} AS j
  LEFT JOIN LATERAL (
      SELECT concurrency, rate, rate_window_ms, weight, holders, starts, fair_pass
        FROM {FLOW_KEY_TABLE} WHERE key = j.flow_key
       UNION ALL
      SELECT NULL::int, NULL::int, NULL::bigint, NULL::float8, '[]'::jsonb, '[]'::jsonb, NULL::float8
       WHERE NOT EXISTS (SELECT 1 FROM {FLOW_KEY_TABLE} WHERE key = j.flow_key)
  ) AS k ON true
  LEFT JOIN LATERAL ({_flow_head_kind("j.queue_name", "j.flow_key")}) AS head ON true
 CROSS JOIN LATERAL ({_flow_settings("j.flow_key", "coalesce(head.kind, j.kind)")}) AS cfg
 CROSS JOIN LATERAL ({_flow_usage("k", "cfg")}) AS used
 WHERE j.id = %(id)s AND {_J_SCOPE}
"""


def explain_job(
    job_id: object, scope: Scope, *, flow: str | None = None, using: str = DEFAULT_DB_ALIAS
) -> dict[str, Any] | None:
    """Return the claim's verdicts on one job (invariant 28), or None if it is not in scope."""
    params = {"id": job_id, **scope_params(scope), "kinds": None, "flow": flow or "{}"}
    with execute(using, EXPLAIN_JOB, params) as cursor:
        row = cursor.fetchone()
        if row is None:
            return None
        names = [column.name for column in cursor.description]
    return dict(zip(["now", *names[1:]], row, strict=True))


# The console's and the metrics' view of the keys: each key's limits (the operator's,
# else the settings' and then the kind's of its latest job), the permits held and the
# starts inside its window. One row per key row; keys never claimed have none.
LIST_FLOW_KEYS = f"""
SELECT k.key, k.concurrency, k.rate, k.rate_window_ms, k.weight,
       {_flow_in_force("k", "cfg", "concurrency")}, {_flow_in_force("k", "cfg", "rate")},
       used.held, used.recent,
       (SELECT count(*) FROM {TABLE} AS w WHERE w.flow_key = k.key AND w.status IN {LIVE}
           AND w.lease_owner IS NULL AND w.next_run_at IS NOT NULL),
       k.changed_at, k.changed_by
  FROM {FLOW_KEY_TABLE} AS k
  LEFT JOIN LATERAL (SELECT kind FROM {TABLE} WHERE flow_key = k.key AND status IN {LIVE} LIMIT 1) AS kind ON true
 CROSS JOIN LATERAL ({_flow_settings("k.key", "kind.kind")}) AS cfg
 CROSS JOIN LATERAL ({_flow_usage("k", "cfg")}) AS used
 ORDER BY k.key
"""


def list_flow_keys(*, flow: str | None = None, using: str = DEFAULT_DB_ALIAS) -> list[FlowKeyState]:
    """Every flow key the claim has met or an operator has set, with its occupancy."""
    with execute(using, LIST_FLOW_KEYS, {"flow": flow or "{}"}) as cursor:
        return [
            FlowKeyState(
                key=row[0],
                operator_concurrency=row[1],
                operator_rate=row[2],
                operator_rate_window_ms=row[3],
                operator_weight=row[4],
                concurrency=row[5],
                rate=row[6],
                running=int(row[7]),
                recent_starts=int(row[8]),
                waiting=int(row[9]),
                changed_at=row[10],
                changed_by=row[11],
            )
            for row in cursor.fetchall()
        ]


# ---------------------------------------------------------------------------------------
# 8. For the testing helpers only (durable_jobs.testing)
# ---------------------------------------------------------------------------------------

MAKE_DUE = f"""
UPDATE {TABLE} SET next_run_at = clock_timestamp(), updated_at = now()
 WHERE id = %(id)s AND status IN {LIVE} AND lease_owner IS NULL
   AND next_run_at > clock_timestamp()
RETURNING {COLUMNS}
"""


def make_due(job_id: object, *, using: str = DEFAULT_DB_ALIAS) -> Job | None:
    """Bring a scheduled job's run time to now (the testing helpers' fast-forward)."""
    return fetch_job(using, MAKE_DUE, {"id": job_id})


# Brings a schedule's next tick to the database's now, so a test sees a tick fire without
# waiting for the minute: the tick instant is this statement's clock, a real instant the
# tick's key is derived from like any other.
FAST_FORWARD_SCHEDULE = f"""
UPDATE {SCHEDULE_TABLE} SET next_tick_at = clock_timestamp(), updated_at = now()
 WHERE name = %(name)s AND {SCHEDULE_ACTIVE} AND next_tick_at > clock_timestamp()
RETURNING next_tick_at
"""


def fast_forward_schedule(
    name: str, *, notify_channel: str | None, using: str = DEFAULT_DB_ALIAS
) -> datetime.datetime | None:
    """Make schedule ``name``'s next tick due now; the tick's instant, or None if it is not active or already due."""
    with transaction.atomic(using=using):
        tick = fetch_value(using, FAST_FORWARD_SCHEDULE, {"name": name})
        if tick is not None:
            notify_schedules(notify_channel, using=using)
    return tick


# ---------------------------------------------------------------------------------------
# 9. Workflows (durable_jobs.workflows): children, fan-in, events, durable sleep
#
# Invariant 29, a child is born once: a child is inserted by its parent's lease holder,
# fenced by the parent's lease in the same statement (and, inside ``fenced()``, under the
# row lock that transaction already holds), with an id derived from the parent and the
# spawn key; a re-run slice's insert finds the child and adds nothing.
#
# Invariant 30, waiting holds no lease: a wait is a yield (continuation_seq + 1, lease
# released) whose next_run_at is NULL until something wakes it, or the instant a sleep or
# an event's timeout ends. The deliverable predicate needs next_run_at, so a held job is
# simply not claimed. Who wakes it decides under the job's row lock, never from a read:
# a child's terminal statement moves its parent's counters (children_ended,
# children_failed) and wakes it in the same UPDATE when what it waits for has happened;
# that UPDATE matches the parent row unconditionally and puts its condition in the SET,
# so two children ending at once are serialised on the parent row and the second one
# re-evaluates against the first one's committed counters (never zero wakes, never two).
# ---------------------------------------------------------------------------------------

_ENDED = "('completed', 'failed', 'cancelled')"


def _children_ready(ended: str, failed: str, total: str, wait: str) -> str:
    """SQL: has what ``wait`` (a flow_wait jsonb) waits for happened, given the counters?

    ``at_least`` (None: all children) is capped at the children spawned; policy ``wait``
    counts only completed children, ``continue`` every ended one, and ``fail``/``cancel``
    wake at the first failed or cancelled child too (see durable_jobs.workflows.policy).
    """
    want = f"least(coalesce(({wait}->>'at_least')::int, {total}), {total})"
    return f"""(CASE coalesce({wait}->>'policy', 'fail')
            WHEN 'wait' THEN ({ended}) - ({failed}) >= {want}
            WHEN 'continue' THEN ({ended}) >= {want}
            ELSE ({failed}) > 0 OR ({ended}) >= {want} END)"""


def _dependencies_ready(ended: str, failed: str, total: str, wait: str) -> str:
    """SQL: may a job started ``after=[...]`` run (policy ``fail``: or end failed) now?"""
    return f"""(({ended}) >= ({total})
            OR (coalesce({wait}->>'policy', 'fail') = 'fail' AND ({failed}) > 0))"""


def _held_for(on: str) -> str:
    """SQL: the row ``p`` is held by a wait ``on`` children or dependencies, not yet woken."""
    return (
        "p.status = 'pending' AND p.lease_owner IS NULL AND p.next_run_at IS NULL "
        f"AND p.flow_wait->>'on' = '{on}'"
    )


#: The ends a tally counts: every ended row, and those that did not complete.
_ENDS = "count(*)::int AS ended, (count(*) FILTER (WHERE e.status <> 'completed'))::int AS failed"


def _count_ends(
    source: str, name: str, tally: str, counters: str, on: str, ready: Callable[..., str]
) -> str:
    """Three CTEs: ``tally`` (rows ``id, ended, failed``: the waiting jobs and what ended for
    them) added to their ``{counters}_ended`` / ``_failed``, each woken by the UPDATE whose
    counters first satisfy its wait ``on`` (invariant 30).

    The waiting rows are locked in id order (two batches ending rows for the same jobs
    cannot deadlock), and a row ending in this same statement is left alone. The UPDATE
    matches each row whatever its state and decides the wake in its SET: waiting for a
    concurrent ender's lock, it re-reads the row and counts on top of what that one wrote.
    """
    satisfied = ready(
        f"p.{counters}_ended + t.ended",
        f"p.{counters}_failed + t.failed",
        f"p.{counters}_total",
        "p.flow_wait",
    )
    return f"""{source}_{name} AS (
    {tally}
), {source}_{name}_locked AS MATERIALIZED (
    SELECT p.id FROM {TABLE} AS p JOIN {source}_{name} AS t ON p.id = t.id
     WHERE p.id NOT IN (SELECT id FROM {source})
     ORDER BY p.id
       FOR UPDATE OF p
), {source}_{name}_told AS (
    UPDATE {TABLE} AS p
       SET {counters}_ended = p.{counters}_ended + t.ended,
           {counters}_failed = p.{counters}_failed + t.failed,
           next_run_at = CASE WHEN {_held_for(on)} AND {satisfied}
                              THEN clock_timestamp() ELSE p.next_run_at END,
           updated_at = now()
      FROM {source}_{name} AS t, {source}_{name}_locked AS l
     WHERE p.id = t.id AND p.id = l.id
    RETURNING p.id
)"""


def _tell_parents(source: str) -> str:
    """CTEs that count the rows of ``source`` (id, parent_id, dependents, status) that
    ended on their parents and on the jobs started after them (``_count_ends``)."""
    parents = f"""SELECT e.parent_id AS id, {_ENDS} FROM {source} AS e
     WHERE e.parent_id IS NOT NULL AND e.status IN {_ENDED} GROUP BY e.parent_id"""
    dependents = f"""SELECT d.id::uuid AS id, {_ENDS}
      FROM {source} AS e
     CROSS JOIN LATERAL jsonb_array_elements_text(coalesce(e.dependents, '[]'::jsonb)) AS d(id)
     WHERE e.status IN {_ENDED} GROUP BY d.id"""
    return (
        _count_ends(source, "parents", parents, "children", "children", _children_ready)
        + ", "
        + _count_ends(source, "dependents", dependents, "deps", "after", _dependencies_ready)
    )


def _telling_parents(statement: str) -> str:
    """``statement`` (a terminal UPDATE) with its parent's counters moved in the same statement.

    Works on the two shapes the terminal statements have: ``UPDATE … RETURNING {COLUMNS}``
    and ``WITH x AS (UPDATE …), … SELECT {COLUMNS} FROM x``.
    """
    body = statement.strip()
    tail = f"RETURNING {COLUMNS}"
    if body.startswith("UPDATE") and body.endswith(tail):
        return (
            f"WITH ended AS (\n{body}\n), {_tell_parents('ended')}\nSELECT {COLUMNS} FROM ended\n"
        )
    head, _, source = body.rpartition(f"\nSELECT {COLUMNS} FROM ")
    assert head.startswith("WITH") and source.isidentifier(), "a terminal statement's shape"
    return f"{head},\n{_tell_parents(source)}\nSELECT {COLUMNS} FROM {source}\n"


# The hot terminal statements in a leaf form too, for a row no job waits on (no parent, no
# dependents): every job outside a workflow. Its WHERE is re-checked on the row version
# the UPDATE locks, so it never ends a row a dependent was linked to meanwhile.
_NOBODY_WAITS = "parent_id IS NULL AND dependents IS NULL"
COMPLETE_LEAF = COMPLETE.replace(_TERMINAL_FENCE, f"{_TERMINAL_FENCE} AND {_NOBODY_WAITS}")
FAIL_TERMINAL_LEAF = FAIL_TERMINAL.replace(
    _TERMINAL_FENCE, f"{_TERMINAL_FENCE} AND {_NOBODY_WAITS}"
)
COMPLETE_MANY_LEAF = COMPLETE_MANY.replace(
    "j.lease_epoch = d.epoch",
    "j.lease_epoch = d.epoch AND j.parent_id IS NULL AND j.dependents IS NULL",
)
assert _NOBODY_WAITS in COMPLETE_LEAF and _NOBODY_WAITS in FAIL_TERMINAL_LEAF
assert "j.dependents IS NULL" in COMPLETE_MANY_LEAF

# Every statement that ends a job tells its parent, in the same statement (invariant 30):
# the terminal CAS, the batched completion, a pending job's cancellation, and every park.
COMPLETE = _telling_parents(COMPLETE)
FAIL_TERMINAL = _telling_parents(FAIL_TERMINAL)
FINISH_CANCELLED = _telling_parents(FINISH_CANCELLED)
CANCEL_PENDING = _telling_parents(CANCEL_PENDING)
PARK = _telling_parents(PARK)
BUMP_MIRROR_ATTEMPTS = _telling_parents(BUMP_MIRROR_ATTEMPTS)
BUMP_PENDING_MIRROR_ATTEMPTS = _telling_parents(BUMP_PENDING_MIRROR_ATTEMPTS)
TAKE_ORPHAN = _telling_parents(TAKE_ORPHAN)
CHARGE_INTERRUPTION = _telling_parents(CHARGE_INTERRUPTION)
COMPLETE_MANY = (
    "WITH ended AS (\n"
    + COMPLETE_MANY.strip().removesuffix("RETURNING j.id")
    + "RETURNING j.id, j.parent_id, j.status, j.dependents\n), "
    + f"{_tell_parents('ended')}\nSELECT id FROM ended\n"
)

# The statements a slot runs for every claim and every completion, without their
# comments and runs of blanks (db.compact_sql: psycopg splits a statement longer than
# 4,096 characters again on every execution). Compacted last: the statements above are
# derived from one another by replacing fragments of their text.
DEQUEUE_OPEN, DEQUEUE, COMPLETE, COMPLETE_LEAF, COMPLETE_MANY, COMPLETE_MANY_LEAF = map(
    compact_sql,
    (DEQUEUE_OPEN, DEQUEUE, COMPLETE, COMPLETE_LEAF, COMPLETE_MANY, COMPLETE_MANY_LEAF),
)

# The child's row: the parent's scope and queue settings, a creator naming the parent.
# ON CONFLICT DO NOTHING: the child this parent already spawned under this key (the same
# id, the same (parent, key)) is the answer, and the insert adds nothing (invariant 29).
# A parent asked to cancel may still spawn until its slice sees the request: its children
# are born with the same request, so none escapes a cancel that reached the parent first.
SPAWN_CHILDREN = f"""
WITH parent AS (
    SELECT id, tenant_id, organization_id, priority, cancel_requested_at, cancelled_by
      FROM {TABLE}
     WHERE id = %(id)s AND {LEASE_HELD}
       FOR UPDATE
), born AS (
    INSERT INTO {TABLE} (
        id, tenant_id, organization_id, kind, status, created_by, created_at, updated_at,
        input, parent_id, spawn_key, queue_name, priority, next_run_at, pending_since, flow_key,
        cancel_requested_at, cancelled_by
    )
    SELECT r.id, p.tenant_id, p.organization_id, r.kind, 'pending', 'job:' || p.id::text,
           now(), now(), r.input, p.id, r.spawn_key, r.queue, coalesce(r.priority, p.priority),
           clock_timestamp(), now(), r.flow_key, p.cancel_requested_at, p.cancelled_by
      FROM parent AS p,
           jsonb_to_recordset(%(rows)s::jsonb)
           AS r(id uuid, kind text, spawn_key text, input jsonb, queue text, priority smallint,
                flow_key text)
    ON CONFLICT DO NOTHING
    RETURNING id, queue_name
), counted AS (
    UPDATE {TABLE} AS j
       SET children_total = j.children_total + (SELECT count(*) FROM born), updated_at = now()
      FROM parent AS p
     WHERE j.id = p.id
    RETURNING j.id
)
SELECT (SELECT count(*) FROM parent), (SELECT count(*) FROM born),
       (SELECT count(pg_notify(%(channel)s, q.queue_name))
          FROM (SELECT DISTINCT queue_name FROM born) AS q
         WHERE %(channel)s::text IS NOT NULL)
"""


def spawn_children(
    lease: Lease,
    rows: Sequence[dict[str, Any]],
    *,
    notify_channel: str | None,
    using: str = DEFAULT_DB_ALIAS,
) -> int | None:
    """Insert the parent's children (fenced by its lease); how many were new, None: lease gone.

    ``rows`` carry ``id`` (``workflows.child_id``), ``kind``, ``spawn_key``, ``input``,
    ``queue``, ``priority`` and ``flow_key`` (its kind's flow key, invariant 26; absent:
    none). A child already spawned under its key is left as it is.
    The wake-up NOTIFY is delivered at the caller's commit (or dropped with its rollback).
    """
    params = {**_lease(lease), "rows": json.dumps(list(rows)), "channel": notify_channel}
    with execute(using, SPAWN_CHILDREN, params) as cursor:
        found, born, _ = cursor.fetchone()
    return None if not found else int(born)


# The wait: a yield that holds. Run by the worker after assert_lease has locked the row in
# the same transaction, so the EXISTS below (its own statement, a fresh snapshot) sees
# every event whose sender committed before the lock was granted; a sender after it waits
# for this row and then wakes the job itself (SEND_EVENT).
HOLD_FOR_WAIT = f"""
UPDATE {TABLE}
   SET status = 'pending',
       continuation_seq = continuation_seq + 1,
       lease_owner = NULL,
       lease_expires_at = clock_timestamp(),
       pending_since = now(),
       -- The continuation this wait hands over to: the wait's policy (and an event's wake)
       -- applies to that slice alone, never to a later one after an ordinary yield.
       flow_wait = %(wait)s::jsonb || jsonb_build_object('seq', continuation_seq + 1),
       next_run_at = CASE %(on)s
           WHEN 'sleep' THEN clock_timestamp() + {_ms("delay_ms")}
           WHEN 'children' THEN CASE
               WHEN {_children_ready("children_ended", "children_failed", "children_total", "%(wait)s::jsonb")}
               THEN clock_timestamp() END
           ELSE CASE
               WHEN EXISTS (SELECT 1 FROM {EVENT_TABLE} AS e
                             WHERE e.job_id = %(id)s AND e.name = %(event)s AND e.consumed_at IS NULL)
               THEN clock_timestamp()
               ELSE clock_timestamp() + {_ms("delay_ms")} END
           END,
       updated_at = now()
 WHERE id = %(id)s AND {LEASE_HELD}
RETURNING next_run_at IS NULL OR next_run_at > clock_timestamp(), next_run_at
"""


def hold_for_wait(
    lease: Lease, wait: dict[str, Any], *, using: str = DEFAULT_DB_ALIAS
) -> tuple[bool, Any] | None:
    """Hold the job for ``wait`` (``Wait.as_json()``); ``(held, next_run_at)``, None: lease gone.

    Run inside a transaction that has just re-asserted the lease (``assert_lease``).
    ``held`` is False when what it waits for has already happened (the job is due now).
    """
    params = {
        **_lease(lease),
        "wait": dump_json(wait),
        "on": wait["on"],
        "event": wait.get("event"),
        "delay_ms": wait.get("delay_ms"),
    }
    with execute(using, HOLD_FOR_WAIT, params) as cursor:
        row = cursor.fetchone()
    return None if row is None else (bool(row[0]), row[1])


# Sent in the caller's transaction: a rollback sends nothing. The UPDATE matches the job's
# row whatever its state and decides the wake in its SET, so it always takes the row lock:
# a wait committing meanwhile makes it re-read the row and wake it (invariant 30); a wait
# starting after it blocks on the lock and then finds the event in its own EXISTS.
SEND_EVENT = f"""
WITH target AS (
    SELECT id FROM {TABLE} WHERE id = %(id)s AND {SCOPE} AND status IN {LIVE}
), sent AS (
    INSERT INTO {EVENT_TABLE} (job_id, name, payload, sent_at)
    SELECT id, %(name)s, %(payload)s::jsonb, now() FROM target
    RETURNING id
), woken AS (
    UPDATE {TABLE} AS j
       SET next_run_at = CASE
               WHEN j.status = 'pending' AND j.lease_owner IS NULL
                AND j.flow_wait->>'on' = 'event' AND j.flow_wait->>'event' = %(name)s
                AND (j.flow_wait->>'seq')::bigint = j.continuation_seq
                AND (j.next_run_at IS NULL OR j.next_run_at > clock_timestamp())
               THEN clock_timestamp() ELSE j.next_run_at END,
           updated_at = now()
      FROM target AS t
     WHERE j.id = t.id
    RETURNING j.id
)
SELECT (SELECT id FROM sent)
"""


def send_event(
    job_id: object,
    scope: Scope,
    name: str,
    payload_json: str | None,
    *,
    using: str = DEFAULT_DB_ALIAS,
) -> int | None:
    """Keep an event for a live job (and wake it if it waits for that name); its id, None: no live job."""
    params = {"id": job_id, **scope_params(scope), "name": name, "payload": payload_json}
    return fetch_value(using, SEND_EVENT, params)


# Consumed by the lease holder only, oldest first: a crashed slice's consumption rolls back
# with its fenced transaction, and a committed one is never delivered again.
RECEIVE_EVENT = f"""
UPDATE {EVENT_TABLE} SET consumed_at = now()
 WHERE id = (SELECT e.id FROM {EVENT_TABLE} AS e
              WHERE e.job_id = %(id)s AND e.name = %(name)s AND e.consumed_at IS NULL
              ORDER BY e.id LIMIT 1 FOR UPDATE)
   AND EXISTS (SELECT 1 FROM {TABLE} WHERE id = %(id)s AND {LEASE_HELD})
RETURNING id, payload
"""


def receive_event(
    lease: Lease, name: str, *, using: str = DEFAULT_DB_ALIAS
) -> tuple[int, Any] | None:
    """Consume the oldest unread event ``name`` of the leased job; ``(id, payload)`` or None."""
    with execute(using, RECEIVE_EVENT, {**_lease(lease), "name": name}) as cursor:
        row = cursor.fetchone()
    if row is None:
        return None
    payload = row[1]
    return row[0], json.loads(payload) if isinstance(payload, str) else payload


# A failed or cancelled child re-driven by an operator is live again: its parent counts it
# as not ended (a parent waiting with policy 'wait' resumes when it completes). Run in the
# redrive's transaction, after the child's row was locked and its old status read.
UNCOUNT_CHILD = f"""
UPDATE {TABLE}
   SET children_ended = greatest(children_ended - 1, 0),
       children_failed = greatest(children_failed - 1, 0),
       updated_at = now()
 WHERE id = %(parent)s
RETURNING 1
"""

LOCK_CHILD = f"SELECT status, parent_id FROM {TABLE} WHERE id = %(id)s AND {SCOPE} FOR UPDATE"


def lock_child(
    job_id: object, scope: Scope, *, using: str = DEFAULT_DB_ALIAS
) -> tuple[str, Any] | None:
    """Lock a job's row for a redrive and return ``(status, parent_id)``; None when absent."""
    with execute(using, LOCK_CHILD, {"id": job_id, **scope_params(scope)}) as cursor:
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def uncount_child(parent_id: object, *, using: str = DEFAULT_DB_ALIAS) -> bool:
    """Count a re-driven child as live again on its parent."""
    return fetch_value(using, UNCOUNT_CHILD, {"parent": parent_id}) is not None


# Cancel across a tree, one bounded page of children per statement: the caller pages by
# id until a page comes back short, so a thousand children never make one giant
# transaction (a request, never a status write: invariant 8).
REQUEST_CANCEL_CHILDREN = f"""
WITH batch AS (
    SELECT id, children_total > 0 AS has_children, cancel_requested_at IS NULL AS unasked
      FROM {TABLE}
     WHERE parent_id = %(parent)s AND {SCOPE} AND status IN {LIVE}
       AND (%(after)s::uuid IS NULL OR id > %(after)s::uuid)
     ORDER BY id
     LIMIT %(limit)s
       FOR UPDATE
), asked AS (
    UPDATE {TABLE} AS j
       SET cancel_requested_at = now(), cancelled_by = %(by)s, updated_at = now()
      FROM batch
     WHERE j.id = batch.id AND batch.unasked AND j.status IN {LIVE}
       AND j.cancel_requested_at IS NULL
    RETURNING j.id
)
SELECT batch.id, batch.has_children, batch.id IN (SELECT id FROM asked)
  FROM batch ORDER BY batch.id
"""


def request_cancel_children(
    parent_id: object,
    scope: Scope,
    *,
    by: str | None,
    limit: int,
    after: object = None,
    lock_timeout_ms: int | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[tuple[Any, bool, bool]]:
    """Ask up to ``limit`` live children (ids past ``after``, in id order) to cancel.

    Returns ``(id, has children, asked now)`` for every live child of the page, asked
    before or now, so a walk stopped part-way (a timeout, a cut connection) and started
    again still reaches the subtrees below children it had already asked. The page's rows
    are locked in id order: two walks over one tree cannot deadlock each other. With
    ``lock_timeout_ms``, raises ``JobBusy`` (naming the parent) rather than wait longer
    behind a transaction holding a child.
    """
    params = {
        "parent": parent_id,
        **scope_params(scope),
        "by": by,
        "limit": limit,
        "after": None if after is None else str(after),
    }

    def page() -> list[tuple[Any, bool, bool]]:
        with execute(using, REQUEST_CANCEL_CHILDREN, params) as cursor:
            return [(row[0], bool(row[1]), bool(row[2])) for row in cursor.fetchall()]

    return _waiting_at_most(lock_timeout_ms, parent_id, "cancel", page, using=using)


# Dependencies: ``start(after=[...])``. In the start's transaction, right after its insert
# (the new job is invisible to workers until the caller commits): the live dependencies
# name the new job on their own rows, under their row lock, so a dependency's terminal
# statement reads its dependents from the row version it ends; the rest have already
# ended. Then the new job counts them and is held unless it may run now.
LINK_DEPENDENCIES = f"""
UPDATE {TABLE}
   SET dependents = coalesce(dependents, '[]'::jsonb) || jsonb_build_array(%(job)s::text),
       updated_at = now()
 WHERE id = ANY(%(after)s::uuid[]) AND {SCOPE} AND status IN {LIVE}
RETURNING id
"""

HOLD_DEPENDENT = f"""
WITH deps AS (
    SELECT id, status FROM {TABLE} WHERE id = ANY(%(after)s::uuid[]) AND {SCOPE}
), counted AS (
    SELECT count(*)::int AS total,
           (count(*) FILTER (WHERE status IN {_ENDED}))::int AS ended,
           (count(*) FILTER (WHERE status IN ('failed', 'cancelled')))::int AS failed
      FROM deps
)
UPDATE {TABLE} AS p
   SET flow_wait = %(wait)s::jsonb || jsonb_build_object('seq', p.continuation_seq),
       deps_total = c.total, deps_ended = c.ended,
       deps_failed = c.failed,
       next_run_at = CASE WHEN {_dependencies_ready("c.ended", "c.failed", "c.total", "%(wait)s::jsonb")}
                          THEN p.next_run_at END,
       updated_at = now()
  FROM counted AS c
 WHERE p.id = %(job)s AND p.status = 'pending' AND p.lease_owner IS NULL
RETURNING p.deps_total
"""


def link_dependencies(
    job_id: object,
    after: Sequence[Any],
    scope: Scope,
    *,
    policy: str,
    using: str = DEFAULT_DB_ALIAS,
) -> int | None:
    """Make the just-inserted ``job_id`` wait for ``after``; how many of them exist in ``scope``.

    Run in the start's transaction, after its insert. The caller compares the answer with
    the ids it named: another scope's job is simply absent (invariant 10).
    """
    params = {"job": job_id, "after": list(after), **scope_params(scope)}
    execute(using, LINK_DEPENDENCIES, params).close()
    wait = dump_json({"on": "after", "policy": policy})
    return fetch_value(using, HOLD_DEPENDENT, {**params, "wait": wait})
