"""Where one ``durable.start()`` per transaction spends its time (issue #14, deliverable 2).

Each step adds one thing to the one before, all in one process, one client, one
transaction per job, interleaved in rounds so a slow patch of a shared machine lands on
every step; the median of the rounds is reported. The difference between two steps is
what the added thing costs:

* the server floor: a 1-row INSERT + COMMIT into a table with a bigserial key;
* the job row as ``start()`` writes it (``INSERT_JOB`` without RETURNING) on a raw
  psycopg connection, into a copy of the job table with its primary key only, then with
  every index of the real table (the index cost), with a random UUIDv4 or a time-ordered
  (v7-style) key;
* the real table: + the NOTIFY, + ``RETURNING`` every column, through Django's cursor
  inside ``transaction.atomic()``, and finally ``durable.start()`` itself (validation,
  the model instance, the signal).

Every step runs with ``synchronous_commit = off`` on both connections: the commit's WAL
flush is the same for every step (the server floor of the results table shows it), and on
a shared disk it varies more than everything else together, so it would hide the costs
being compared. A cProfile of ``durable.start()`` (cumulative, top entries, with the flush)
shows the Python side.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time
import uuid

import psycopg
from django.db import connection, transaction

import durable_jobs as durable
from benchmarks.durable_bench import KIND, TABLE
from durable_jobs import store

COPY = "bench_job_copy"


def _params(new_id) -> dict:
    return {"id": new_id, "tenant": "default", "organization": None, "kind": KIND, "created_by": None,
            "input": None, "meta": None, "idempotency_key": None, "lock_key": None, "subject_type": None,
            "subject_id": None, "progress_job_id": None, "queue": "default", "priority": 0, "total_count": None,
            "run_at": None, "delay_ms": 0, "wait_for": None, "wait_key": None, "wait_label": None,
            "channel": "durable_jobs_bench_profile"}


def _insert_sql(table: str, returning: bool = False) -> str:
    sql = store.INSERT_JOB.replace(f"INSERT INTO {TABLE}", f"INSERT INTO {table}", 1)
    return sql if returning else sql.split("RETURNING")[0]


def _time(n: int, once) -> float:
    began = time.perf_counter()
    for _ in range(n):
        once()
    return (time.perf_counter() - began) / n * 1e6  # microseconds per job


def breakdown(dburl: str, *, n: int = 300, rounds: int = 5) -> dict:
    """Microseconds per job of each step (median of ``rounds``), and the cProfile text."""
    raw = psycopg.connect(dburl, autocommit=False)
    raw.execute("SET synchronous_commit TO off")
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO off")
    raw.execute(f"DROP TABLE IF EXISTS {COPY}, bench_floor")
    raw.execute("CREATE TABLE bench_floor (id bigserial PRIMARY KEY, at timestamptz)")
    raw.execute(f"CREATE TABLE {COPY} (LIKE {TABLE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    raw.execute(f"ALTER TABLE {COPY} ADD PRIMARY KEY (id)")
    raw.commit()
    copy_indexes = [row[0] for row in raw.execute(
        "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexname NOT LIKE %s",
        [TABLE, "%pkey"]).fetchall()]
    insert_copy = _insert_sql(COPY)
    insert_real = _insert_sql(TABLE)
    notify_sql = store.NOTIFY

    def floor():
        raw.execute("INSERT INTO bench_floor (at) VALUES (now())")
        raw.commit()

    def copy_v4():
        raw.execute(insert_copy, _params(uuid.uuid4()))
        raw.commit()

    def copy_v7():
        raw.execute(insert_copy, _params(_uuid7()))
        raw.commit()

    def real_plain():
        raw.execute(insert_real, _params(uuid.uuid4()))
        raw.commit()

    def real_notify():
        raw.execute(insert_real, _params(uuid.uuid4()))
        raw.execute(notify_sql, {"channel": "durable_jobs_bench_profile", "queue": "default"})
        raw.commit()

    def real_returning():
        raw.execute(store.INSERT_JOB_AND_NOTIFY, _params(uuid.uuid4())).fetchone()
        raw.commit()

    def django_cursor():
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(store.INSERT_JOB_AND_NOTIFY, _params(uuid.uuid4()))
            cur.fetchone()

    def start():
        with transaction.atomic():
            durable.start(KIND)

    steps = {
        "floor: 1-row INSERT + COMMIT (bigserial key)": floor,
        "job row, copy table, primary key only, UUIDv4": copy_v4,
        "job row, copy table, primary key only, UUIDv7": copy_v7,
        "job row, copy table, every index, UUIDv4": None,  # filled after the indexes exist
        "job row, copy table, every index, UUIDv7": None,
        "job row, real table (every index), UUIDv4": real_plain,
        "  + NOTIFY (second statement)": real_notify,
        "  + RETURNING every column (INSERT_JOB_AND_NOTIFY, one statement)": real_returning,
        "  + Django cursor in transaction.atomic()": django_cursor,
        "durable.start() in transaction.atomic()": start,
    }
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for phase in ("pk", "indexed"):
        if phase == "indexed":
            for definition in copy_indexes:
                raw.execute(definition.replace(f" ON public.{TABLE} ", f" ON public.{COPY} ")
                            .replace("INDEX durable_jobs_", "INDEX bench_copy_"))
            raw.commit()
            steps["job row, copy table, every index, UUIDv4"] = copy_v4
            steps["job row, copy table, every index, UUIDv7"] = copy_v7
        for _ in range(rounds):
            for name, step in steps.items():
                if step is None:
                    continue
                if phase == "indexed" and "primary key only" in name:
                    continue
                if phase == "pk" and "every index" in name and "copy" in name:
                    continue
                step()  # warm
                samples[name].append(_time(n, step))
    raw.execute(f"DROP TABLE IF EXISTS {COPY}, bench_floor")
    raw.commit()
    raw.close()
    with connection.cursor() as cursor:
        cursor.execute("RESET synchronous_commit")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        start()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
    return {"us_per_job": {name: statistics.median(v) for name, v in samples.items() if v},
            "n": n, "rounds": rounds, "cprofile": text.getvalue(), "indexes": len(copy_indexes) + 1}


def _uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7 layout) for the what-if step only."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(uuid.uuid4().bytes[6:], "big") & ((1 << 74) - 1)
    value = (ms << 80) | (0x7 << 76) | ((rand >> 62) << 64) | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return uuid.UUID(int=value)


def render(result: dict) -> str:
    header = f"{'step (one transaction per job, 1 client, synchronous_commit off)':70}  {'us/job':>8}  {'jobs/s':>8}"
    lines = [header]
    for name, us in result["us_per_job"].items():
        lines.append(f"{name:70}  {us:8.0f}  {1e6 / us:8,.0f}")
    return "\n".join(lines)
