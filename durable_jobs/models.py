"""The job table: schema, indexes and reads. Writes live in ``store.py`` only.

A ``Job`` instance is a read-only snapshot: ``save()``, ``delete()`` and the queryset's
bulk writers refuse (invariant 1), so the ORM can serve the admin, filters and reports
without ever becoming a second, unfenced way to change a job.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, NoReturn

from django.db import models
from django.db.models import F, Q, QuerySet, Value
from django.db.models.functions import Coalesce

from durable_jobs.fields import StatusArrayField
from durable_jobs.states import LIVE_STATUSES, ErrorClass, Status

TABLE = "durable_jobs_job"
LEADER_TABLE = "durable_jobs_leader"
LOCK_KEY_INDEX = "durable_jobs_lock_key_live"
IDEMPOTENCY_INDEX = "durable_jobs_idempotency"
WAIT_KEY_INDEX = "durable_jobs_wait_key_live"
UNIQUE_LIVE_INDEX = "durable_jobs_unique_live"
UNIQUE_WINDOW_INDEX = "durable_jobs_unique_window"
CHILD_KEY_INDEX = "durable_jobs_child_key"
EVENT_TABLE = "durable_jobs_event"
# A null organization ("tenant-wide") is folded to this value in the lock-key index, so
# tenant-wide is one value there. The service refuses it as a real organization id.
NO_ORGANIZATION = ""

_REFUSAL = (
    "job rows are written only by durable_jobs.store; use durable_jobs.start(), "
    "cancel(), redrive() or the worker instead"
)


#: The order the console and ``list_jobs`` page in (``newest_first``).
NEWEST_FIRST = ("-created_at", "-id")

#: The one definition of "held by a wait condition" (the admin, stats and explain use it).
HELD = Q(status="pending", held_since__isnull=False, wait_satisfied_at__isnull=True)


class ReadOnlyJobRow(TypeError):
    """Raised when code tries to write a job row through the ORM."""


def newest_first(queryset: QuerySet[Any], start: int = 0, stop: int | None = None) -> QuerySet[Any]:
    """Rows ``start`` to ``stop`` of ``queryset`` newest first, read so that the
    newest-first indexes serve them (``merged_in_order`` with ``NEWEST_FIRST``).

    Those indexes leave out the version of a row a claim writes (status ``running``): a
    claim then adds no entry to them, a fifth of a job's cost on the server (issue #27).
    A plain ``ORDER BY created_at DESC`` on a filter of kind, queue or tenant alone would
    imply no index's predicate and read the table. ``queryset`` may be a ``values_list``
    of fields that include ``created_at`` and ``id``; the result can be iterated and
    counted, not filtered further.
    """
    return merged_in_order(queryset, NEWEST_FIRST, start, stop)


def merged_in_order(
    queryset: QuerySet[Any], ordering: Sequence[str], start: int = 0, stop: int | None = None
) -> QuerySet[Any]:
    """Rows ``start`` to ``stop`` of ``queryset`` in ``ordering`` (field names, ``-`` for
    descending), read in two parts the server merges: the rows not running, in the order
    an index that leaves running rows out keeps them (a walk as long as ``stop``), and the
    few running ones (bounded by the fleet's slots), sorted. Each part is sorted and cut at
    ``stop`` on its own: the planner does not always merge two index walks under one
    ``LIMIT`` by itself.
    """
    unordered = queryset.order_by()
    parts = [
        unordered.exclude(status=Status.RUNNING.value).order_by(*ordering),
        unordered.filter(status=Status.RUNNING.value).order_by(*ordering),
    ]
    if stop is not None:
        parts = [part[:stop] for part in parts]
    merged = parts[0].union(parts[1], all=True).order_by(*ordering)
    return merged[start:stop]


def count_by_status_split(queryset: QuerySet[Job]) -> int:
    """``queryset.count()``, read as the two counts ``newest_first``'s walks can serve."""
    unordered = queryset.order_by().values("pk")
    not_running = unordered.exclude(status=Status.RUNNING.value)
    running = unordered.filter(status=Status.RUNNING.value)
    return not_running.union(running, all=True).count()


class JobQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def delete(self) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def bulk_create(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def bulk_update(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def create(self, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def get_or_create(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def update_or_create(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def held(self) -> JobQuerySet:
        """Jobs held by a wait condition: pending, hold started, condition not cleared.

        Their next check is ``next_run_at``; they hold no lease while they wait. Read by
        the ``durable_jobs_held`` partial index, so counting them costs what they number.
        """
        return self.filter(HELD)


# --- Operator console (admin) indexes ------------------------------------------------
# The change list orders newest first and pages 50 rows at a time; each filter has an index
# led by its column and ending in that order, so "the newest 50 matching" is a short index
# walk at any table size. Search is exact on keys: the lock key has a partial index here
# (the unique one covers live jobs only); idempotency keys and subject ids are found
# through the existing indexes led by tenant and subject type (see console.search). None
# of these covers a column the heartbeat writes (invariant 12). Migration 0005.
#
# The newest-first ones leave out running rows (migration 0017). A claim and a completion
# each change ``status``, so neither is a HOT update and each version of a row enters every
# index whose predicate it meets: without the predicate the claim's version cost five index
# entries a job, a fifth of the server's CPU per no-op job (issue #27). Readers get the
# running rows back through ``models.newest_first`` (a merge of two walks).
_NEWEST = (F("created_at").desc(), F("id").desc())
NOT_RUNNING = ~Q(status=Status.RUNNING.value)
CONSOLE_INDEXES = [
    models.Index(*_NEWEST, condition=NOT_RUNNING, name="durable_jobs_recent"),
    models.Index(F("status"), *_NEWEST, condition=NOT_RUNNING, name="durable_jobs_status_recent"),
    models.Index(F("kind"), *_NEWEST, condition=NOT_RUNNING, name="durable_jobs_kind_recent"),
    models.Index(
        F("queue_name"), *_NEWEST, condition=NOT_RUNNING, name="durable_jobs_queue_recent"
    ),
    models.Index(
        F("error_code"),
        *_NEWEST,
        condition=Q(parked_at__isnull=False),
        name="durable_jobs_parked_recent",
    ),
    # Live jobs by kind: `durable_jobs stats` and the scrape count them from this index alone
    # (an index-only scan over the live backlog, however many finished rows there are).
    models.Index(
        F("kind"), F("status"), condition=Q(status__in=LIVE_STATUSES), name="durable_jobs_live_kind"
    ),
    models.Index(
        F("lock_key"), condition=Q(lock_key__isnull=False), name="durable_jobs_lock_search"
    ),
]


#: Flow control (durable_jobs.limits, invariant 26). The default claim reads the first
#: index (deliverable rows without a key); the keyed claim walks the distinct flow keys of
#: a queue's deliverable rows on the second (a skip scan), so a key whose permits are all
#: taken costs one probe however many jobs wait on it; the third counts a key's live jobs
#: for the console and the metrics.
FLOW_INDEXES = [
    # The default claim's index: deliverable rows (pending, or running with a released
    # lease) without a flow key, by queue, priority (higher first) and run time, so the
    # unkeyed scan never steps over a full key's waiting jobs. With the next index it
    # covers every deliverable row once: migration 0015 dropped durable_jobs_deliverable,
    # which held them all a second time and cost every start an index insert.
    # Neither predicate names the status (migration 0016): every statement that ends a
    # job clears next_run_at, and a predicate the claim can prove only from a plain
    # status test would let the planner prove durable_jobs_live_kind's as well
    # (store._deliverable says why that is slow under a pinned horizon).
    models.Index(
        F("queue_name"),
        F("priority").desc(),
        F("next_run_at"),
        condition=Q(lease_owner__isnull=True, next_run_at__isnull=False, flow_key__isnull=True),
        name="durable_jobs_open_deliverable",
    ),
    models.Index(
        F("queue_name"),
        F("flow_key"),
        F("priority").desc(),
        F("next_run_at"),
        condition=Q(lease_owner__isnull=True, next_run_at__isnull=False, flow_key__isnull=False),
        name="durable_jobs_flow_deliverable",
    ),
    models.Index(
        F("flow_key"),
        condition=Q(status__in=LIVE_STATUSES, flow_key__isnull=False),
        name="durable_jobs_flow_live",
    ),
]


class Job(models.Model):
    # identity and scope
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=100)
    organization_id = models.CharField(max_length=100, null=True, blank=True)
    kind = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=[(s.value, s.value) for s in Status])
    created_by = models.CharField(max_length=200, null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    # payload
    input = models.JSONField(null=True, blank=True)
    checkpoint = models.JSONField(null=True, blank=True)
    meta = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)

    # keys
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    lock_key = models.CharField(max_length=255, null=True, blank=True)
    subject_type = models.CharField(max_length=200, null=True, blank=True)
    subject_id = models.CharField(max_length=255, null=True, blank=True)
    progress_job_id = models.UUIDField(null=True, blank=True)

    # lease
    lease_owner = models.CharField(max_length=200, null=True, blank=True)
    lease_epoch = models.BigIntegerField(db_default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    # delivery
    queue_name = models.CharField(max_length=100)
    queue_job_id = models.CharField(max_length=255, null=True, blank=True)
    priority = models.SmallIntegerField(db_default=0)
    continuation_seq = models.IntegerField(db_default=0)
    redrives = models.IntegerField(db_default=0)
    next_run_at = models.DateTimeField(null=True, blank=True)
    pending_since = models.DateTimeField(null=True, blank=True)

    # budgets
    redrives_since_commit = models.IntegerField(db_default=0)
    consecutive_failures = models.IntegerField(db_default=0)
    interruptions = models.IntegerField(db_default=0)
    mirror_attempts = models.IntegerField(db_default=0)
    last_committed_at = models.DateTimeField(null=True, blank=True)

    # outcome
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    parked_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.CharField(max_length=200, null=True, blank=True)
    error_class = models.CharField(
        max_length=16, null=True, blank=True, choices=[(c.value, c.value) for c in ErrorClass]
    )
    error_code = models.CharField(max_length=100, null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    domain_mirrored_at = models.DateTimeField(null=True, blank=True)
    #: Failed attempts to tell a parked job's subject (its mirror called with "failed"),
    #: bounded by the kind's MAX_MIRROR_ATTEMPTS; an operator redrive resets it.
    park_mirror_attempts = models.IntegerField(db_default=0)

    # progress
    processed_count = models.BigIntegerField(db_default=0)
    total_count = models.BigIntegerField(null=True, blank=True)

    # waits: a condition to clear before the first slice, and the hold's own clock
    wait_for = models.JSONField(null=True, blank=True)
    wait_key = models.CharField(max_length=255, null=True, blank=True)
    wait_label = models.CharField(max_length=200, null=True, blank=True)
    held_since = models.DateTimeField(null=True, blank=True)
    wait_checks = models.IntegerField(db_default=0)
    wait_faults = models.IntegerField(db_default=0)
    wait_satisfied_at = models.DateTimeField(null=True, blank=True)
    #: Consecutive pickups denied a check turn by WAIT_MAX_CONCURRENT_CHECKS: how an
    #: operator sees checks starving for capacity. Reset by any check that runs.
    wait_denials = models.IntegerField(db_default=0)

    # unique jobs by arguments (invariant 25): the key a unique start computed (kind and a
    # digest of scope and selected input), the window of its period (``period_ms:index``,
    # from the database clock at the start), and the statuses the key covers there.
    unique_key = models.CharField(max_length=200, null=True, blank=True)
    unique_window = models.CharField(max_length=40, null=True, blank=True)
    unique_states = StatusArrayField(null=True, blank=True)
    #: The flow-control key (durable_jobs.limits): chosen by the kind's policy at start
    #: and stored, so the claim reads one column (invariant 26). Null: no limit applies.
    flow_key = models.CharField(max_length=200, null=True, blank=True)

    # workflows (durable_jobs.workflows; invariants 29 and 30). A child names its parent and
    # the key its parent spawned it under; its id derives from both, so a re-run slice
    # finds the child it already started. The parent counts its children (spawned, ended,
    # ended without completing): each child's terminal statement moves the counters under
    # the parent's row lock, which is what decides "woken exactly once". ``flow_wait`` is
    # the parent's last wait (children, an event, a sleep); a job held by one is pending
    # with no lease, and its ``next_run_at`` is NULL until something wakes it.
    parent_id = models.UUIDField(null=True, blank=True)
    spawn_key = models.CharField(max_length=200, null=True, blank=True)
    children_total = models.IntegerField(db_default=0)
    children_ended = models.IntegerField(db_default=0)
    children_failed = models.IntegerField(db_default=0)
    flow_wait = models.JSONField(null=True, blank=True)
    # Dependencies (``start(after=[...])``): the jobs that wait for this one are named on
    # its own row, appended under its row lock by their start, so its terminal statement
    # reads them from the very row version it ends (no snapshot can miss a dependent).
    # A dependent counts its dependencies like a parent counts children.
    # (jsonb, an array of ids: an ArrayField needs django.contrib.postgres installed.)
    dependents = models.JSONField(null=True, blank=True)
    deps_total = models.IntegerField(db_default=0)
    deps_ended = models.IntegerField(db_default=0)
    deps_failed = models.IntegerField(db_default=0)

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = TABLE
        # Django's internals (related lookups, deletion) use the base manager; make it the
        # refusing one too, so no path writes a job row unfenced (invariant 1).
        base_manager_name = "objects"
        ordering = ["-created_at"]
        default_permissions = ("view",)
        permissions = [
            ("cancel_job", "Can request cancellation of a job"),
            ("redrive_job", "Can re-drive a failed job"),
            ("force_redrive_job", "Can force re-drive of an unrecoverable job"),
        ]
        constraints = [
            # Invariant: at most one live job per lock key in a scope. Partial on the live
            # statuses, so a finished job frees its key; the organization is folded so that
            # "tenant-wide" (null) is a single value rather than never equal to itself.
            models.UniqueConstraint(
                F("tenant_id"),
                Coalesce("organization_id", Value(NO_ORGANIZATION)),
                F("lock_key"),
                condition=Q(lock_key__isnull=False, status__in=LIVE_STATUSES),
                name=LOCK_KEY_INDEX,
            ),
            models.UniqueConstraint(
                fields=["tenant_id", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name=IDEMPOTENCY_INDEX,
            ),
            # Invariant 22: one hold per target. At most one live job per wait key in a
            # scope, whether it is held, being checked, or already running after its wait
            # cleared: a sibling started meanwhile coalesces onto it instead of paying for
            # a second run. A finished job frees the key (see store.find_wait_holder for
            # the short window after that).
            models.UniqueConstraint(
                F("tenant_id"),
                Coalesce("organization_id", Value(NO_ORGANIZATION)),
                F("wait_key"),
                condition=Q(wait_key__isnull=False, status__in=LIVE_STATUSES),
                name=WAIT_KEY_INDEX,
            ),
            # Invariant 25: uniqueness is an index, not a read. At most one live job per
            # unique key (the key holds kind and scope). Its twin over a period's window,
            # UNIQUE_WINDOW_INDEX, is partial on ``status = ANY(unique_states)``, which a
            # Q cannot spell: migration 0010 creates it in SQL.
            models.UniqueConstraint(
                F("unique_key"),
                condition=Q(unique_key__isnull=False, status__in=LIVE_STATUSES),
                name=UNIQUE_LIVE_INDEX,
            ),
            # Invariant 29: a child is born once. One child per (parent, spawn key); its
            # id is derived from the pair too, so the primary key agrees.
            models.UniqueConstraint(
                fields=["parent_id", "spawn_key"],
                condition=Q(parent_id__isnull=False),
                name=CHILD_KEY_INDEX,
            ),
        ]
        # Each candidate query reads an index holding only its candidates, so a table of
        # ten million finished rows dequeues like an empty one. None of these indexes
        # covers a column the heartbeat writes (lease_expires_at, heartbeat_at, progress,
        # counters), which keeps the heartbeat a HOT update (invariant 12).
        indexes = (
            [
                # Orphans: rows under a live claim. Deliberately not keyed on lease_expires_at,
                # which every heartbeat rewrites; the reconciler filters the few leased rows.
                models.Index(
                    F("lease_epoch"),
                    condition=Q(status=Status.RUNNING.value, lease_owner__isnull=False),
                    name="durable_jobs_leased",
                ),
                models.Index(
                    F("cancel_requested_at"),
                    condition=Q(cancel_requested_at__isnull=False, status__in=LIVE_STATUSES),
                    name="durable_jobs_cancelling",
                ),
                models.Index(
                    F("pending_since"),
                    condition=Q(status=Status.PENDING.value),
                    name="durable_jobs_pending",
                ),
                # Newest first like the console's (and without running rows, likewise).
                models.Index(
                    fields=["tenant_id", "-created_at", "-id"],
                    condition=NOT_RUNNING,
                    name="durable_jobs_tenant_recent",
                ),
                # Only jobs started with a subject: a start without one maintains no entry here
                # (issue #14); a lookup names a subject type, so it can use the partial index.
                models.Index(
                    fields=["subject_type", "subject_id"],
                    name="durable_jobs_subject",
                    condition=Q(subject_type__isnull=False),
                ),
                models.Index(
                    F("finished_at"),
                    condition=Q(finished_at__isnull=False, parked_at__isnull=True),
                    name="durable_jobs_finished",
                ),
                # Parked jobs whose subject has not been told yet (the reconciler calls their
                # mirror with "failed"): only those rows, however many finished rows there are.
                models.Index(
                    F("parked_at"),
                    condition=Q(
                        status=Status.FAILED.value,
                        parked_at__isnull=False,
                        domain_mirrored_at__isnull=True,
                    ),
                    name="durable_jobs_parked_untold",
                ),
                # Held jobs (JobQuerySet.held), by their next check: the admin's filter and
                # the stats count read only the held rows.
                models.Index(
                    F("next_run_at"),
                    condition=HELD,
                    name="durable_jobs_held",
                ),
                # Jobs whose wait on a key cleared: the start's "cleared a moment ago" lookup.
                models.Index(
                    F("tenant_id"),
                    F("wait_key"),
                    F("wait_satisfied_at"),
                    condition=Q(wait_key__isnull=False, wait_satisfied_at__isnull=False),
                    name="durable_jobs_wait_cleared",
                ),
            ]
            + CONSOLE_INDEXES
            + FLOW_INDEXES
        )

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    #: True on the job ``start()`` returned when the start coalesced onto this job, the
    #: holder of its wait key, instead of creating one (invariant 22).
    coalesced = False
    #: True on the job ``start()`` returned when a job holding the start's unique key
    #: answered it instead of a new one (invariant 25).
    deduplicated = False

    # --- derived reads -------------------------------------------------------------
    @property
    def is_live(self) -> bool:
        return self.status in LIVE_STATUSES

    @property
    def is_parked(self) -> bool:
        return self.parked_at is not None

    @property
    def progress(self) -> float | None:
        """Fraction done in [0, 1], or None when the total is unknown."""
        if not self.total_count:
            return None
        return max(0.0, min(1.0, self.processed_count / self.total_count))


class Leader(models.Model):
    """A leased leadership: who runs the reconciler loop among many workers, until when.

    A row, not an advisory lock: a pooler in transaction mode (PgBouncer) hands session
    locks to whichever client borrows the server connection next. Written only by
    ``store.acquire_leadership`` / ``store.resign_leadership``; times are the database's.
    """

    name = models.CharField(max_length=200, primary_key=True)
    owner = models.CharField(max_length=200, null=True, blank=True)
    epoch = models.BigIntegerField(db_default=0)
    expires_at = models.DateTimeField()

    class Meta:
        db_table = LEADER_TABLE
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.name}: {self.owner} (epoch {self.epoch})"


# ---------------------------------------------------------------------------------------
# Django's Tasks framework (durable_jobs.tasks.backend): the history a TaskResult needs.
# ---------------------------------------------------------------------------------------

TASK_ATTEMPT_TABLE = "durable_jobs_task_attempt"


class TaskAttempt(models.Model):
    """One run of a job started through Django's Tasks framework (``durable_jobs.tasks.backend``).

    A ``TaskResult`` names one worker per attempt and one error, with its traceback, per
    failed attempt; the job row keeps only the latest error. Only jobs of the tasks
    backend get these rows, so ordinary jobs' hot path writes nothing here. Written only by
    ``store.begin_task_attempt`` / ``store.end_task_attempt``, each fenced on the job's
    lease; the rows go when their job does (``ON DELETE CASCADE``, added by migration
    0004, so retention's bulk delete needs no second statement).
    """

    id = models.BigAutoField(primary_key=True)
    job_id = models.UUIDField()
    #: The lease epoch the attempt ran under: one claim, one attempt.
    epoch = models.BigIntegerField()
    worker_id = models.CharField(max_length=200)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    #: Set when the task raised: the exception's dotted path and its formatted traceback.
    exception_class_path = models.CharField(max_length=300, null=True, blank=True)
    traceback = models.TextField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = TASK_ATTEMPT_TABLE
        base_manager_name = "objects"
        default_permissions = ()
        ordering = ["job_id", "epoch"]
        constraints = [
            models.UniqueConstraint(
                fields=["job_id", "epoch"], name="durable_jobs_task_attempt_epoch"
            ),
        ]

    def __str__(self) -> str:
        return f"attempt of {self.job_id} at epoch {self.epoch} by {self.worker_id}"

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)


# ---------------------------------------------------------------------------------------
# Attempt history (invariant 32): what each slice that did not succeed left behind.
# ---------------------------------------------------------------------------------------

ATTEMPT_TABLE = "durable_jobs_attempt"
#: How a recorded slice ended: the failure paths only (a slice that succeeds, yields or
#: is handed back at shutdown records nothing).
ATTEMPT_OUTCOMES = ("failed", "time_limit", "interrupted", "lease_lost")


class JobAttempt(models.Model):
    """One slice of a job that ended in a failure, a time limit, an interruption or a lease loss.

    The job row keeps only the latest error; these rows keep the newest
    ``ATTEMPT_HISTORY_KEEP`` of them, each with its traceback (capped at
    ``ATTEMPT_TRACEBACK_BYTES``). Written only by the store statement of the transition
    it records (``fail_slice``, ``charge_interruption``, ``take_orphan``), as a
    data-modifying CTE of that same statement: it commits exactly when the transition
    does and is fenced by the same WHERE clause (invariant 32). The rows go when their job
    does (``ON DELETE CASCADE``, added by migration 0008, so retention's bulk delete needs
    no second statement).
    """

    id = models.BigAutoField(primary_key=True)
    job_id = models.UUIDField()
    #: 1, 2, 3 … over the job's recorded attempts (never reused: trimming drops the oldest).
    attempt = models.IntegerField()
    #: The lease epoch the slice ran under (the Tasks framework's attempt rows use it too).
    epoch = models.BigIntegerField()
    #: The lease owner that ran the slice: ``host:pid:token``.
    worker = models.CharField(max_length=200, null=True, blank=True)
    #: When the slice's claim took the lease (database clock). None for a lease loss:
    #: the reconciler that records it never saw the slice start.
    started_at = models.DateTimeField(null=True, blank=True)
    #: The slice's last heartbeat before the transition: for a lease loss, when its worker
    #: was last seen alive.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    #: ``clock_timestamp()`` of the recording statement.
    ended_at = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=[(o, o) for o in ATTEMPT_OUTCOMES])
    error_class = models.CharField(max_length=16, null=True, blank=True)
    error_code = models.CharField(max_length=100, null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    traceback = models.TextField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = ATTEMPT_TABLE
        base_manager_name = "objects"
        default_permissions = ()
        ordering = ["job_id", "-attempt"]
        indexes = [
            # The job page's "newest first" and the statement's next number and trim: one
            # short range of this index per job.
            models.Index(fields=["job_id", "attempt"], name="durable_jobs_attempt_job"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt} of {self.job_id}: {self.outcome}"

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)


WORKER_TABLE = "durable_jobs_worker"


class WorkerProcess(models.Model):
    """A worker process as it registered itself: what it serves, and when it last beat.

    Liveness of *jobs* is their lease, never this row (a pruned or stale worker row can
    orphan nothing). This row is for operators and ``explain``: ``durable_jobs workers``,
    the admin's worker list, and "no live worker serves queue 'reprots'". A worker
    writes it when it starts, beats it every heartbeat interval and deletes it when it
    stops; a row whose beat is older than ``LEASE_TTL`` is a worker that died and is
    listed by nobody (and pruned by the next worker that starts). Written only by
    ``store.register_worker`` / ``beat_worker`` / ``unregister_worker``.
    """

    #: ``host:pid:token``, the prefix of every lease owner this process writes.
    identity = models.CharField(max_length=200, primary_key=True)
    host = models.CharField(max_length=200)
    pid = models.IntegerField()
    version = models.CharField(max_length=50)
    queues = models.JSONField()
    kinds = models.JSONField()
    slots = models.IntegerField()
    execution = models.CharField(max_length=20)
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField()

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = WORKER_TABLE
        ordering = ["host", "pid"]
        default_permissions = ("view",)
        base_manager_name = "objects"
        verbose_name = "worker"

    def __str__(self) -> str:
        return self.identity

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)


# ---------------------------------------------------------------------------------------
# Paused queues (invariant 27): a queue named here is not claimed from.
# ---------------------------------------------------------------------------------------

PAUSED_QUEUE_TABLE = "durable_jobs_paused_queue"
_PAUSE_REFUSAL = (
    "paused queues are written only by durable_jobs.store; use durable_jobs.pause_queue() "
    "or resume_queue() instead"
)


class PausedQueue(models.Model):
    """A queue an operator paused: no worker claims from it until it is resumed.

    The row *is* the pause: the dequeue statement reads this table in the same statement
    that claims (invariant 27), so every worker on every host honours a pause from its
    next claim on, with no cache to go stale. Written only by ``store.pause_queue`` /
    ``store.resume_queue`` (through ``durable_jobs.pause_queue`` / ``resume_queue``);
    ``paused_at`` is the database's clock. Resuming deletes the row: a queue that is not
    here is running.
    """

    queue_name = models.CharField(max_length=100, primary_key=True)
    paused_at = models.DateTimeField()
    paused_by = models.CharField(max_length=200, null=True, blank=True)
    reason = models.CharField(max_length=500, null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = PAUSED_QUEUE_TABLE
        ordering = ["queue_name"]
        default_permissions = ("view",)
        permissions = [("pause_queue", "Can pause and resume a queue")]
        base_manager_name = "objects"
        verbose_name = "paused queue"

    def __str__(self) -> str:
        return self.queue_name

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_PAUSE_REFUSAL)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_PAUSE_REFUSAL)


# ---------------------------------------------------------------------------------------
# Periodic jobs (durable_jobs.schedules): one row per schedule ever declared in code.
# ---------------------------------------------------------------------------------------

SCHEDULE_TABLE = "durable_jobs_schedule"
#: The leader's one statement for "when is the next tick": the active schedules, by tick.
SCHEDULE_DUE_INDEX = "durable_jobs_schedule_due"


class Schedule(models.Model):
    """A schedule as code last declared it, and where its ticks stand (invariant 24).

    Code is the source of declarations: workers upsert these rows when they start
    (``store.sync_schedules``), and a schedule no longer declared is marked removed and
    never fires again, its row and its jobs kept. ``next_tick_at`` is the tick the leader
    fires next: firing advances it by compare-and-set on its old value, in the same
    transaction as the tick's job, whose idempotency key is derived from the schedule
    and the tick. Written only by ``store``; times are the database's.
    """

    name = models.CharField(max_length=100, primary_key=True)
    kind = models.CharField(max_length=100)
    expression = models.CharField(max_length=200)
    zone = models.CharField(max_length=100)
    input = models.JSONField(null=True, blank=True)
    queue_name = models.CharField(max_length=100, null=True, blank=True)
    priority = models.IntegerField(db_default=0)
    catch_up = models.CharField(max_length=20)
    next_tick_at = models.DateTimeField()
    last_tick_at = models.DateTimeField(null=True, blank=True)
    last_job_id = models.UUIDField(null=True, blank=True)
    missed_ticks = models.BigIntegerField(db_default=0)
    paused_at = models.DateTimeField(null=True, blank=True)
    removed_at = models.DateTimeField(null=True, blank=True)
    seen_at = models.DateTimeField()
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = SCHEDULE_TABLE
        ordering = ["name"]
        base_manager_name = "objects"
        default_permissions = ("view",)
        permissions = [("change_schedule_state", "Can pause, resume and run a schedule now")]
        indexes = [
            models.Index(
                F("next_tick_at"),
                name=SCHEDULE_DUE_INDEX,
                condition=Q(paused_at__isnull=True, removed_at__isnull=True),
            )
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)


class JobEvent(models.Model):
    """An event sent to a job (``durable_jobs.send_event``), kept until the job consumes it.

    Written only by ``store`` (invariant 1): sent in the sender's transaction, consumed in
    the receiving slice's fenced transaction, so a payload is delivered exactly once. Events
    of one name are kept in the order they were sent (``id``); each wait takes the oldest.
    """

    id = models.BigAutoField(primary_key=True)
    job_id = models.UUIDField()
    name = models.CharField(max_length=100)
    payload = models.JSONField(null=True, blank=True)
    sent_at = models.DateTimeField()
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = EVENT_TABLE
        default_permissions = ("view",)
        indexes = [
            models.Index(
                fields=["job_id", "name", "id"],
                condition=Q(consumed_at__isnull=True),
                name="durable_jobs_event_unread",
            ),
            models.Index(fields=["job_id", "id"], name="durable_jobs_event_job"),
        ]

    def __str__(self) -> str:
        return f"event {self.name} for {self.job_id}"

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_REFUSAL)


FLOW_KEY_TABLE = "durable_jobs_flow_key"
_FLOW_REFUSAL = (
    "flow keys are written only by durable_jobs.store (the claim and "
    "durable_jobs.set_flow_limit), never through the ORM"
)


class FlowKey(models.Model):
    """One flow-control key: its operator's limits and the state the claim keeps.

    ``concurrency``, ``rate``, ``rate_window_ms`` and ``weight`` are an operator's runtime
    overrides (null: the settings' or the kind's value). ``holders`` lists the permits the
    claim granted (job id, the epoch it was claimed at, the claiming transaction); a
    permit is released when that job's row no longer holds a lease at that epoch, so
    nothing but the claim ever writes it (invariant 26). ``starts`` is the sliding
    window's log of slice starts (epoch seconds); ``pass`` is the key's fair-share clock.
    """

    key = models.CharField(max_length=200, primary_key=True)
    concurrency = models.IntegerField(null=True, blank=True)
    rate = models.IntegerField(null=True, blank=True)
    rate_window_ms = models.BigIntegerField(null=True, blank=True)
    weight = models.FloatField(null=True, blank=True)
    holders = models.JSONField(default=list)
    starts = models.JSONField(default=list)
    fair_pass = models.FloatField(default=0.0)
    served_at = models.DateTimeField(null=True, blank=True)
    changed_at = models.DateTimeField(null=True, blank=True)
    changed_by = models.CharField(max_length=200, null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = FLOW_KEY_TABLE
        ordering = ["key"]
        default_permissions = ("view",)
        permissions = [("change_flow_limit", "Can change a flow key's limits")]
        base_manager_name = "objects"
        verbose_name = "flow key"

    def __str__(self) -> str:
        return self.key

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_FLOW_REFUSAL)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ReadOnlyJobRow(_FLOW_REFUSAL)
