"""The operator console's and the statistics' reads: cost that does not grow with finished rows.

The admin's change list (filter choices by loose index scans, estimated counts),
``durable_jobs stats`` and the Prometheus view read through these. Reads only: nothing
here writes a row, and every figure filtered to a scope uses ``store.SCOPE``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from durable_jobs.db import execute
from durable_jobs.models import TABLE, Job, JobAttempt
from durable_jobs.states import Scope
from durable_jobs.store import LIVE, SCOPE, scope_params

#: Columns a loose index scan may list, each the leading column of an index (migration
#: 0005), and whether that index is a newest-first one, which leaves running rows out
#: (migration 0017): those running rows' values are then read apart and added.
_LISTABLE = {
    "kind": ("kind", True),
    "queue_name": ("queue_name", True),
    "tenant_id": ("tenant_id", True),
    "subject_type": ("subject_type", False),
}

# A loose index scan: one index probe per distinct value ("the smallest value above the
# last one"), so listing the few kinds of a ten-million-row table reads a few dozen index
# pages instead of the table (PostgreSQL has no skip scan for DISTINCT). Each probe names
# its index's predicate ({settled}), or the planner could not use a partial index for it.
_LOOSE_SCAN = """
WITH RECURSIVE v(value) AS (
    (SELECT {col} FROM {table} WHERE {col} IS NOT NULL {settled} ORDER BY {col} LIMIT 1)
    UNION ALL
    SELECT (SELECT {col} FROM {table} WHERE {col} > v.value {settled} ORDER BY {col} LIMIT 1)
      FROM v WHERE v.value IS NOT NULL
)
"""
_DISTINCT_VALUES = _LOOSE_SCAN + "SELECT value FROM v WHERE value IS NOT NULL LIMIT %(limit)s"
# The same for a newest-first index: the first values of the walk, with the running rows'
# (a few, bounded by the fleet's slots) merged in.
_DISTINCT_VALUES_WITH_RUNNING = (
    _LOOSE_SCAN
    + """
SELECT value FROM (
    (SELECT value FROM v WHERE value IS NOT NULL LIMIT %(limit)s)
    UNION
    SELECT {col} FROM {table} WHERE status = 'running' AND {col} IS NOT NULL
) AS listed ORDER BY value LIMIT %(limit)s
"""
)


def distinct_values(column: str, *, limit: int, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Return at most ``limit`` distinct values of ``column`` (kind, queue_name, tenant_id or
    subject_type), sorted."""
    col, newest_first_index = _LISTABLE[column]
    if newest_first_index:
        sql = _DISTINCT_VALUES_WITH_RUNNING.format(
            col=col, table=TABLE, settled="AND status <> 'running'"
        )
    else:
        sql = _DISTINCT_VALUES.format(col=col, table=TABLE, settled="")
    with execute(using, sql, {"limit": int(limit)}) as cursor:
        return [row[0] for row in cursor.fetchall()]


# Organizations have no index of their own (they are read within a tenant): the choices
# come from the newest rows only, so listing them costs the same at any table size. The
# newest are read off durable_jobs_recent, which leaves running rows out; those are few
# (bounded by the fleet's slots) and added whole.
RECENT_ORGANIZATIONS = f"""
SELECT DISTINCT organization_id FROM (
    (SELECT organization_id FROM {TABLE} WHERE status <> 'running'
      ORDER BY created_at DESC, id DESC LIMIT %(sample)s)
    UNION ALL
    SELECT organization_id FROM {TABLE} WHERE status = 'running'
) recent WHERE organization_id IS NOT NULL ORDER BY 1 LIMIT %(limit)s
"""


