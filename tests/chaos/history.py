"""A recorded history of every job-row change, and the invariant checker that reads it.

``install()`` adds a test-only trigger that copies every INSERT/UPDATE/DELETE of a job
row (status, lease, delivery, counters, the database clock, the writing session's
application_name and transaction id) into ``durable_jobs_history``. ``check()`` runs
the invariants of the promise over that history, in SQL, and returns the violations.
"""

from __future__ import annotations

import time

from django.db import connection

INSTALL = """
DROP TABLE IF EXISTS durable_jobs_history;
CREATE TABLE durable_jobs_history (
    seq bigserial PRIMARY KEY,
    op text NOT NULL,
    job_id uuid NOT NULL,
    status text, old_status text,
    lease_owner text, lease_epoch bigint, lease_expires_at timestamptz,
    continuation_seq int, old_continuation_seq int, redrives int,
    consecutive_failures int, redrives_since_commit int, mirror_attempts int, interruptions int,
    error_code text, parked_at timestamptz, domain_mirrored_at timestamptz, processed_count bigint,
    parent_id uuid, flow_wait jsonb, children_total int, children_ended int, children_failed int,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    app text DEFAULT current_setting('application_name'),
    txid bigint DEFAULT txid_current()
);
CREATE OR REPLACE FUNCTION durable_jobs_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO durable_jobs_history (op, job_id, old_status)
        VALUES ('DELETE', OLD.id, OLD.status);
        RETURN OLD;
    END IF;
    INSERT INTO durable_jobs_history (
        op, job_id, status, old_status, lease_owner, lease_epoch, lease_expires_at,
        continuation_seq, old_continuation_seq, redrives, consecutive_failures,
        redrives_since_commit, mirror_attempts, interruptions, error_code, parked_at,
        domain_mirrored_at, processed_count,
        parent_id, flow_wait, children_total, children_ended, children_failed)
    VALUES (
        TG_OP, NEW.id, NEW.status, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
        NEW.lease_owner, NEW.lease_epoch, NEW.lease_expires_at,
        NEW.continuation_seq, CASE WHEN TG_OP = 'UPDATE' THEN OLD.continuation_seq END,
        NEW.redrives, NEW.consecutive_failures, NEW.redrives_since_commit, NEW.mirror_attempts,
        NEW.interruptions, NEW.error_code, NEW.parked_at, NEW.domain_mirrored_at,
        NEW.processed_count,
        NEW.parent_id, NEW.flow_wait, NEW.children_total, NEW.children_ended, NEW.children_failed);
    RETURN NEW;
END $$;
CREATE TRIGGER durable_jobs_record AFTER INSERT OR UPDATE OR DELETE ON durable_jobs_job
    FOR EACH ROW EXECUTE FUNCTION durable_jobs_record();
"""

UNINSTALL = """
DROP TRIGGER IF EXISTS durable_jobs_record ON durable_jobs_job;
DROP FUNCTION IF EXISTS durable_jobs_record();
DROP TABLE IF EXISTS durable_jobs_history;
"""