def recent_organizations(*, sample: int, limit: int, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Return up to ``limit`` organizations among the newest ``sample`` jobs, sorted."""
    with execute(
        using, RECENT_ORGANIZATIONS, {"sample": int(sample), "limit": int(limit)}
    ) as cursor:
        return [row[0] for row in cursor.fetchall()]


def estimate_rows(
    sql: str, params: Sequence[Any] | dict[str, Any], *, using: str = DEFAULT_DB_ALIAS
) -> int:
    """Return the planner's estimate of the rows ``sql`` returns (runs EXPLAIN, never the query)."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


# ANALYZE's joint most-common-value list of (kind, status) (the statistics object of
# migration 0005): the share of the table each pair holds, as of the last ANALYZE. Read
# through pg_stats_ext, which shows it to the table's owner (pg_statistic_ext_data itself
# is for superusers only); its values are a two-dimensional array, one (kind, status) row each.
KIND_STATUS_FREQUENCIES = f"""
SELECT s.most_common_vals[i][1], s.most_common_vals[i][2], s.most_common_freqs[i]
  FROM pg_stats_ext s
 CROSS JOIN LATERAL generate_subscripts(s.most_common_freqs, 1) AS i
 WHERE s.statistics_name = 'durable_jobs_kind_status' AND s.tablename = '{TABLE}'
   AND s.schemaname = current_schema()
"""


def kind_status_frequencies(*, using: str = DEFAULT_DB_ALIAS) -> list[tuple[str, str, float]]:
    """Return ``(kind, status, share of rows)`` from the last ANALYZE; [] before the first one.

    Only the table's owner (or a superuser) sees these statistics; for anyone else, and
    before the first ANALYZE, the list is empty and callers fall back to estimates per status.
    """
    # A savepoint only inside the caller's transaction, where a refused read would abort
    # it; in autocommit it would cost two more round trips (BEGIN, COMMIT) for nothing.
    contained = (
        transaction.atomic(using=using) if connections[using].in_atomic_block else nullcontext()
    )
    try:
        with contained, execute(using, KIND_STATUS_FREQUENCIES, {}) as cursor:
            return [(row[0], row[1], float(row[2])) for row in cursor.fetchall()]
    except Exception:  # noqa: BLE001 — no rights to the statistics: fall back, never fail a scrape
        return []


# Exact counts of live rows only: each read walks a partial index or the status index's
# live entries, so its cost follows the live backlog, never the finished history.
#: A ``running`` row without a lease is not running: its claim was handed back unstarted
#: (a shutdown, the prefetch window) or its failed slice waits out a retry backoff. The
#: console, ``stats`` and the metrics all call it ``waiting`` (``SHOWN_STATUS``).
SHOWN_STATUS = "CASE WHEN status = 'running' AND lease_owner IS NULL THEN 'waiting' ELSE status END"

LIVE_COUNTS = f"""
SELECT kind, {SHOWN_STATUS}, count(*) FROM {TABLE}
 WHERE status IN {LIVE} {{scope}}
 GROUP BY 1, 2
"""

PARKED_COUNTS = f"""
SELECT error_code, count(*) FROM {TABLE}
 WHERE parked_at IS NOT NULL AND status = 'failed' {{scope}}
 GROUP BY error_code
"""

# Everything else `durable_jobs stats` and the scrape report, in one statement (one round
# trip, however loaded the machine): the database's clock, the pending backlog's oldest
# entry (durable_jobs_pending), running jobs whose lease expired (durable_jobs_leased),
# retrying jobs (the two deliverable indexes, with and without a flow key: each predicate
# written as that index's own),
# held jobs (durable_jobs_held), and jobs finished in the last 1, 5 and 15 minutes:
# unparked ones through durable_jobs_finished, parked ones through the parked index. Every
# read is proportional to the live backlog, the parked jobs or the last 15 minutes'
# finished jobs, never to the history. And the oldest open transaction (OLDEST_TRANSACTION).
STATS_FIGURES = f"""
SELECT clock_timestamp(),
       ({{oldest_transaction}}),
       (SELECT min(pending_since) FROM {TABLE} WHERE status = 'pending' {{scope}}),
       (SELECT count(*) FROM {TABLE} WHERE status = 'running' AND lease_owner IS NOT NULL
           AND lease_expires_at < now() {{scope}}),
       (SELECT count(*) FROM {TABLE} WHERE status IN {LIVE} AND lease_owner IS NULL
           AND next_run_at IS NOT NULL AND flow_key IS NULL AND status = 'running' {{scope}})
     + (SELECT count(*) FROM {TABLE} WHERE status IN {LIVE} AND lease_owner IS NULL
           AND next_run_at IS NOT NULL AND flow_key IS NOT NULL AND status = 'running' {{scope}}),
       (SELECT count(*) FROM {TABLE} WHERE status = 'pending' AND held_since IS NOT NULL
           AND wait_satisfied_at IS NULL {{scope}}),
       count(*), min(finished_at),
       {{windows}}
  FROM (SELECT status, finished_at FROM (
            (SELECT status, finished_at FROM {TABLE}
              WHERE finished_at IS NOT NULL AND parked_at IS NULL
                AND finished_at >= statement_timestamp() - %(widest)s * interval '1 minute' {{scope}}
              ORDER BY finished_at DESC LIMIT %(sample)s)
            UNION ALL
            (SELECT status, finished_at FROM {TABLE}
              WHERE parked_at IS NOT NULL AND status = 'failed'
                AND finished_at >= statement_timestamp() - %(widest)s * interval '1 minute' {{scope}}
              ORDER BY finished_at DESC LIMIT %(sample)s)
        ) AS both_kinds ORDER BY finished_at DESC LIMIT %(sample)s) AS finished
"""

#: The oldest transaction in this database that holds back what vacuum may remove (it has
#: an XID or a snapshot), as a JSON object, or NULL. While it lasts, every job row version
#: that died after it began stays, in the table and in the claim's index, and each claim
#: steps over them (docs/performance.rst, "A pinned horizon"). Client sessions only: a
#: vacuum's own transaction holds nothing back, and must not be named as the culprit.
#: Another role's sessions show only to a role with pg_read_all_stats (PostgreSQL hides
#: their transaction times); prepared transactions and replication slots, which pin it
#: too, are not read. This session's own transaction is left out.
OLDEST_TRANSACTION = """SELECT json_build_object(
           'pid', pid, 'application_name', application_name, 'state', state,
           'age_seconds', round(extract(epoch FROM clock_timestamp() - xact_start)::numeric, 1),
           'holds_xid', backend_xid IS NOT NULL)
      FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
       AND backend_type = 'client backend' AND xact_start IS NOT NULL
       AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
     ORDER BY xact_start
     LIMIT 1"""

#: The throughput windows read at most this many of the newest finished rows. Below about
#: 11 jobs/s over the widest window (15 minutes) every count is exact; above it the rows
#: finished before the sample's oldest are not read, and a window reaching past it is the
#: sample's rate over the window (flagged as an estimate): at 5,000 jobs/s a 15-minute
#: window is 4.5 million rows, which no scrape should read.
FINISHED_SAMPLE = 10_000

_FINISHED_STATUSES = ("completed", "failed", "cancelled")


def _scope_clause(tenant: str | None, scope: Scope | None) -> tuple[str, dict[str, Any]]:
    if scope is not None:
        return f"AND {SCOPE}", scope_params(scope)
    if tenant is not None:
        return "AND tenant_id = %(tenant)s", {"tenant": tenant}
    return "", {}


def live_counts(
    *, tenant: str | None = None, scope: Scope | None = None, using: str = DEFAULT_DB_ALIAS
) -> list[tuple[str, str, int]]:
    """Return exact ``(kind, status, count)`` of pending and running jobs."""
    clause, params = _scope_clause(tenant, scope)
    with execute(using, LIVE_COUNTS.format(scope=clause), params) as cursor:
        return [(row[0], row[1], int(row[2])) for row in cursor.fetchall()]


def parked_counts(
    *, tenant: str | None = None, scope: Scope | None = None, using: str = DEFAULT_DB_ALIAS
) -> dict[str | None, int]:
    """Return exact parked-job counts by reason (the parked index holds only parked rows)."""
    clause, params = _scope_clause(tenant, scope)
    with execute(using, PARKED_COUNTS.format(scope=clause), params) as cursor:
        return {row[0]: int(row[1]) for row in cursor.fetchall()}


def stats_figures(
    windows: Sequence[int],
    *,
    tenant: str | None = None,
    scope: Scope | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> dict[str, Any]:
    """Return the database's clock, the backlog figures and finished counts per window (minutes).

    Keys: ``now``, ``oldest_pending`` (pending_since, or None), ``expired`` (running with an
    expired lease), ``retrying``, ``held``, ``finished``: ``{minutes: {status: count}}``,
    ``finished_estimated``: the windows counted from the newest ``FINISHED_SAMPLE`` rows'
    rate rather than row by row (none below about 11 jobs/s), and ``oldest_transaction``
    (``OLDEST_TRANSACTION``: pid, application_name, state, age_seconds, holds_xid; or None).
    """
    clause, params = _scope_clause(tenant, scope)
    columns = ",\n       ".join(
        f"count(*) FILTER (WHERE status = '{status}' AND finished_at >= statement_timestamp() - "
        f"{int(minutes)} * interval '1 minute')"
        for minutes in windows
        for status in _FINISHED_STATUSES
    )
    sql = STATS_FIGURES.format(scope=clause, windows=columns, oldest_transaction=OLDEST_TRANSACTION)
    widest = max(int(m) for m in windows)
    with execute(using, sql, {**params, "widest": widest, "sample": FINISHED_SAMPLE}) as cursor:
        row = cursor.fetchone()
    now, oldest_transaction = row[0], row[1]
    row = (row[0], *row[2:])
    sampled, oldest_sampled = int(row[5]), row[6]
    counts = iter(row[7:])
    finished, estimated = {}, []
    for minutes in windows:
        in_sample = {status: int(next(counts)) for status in _FINISHED_STATUSES}
        covered = (now - oldest_sampled).total_seconds() if oldest_sampled is not None else 0.0
        if sampled >= FINISHED_SAMPLE and covered < minutes * 60:
            # The sample ends inside this window: its rate, carried over the whole window.
            scale = minutes * 60 / max(covered, 0.001)
            in_sample = {status: round(n * scale) for status, n in in_sample.items()}
            estimated.append(minutes)
        finished[minutes] = in_sample
    return {
        "now": now,
        "oldest_pending": row[1],
        "expired": int(row[2]),
        "retrying": int(row[3]),
        "held": int(row[4]),
        "finished": finished,
        "finished_estimated": estimated,
        "oldest_transaction": (
            json.loads(oldest_transaction)
            if isinstance(oldest_transaction, str)
            else oldest_transaction
        ),
    }


def attempts_of(
    job_id: uuid.UUID | str,
    *,
    limit: int = 20,
    scope: Scope | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[JobAttempt]:
    """Return the job's recorded attempts, newest first (at most ``limit``).

    Each is a slice that ended in a failure, a time limit, an interruption or a lease
    loss (invariant 32); a job that never failed has none. With ``scope`` the job must be
    in it (invariant 10: a job of another scope has no attempts to show); the admin's job
    page passes none, its queryset having scoped the job already. One short range of the
    ``(job_id, attempt)`` index.
    """
    attempts = JobAttempt.objects.using(using).filter(job_id=job_id)
    if scope is not None:
        in_scope = Job.objects.using(using).filter(
            id=job_id,
            tenant_id=scope.tenant,
            **(
                {"organization_id__isnull": True}
                if scope.organization is None
                else {"organization_id": scope.organization}
            ),
        )
        attempts = attempts.filter(job_id__in=in_scope.values("id"))
    return list(attempts.order_by("-attempt")[: max(0, int(limit))])


# Read off the two deliverable indexes (their partial predicates, store._deliverable with
# and without a flow key): the jobs a claim could take, per queue, whether their run time
# has come or not. The cost follows the live backlog, never the finished history.
QUEUE_BACKLOGS = f"""
SELECT queue_name, sum(waiting), sum(due)
  FROM (SELECT queue_name, count(*) AS waiting,
               count(*) FILTER (WHERE next_run_at <= statement_timestamp()) AS due
          FROM {TABLE}
         WHERE status IN {LIVE} AND lease_owner IS NULL AND next_run_at IS NOT NULL
           AND flow_key IS NULL
         GROUP BY queue_name
         UNION ALL
        SELECT queue_name, count(*), count(*) FILTER (WHERE next_run_at <= statement_timestamp())
          FROM {TABLE}
         WHERE status IN {LIVE} AND lease_owner IS NULL AND next_run_at IS NOT NULL
           AND flow_key IS NOT NULL
         GROUP BY queue_name) AS backlog
 GROUP BY queue_name
"""


def queue_backlogs(*, using: str = DEFAULT_DB_ALIAS) -> dict[str, tuple[int, int]]:
    """Return ``{queue: (waiting to be claimed, of which due now)}`` for every tenant."""
    with execute(using, QUEUE_BACKLOGS, {}) as cursor:
        return {row[0]: (int(row[1]), int(row[2])) for row in cursor.fetchall()}