# Each check: (name, SQL returning offending rows). An empty result is a pass.
CHECKS = {
    "no lost job: every job ended terminal (or parked with a reason)": """
        SELECT id, kind, status, error_code FROM durable_jobs_job
         WHERE status IN ('pending', 'running')""",
    "no duplicated effect": """
        SELECT job_id, item, count(*) FROM demo_effect GROUP BY job_id, item HAVING count(*) > 1""",
    "no effect committed under an epoch older than the job's claim": """
        SELECT e.job_id, e.item, e.epoch, h.lease_epoch, h.lease_owner
          FROM demo_effect e
          JOIN durable_jobs_history h ON h.job_id = e.job_id AND h.txid = e.txid
         WHERE h.lease_epoch <> e.epoch OR h.status <> 'running' OR h.lease_owner IS NULL""",
    "every effect's transaction re-asserted the lease on the job row": """
        SELECT e.job_id, e.item FROM demo_effect e
         WHERE NOT EXISTS (SELECT 1 FROM durable_jobs_history h
                            WHERE h.job_id = e.job_id AND h.txid = e.txid)""",
    # A later transaction touching a completed or cancelled row is a violation (the
    # transaction that made it so may still touch it before committing).
    "no transition out of completed or cancelled": """
        SELECT h.job_id, h.old_status, h.status, h.seq FROM durable_jobs_history h
         WHERE h.op = 'UPDATE' AND h.old_status IN ('completed', 'cancelled')
           AND (h.status <> h.old_status OR NOT EXISTS (
                SELECT 1 FROM durable_jobs_history t
                 WHERE t.job_id = h.job_id AND t.txid = h.txid AND t.status = h.old_status
                   AND t.old_status IN ('pending', 'running')))""",
    "failed changes only through an operator's redrive (back to pending)": """
        SELECT job_id, old_status, status, seq FROM durable_jobs_history
         WHERE op = 'UPDATE' AND old_status = 'failed' AND status NOT IN ('failed', 'pending')""",
    "the lease epoch only rises": """
        SELECT job_id, seq, lease_epoch, previous FROM (
            SELECT job_id, seq, lease_epoch,
                   lag(lease_epoch) OVER (PARTITION BY job_id ORDER BY seq) AS previous
              FROM durable_jobs_history WHERE op <> 'DELETE') steps
         WHERE lease_epoch < previous""",
    "continuation_seq rises by one per yield, never otherwise": """
        SELECT job_id, seq, old_continuation_seq, continuation_seq, old_status, status
          FROM durable_jobs_history
         WHERE op = 'UPDATE' AND continuation_seq <> old_continuation_seq
           AND NOT (continuation_seq = old_continuation_seq + 1
                    AND old_status = 'running' AND status = 'pending')""",
    "completed if and only if mirrored": """
        SELECT id, status, domain_mirrored_at FROM durable_jobs_job
         WHERE (status = 'completed') <> (domain_mirrored_at IS NOT NULL AND status = 'completed')
            OR (domain_mirrored_at IS NOT NULL
                AND status NOT IN ('completed', 'failed', 'cancelled'))""",
    "every parked job has a reason and met its threshold": """
        SELECT id, error_code, redrives_since_commit, mirror_attempts FROM durable_jobs_job
         WHERE parked_at IS NOT NULL
           AND NOT ((error_code = 'poison' AND redrives_since_commit > %(max_redrives)s)
                 OR (error_code = 'mirror_failed' AND mirror_attempts >= %(max_mirror)s))""",
    # Trees (invariants 29 and 30).
    "no duplicate child: one child per parent and spawn key": """
        SELECT parent_id, spawn_key, count(*) FROM durable_jobs_job
         WHERE parent_id IS NOT NULL GROUP BY parent_id, spawn_key HAVING count(*) > 1""",
    "no child lost: each parent counted exactly the children it has, and their ends": """
        SELECT p.id, p.children_total, p.children_ended, c.n, c.ended
          FROM durable_jobs_job p
          JOIN (SELECT parent_id, count(*) AS n,
                       count(*) FILTER (WHERE status IN ('completed', 'failed', 'cancelled')) AS ended
                  FROM durable_jobs_job WHERE parent_id IS NOT NULL GROUP BY parent_id) c
            ON c.parent_id = p.id
         WHERE p.children_total <> c.n OR p.children_ended <> c.ended""",
    # A claim of a parent whose last wait was for all of its children (policy continue or
    # wait) comes after every child's terminal transition in the history.
    "a parent never resumes before what it waits for has ended": """
        SELECT h.job_id, h.seq, c.id FROM durable_jobs_history h
          JOIN durable_jobs_job c ON c.parent_id = h.job_id
         WHERE h.op = 'UPDATE' AND h.old_status = 'pending' AND h.status = 'running'
           AND h.flow_wait->>'on' = 'children' AND h.flow_wait->>'at_least' IS NULL
           AND h.flow_wait->>'policy' IN ('continue', 'wait')
           AND NOT EXISTS (
               SELECT 1 FROM durable_jobs_history t
                WHERE t.job_id = c.id AND t.seq < h.seq
                  AND t.status IN ('completed', 'failed', 'cancelled'))""",
    "no advisory lock left behind": """
        SELECT pid, objid FROM pg_locks WHERE locktype = 'advisory'""",
    "no session idle in a transaction": """
        SELECT pid, application_name, state FROM pg_stat_activity
         WHERE datname = current_database() AND state LIKE 'idle in transaction%%'
           AND pid <> pg_backend_pid()""",
    "no worker connection left behind": """
        SELECT pid, application_name FROM pg_stat_activity
         WHERE datname = current_database() AND application_name LIKE 'durable-%%'""",
}


def install(conn=connection) -> None:
    with conn.cursor() as cursor:
        cursor.execute(INSTALL)


def uninstall(conn=connection) -> None:
    with conn.cursor() as cursor:
        cursor.execute(UNINSTALL)


def check(
    *, max_redrives: int, max_mirror: int, skip: tuple[str, ...] = (), conn=connection
) -> dict[str, list]:
    """Run every invariant; return ``{name: offending rows}`` for those that failed."""
    failures = {}
    with conn.cursor() as cursor:
        for name, sql in CHECKS.items():
            if any(word in name for word in skip):
                continue
            cursor.execute(sql, {"max_redrives": max_redrives, "max_mirror": max_mirror})
            rows = cursor.fetchall()
            if rows:
                failures[name] = rows[:10]
    return failures


def settle(conn=connection, timeout: float = 10) -> None:
    """Wait for the backends of stopped processes to go (they take a moment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with conn.cursor() as cursor:
            cursor.execute(CHECKS["no worker connection left behind"].replace("%%", "%"))
            if not cursor.fetchall():
                return
        time.sleep(0.1)


def events(job_id) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq, op, old_status, status, lease_owner, lease_epoch, continuation_seq,"
            " redrives, error_code, app FROM durable_jobs_history WHERE job_id = %s ORDER BY seq",
            [job_id],
        )
        return cursor.fetchall()
