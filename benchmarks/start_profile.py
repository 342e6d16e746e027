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
* the real table: + the NOTIFY as a second statement, then the start's own statement
  (``INSERT_NEW_JOB_AND_NOTIFY``: the server-decided columns back, the NOTIFY inside);
* the leads for the wire: that statement in autocommit with client-side binding (Django's
  default cursor), server-side binding, and a prepared statement; in a transaction with
  BEGIN sent alone (as psycopg does) or pipelined with the statement;
* Django's cursor in autocommit and in ``transaction.atomic()``, and ``durable.start()``
  itself in both (validation, the id, the Job, the signal).

Besides the wall time, every step shows this thread's CPU time and the server process's
(``/proc/<pid>/schedstat``, where the server runs on this machine) per job: on a shared
2-core machine the wall time swings with other people's load, the CPU times much less.
The server's own planning and execution times of one row come from EXPLAIN ANALYZE.

Every step runs with ``synchronous_commit = off`` on its connections: the commit's WAL
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
#: The yardstick of issue #27 item 7: start() in atomic() costs at most 1.3x this.
INSERT_IN_ATOMIC = "Django cursor in atomic(): the same row's bare INSERT (no RETURNING, no NOTIFY)"
START_IN_ATOMIC = "durable.start() in transaction.atomic()"


def _params(new_id) -> dict:
    return {
        "id": new_id,
        "tenant": "default",
        "organization": None,
        "kind": KIND,
        "created_by": None,
        "input": None,
        "meta": None,
        "idempotency_key": None,
        "lock_key": None,
        "subject_type": None,
        "subject_id": None,
        "progress_job_id": None,
        "queue": "default",
        "priority": 0,
        "total_count": None,
        "run_at": None,
        "delay_ms": 0,
        "wait_for": None,
        "wait_key": None,
        "wait_label": None,
        "flow_key": None,
        "channel": "durable_jobs_bench_profile",
    }


def _insert_sql(table: str, returning: bool = False) -> str:
    sql = store.INSERT_JOB.replace(f"INSERT INTO {TABLE}", f"INSERT INTO {table}", 1)
    return sql if returning else sql.split("RETURNING")[0]


def _time(n: int, once) -> float:
    began = time.perf_counter()
    for _ in range(n):
        once()
    return (time.perf_counter() - began) / n * 1e6  # microseconds per job


def _schedstat(pid: int | None) -> int:
    """Nanoseconds a process (or thread) has spent on a CPU; 0 where /proc does not say."""
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return int(stat.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _backend_pid(conn) -> int | None:
    """The server process of ``conn``, if the server runs on this machine (else None)."""
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    if not conn.autocommit:
        conn.commit()
    return pid if _schedstat(pid) else None


def _server_timing(conn, sql: str, params: dict | None, *, reps: int = 30) -> tuple[float, float]:
    """Median (planning, execution) milliseconds of ``sql`` by EXPLAIN ANALYZE, rolled back."""
    plan, execute = [], []
    for _ in range(reps):
        rows = conn.execute("EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON) " + sql, params).fetchall()
        conn.rollback()
        for (line,) in rows:
            if line.startswith("Planning Time:"):
                plan.append(float(line.split()[2]))
            elif line.startswith("Execution Time:"):
                execute.append(float(line.split()[2]))
    return statistics.median(plan), statistics.median(execute)


def breakdown(dburl: str, *, n: int = 300, rounds: int = 5) -> dict:
    """Per job, for each step (median of ``rounds``): wall microseconds, this thread's CPU
    microseconds and the server process's CPU microseconds; the server's own planning and
    execution times of the job row; and the cProfile text."""
    raw = psycopg.connect(dburl, autocommit=False)  # server-side binding (psycopg's default cursor)
    raw.execute("SET synchronous_commit TO off")
    auto = psycopg.connect(dburl, autocommit=True)
    auto.execute("SET synchronous_commit TO off")
    client_auto = psycopg.ClientCursor(auto)  # client-side binding, as Django's cursor sends
    bound_auto = auto.cursor()
    client_raw = psycopg.ClientCursor(raw)
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO off")
        cursor.execute("SELECT pg_backend_pid()")
        django_pid = cursor.fetchone()[0]
    django_pid = django_pid if _schedstat(django_pid) else None
    raw.execute(f"DROP TABLE IF EXISTS {COPY}, bench_floor")
    raw.execute("CREATE TABLE bench_floor (id bigserial PRIMARY KEY, at timestamptz)")
    raw.execute(f"CREATE TABLE {COPY} (LIKE {TABLE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    raw.execute(f"ALTER TABLE {COPY} ADD PRIMARY KEY (id)")
    raw.commit()
    copy_indexes = [
        row[0]
        for row in raw.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexname NOT LIKE %s",
            [TABLE, "%pkey"],
        ).fetchall()
    ]
    raw.commit()
    # The indexes a plain start (no keys, no subject, no wait) adds an entry to: the full
    # ones and the partial ones whose predicate a new pending row meets.
    touched = raw.execute(
        "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relname = %s"
        " AND (i.indpred IS NULL OR pg_get_expr(i.indpred, i.indrelid) !~ 'IS NOT NULL'"
        "      OR pg_get_expr(i.indpred, i.indrelid) ~ 'next_run_at IS NOT NULL')",
        [TABLE],
    ).fetchone()[0]
    raw.commit()
    insert_copy = _insert_sql(COPY)
    insert_real = _insert_sql(TABLE)
    notify_sql = store.NOTIFY
    pids = {"raw": _backend_pid(raw), "auto": _backend_pid(auto), "django": django_pid}

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
        raw.execute(store.INSERT_NEW_JOB_AND_NOTIFY, _params(_uuid7())).fetchone()
        raw.commit()

    def autocommit_client():
        client_auto.execute(store.INSERT_NEW_JOB_AND_NOTIFY, _params(_uuid7()))
        client_auto.fetchone()

    def autocommit_bound():
        bound_auto.execute(store.INSERT_NEW_JOB_AND_NOTIFY, _params(_uuid7()), prepare=False)
        bound_auto.fetchone()

    def autocommit_prepared():
        bound_auto.execute(store.INSERT_NEW_JOB_AND_NOTIFY, _params(_uuid7()), prepare=True)
        bound_auto.fetchone()

    def begin_alone():  # as psycopg does in a transaction: BEGIN, then the statement, then COMMIT
        client_raw.execute(store.INSERT_NEW_JOB_AND_NOTIFY, _params(_uuid7()))
        client_raw.fetchone()
        raw.commit()

    def begin_pipelined():  # BEGIN travels with the statement: one round trip fewer
        with raw.pipeline():
            client_raw.execute(store.INSERT_NEW_JOB_AND_NOTIFY, _params(_uuid7()))
        client_raw.fetchone()
        raw.commit()

    def django_autocommit():
        with connection.cursor() as cur:
            cur.execute(store.INSERT_NEW_JOB_AND_NOTIFY, _params(_uuid7()))
            cur.fetchone()

    def django_cursor():
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(store.INSERT_NEW_JOB_AND_NOTIFY, _params(_uuid7()))
            cur.fetchone()

    def django_insert():  # issue #27's yardstick: the same row, a bare INSERT, in atomic()
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(insert_real, _params(uuid.uuid4()))

    def start_autocommit():
        durable.start(KIND)

    def start():
        with transaction.atomic():
            durable.start(KIND)

    steps = {
        "floor: 1-row INSERT + COMMIT (bigserial key)": (floor, "raw"),
        "job row, copy table, primary key only, UUIDv4": (copy_v4, "raw"),
        "job row, copy table, primary key only, UUIDv7": (copy_v7, "raw"),
        "job row, copy table, every index, UUIDv4": (None, "raw"),  # filled once the indexes exist
        "job row, copy table, every index, UUIDv7": (None, "raw"),
        "job row, real table (every index), UUIDv4": (real_plain, "raw"),
        "  + NOTIFY (second statement)": (real_notify, "raw"),
        "  + the start's RETURNING and NOTIFY in one statement, UUIDv7": (real_returning, "raw"),
        "autocommit: client-side binding (Django's default)": (autocommit_client, "auto"),
        "autocommit: server-side binding, unnamed statement": (autocommit_bound, "auto"),
        "autocommit: server-side binding, prepared statement": (autocommit_prepared, "auto"),
        "transaction: BEGIN alone, statement, COMMIT (3 round trips)": (begin_alone, "raw"),
        "transaction: BEGIN pipelined with the statement, COMMIT (2)": (begin_pipelined, "raw"),
        "Django cursor, autocommit": (django_autocommit, "django"),
        "Django cursor in transaction.atomic()": (django_cursor, "django"),
        INSERT_IN_ATOMIC: (django_insert, "django"),
        "durable.start(), autocommit": (start_autocommit, "django"),
        START_IN_ATOMIC: (start, "django"),
    }
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in steps}
    for phase in ("pk", "indexed"):
        if phase == "indexed":
            for definition in copy_indexes:
                raw.execute(_copy_index(definition))
            raw.commit()
            steps["job row, copy table, every index, UUIDv4"] = (copy_v4, "raw")
            steps["job row, copy table, every index, UUIDv7"] = (copy_v7, "raw")
        for _ in range(rounds):
            for name, (step, conn) in steps.items():
                if step is None:
                    continue
                if phase == "indexed" and "primary key only" in name:
                    continue
                if phase == "pk" and "every index" in name and "copy" in name:
                    continue
                step()  # warm
                server0, client0 = _schedstat(pids[conn]), time.thread_time_ns()
                wall = _time(n, step)
                samples[name].append(
                    (
                        wall,
                        (time.thread_time_ns() - client0) / n / 1e3,
                        (_schedstat(pids[conn]) - server0) / n / 1e3
                        if pids[conn]
                        else float("nan"),
                    )
                )
    # The server's own view of the row: planning and execution (index maintenance included).
    timings = {
        "floor row": _server_timing(raw, "INSERT INTO bench_floor (at) VALUES (now())", None),
        "job row, copy table, every index": _server_timing(raw, insert_copy, _params(_uuid7())),
        "job row, real table": _server_timing(raw, insert_real, _params(_uuid7())),
    }
    index_costs = _index_costs(raw, copy_indexes, insert_copy, pids["raw"], n=n, rounds=rounds)
    raw.execute(f"TRUNCATE {COPY}")
    raw.execute(f"ALTER TABLE {COPY} DROP CONSTRAINT {COPY}_pkey")
    for name in [
        row[0]
        for row in raw.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = %s", [COPY]
        ).fetchall()
    ]:
        raw.execute(f"DROP INDEX {name}")
    raw.commit()
    timings["job row, copy table, no index at all"] = _server_timing(
        raw, insert_copy, _params(_uuid7())
    )
    raw.execute(f"DROP TABLE IF EXISTS {COPY}, bench_floor")
    raw.commit()
    raw.close()
    auto.close()
    with connection.cursor() as cursor:
        cursor.execute("RESET synchronous_commit")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        start()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
    return {
        "us_per_job": {
            name: statistics.median(s[0] for s in v) for name, v in samples.items() if v
        },
        "client_cpu_us": {
            name: statistics.median(s[1] for s in v) for name, v in samples.items() if v
        },
        "server_cpu_us": {
            name: statistics.median(s[2] for s in v) for name, v in samples.items() if v
        },
        "server_ms": timings,
        "n": n,
        "rounds": rounds,
        "cprofile": text.getvalue(),
        "indexes": len(copy_indexes) + 1,
        "indexes_touched": touched,
        "index_costs": index_costs,
    }


def _copy_index(definition: str) -> str:
    return definition.replace(f" ON public.{TABLE} ", f" ON public.{COPY} ").replace(
        "INDEX durable_jobs_", "INDEX bench_copy_"
    )


def _index_costs(
    raw, definitions: list[str], insert_copy: str, pid: int | None, *, n: int, rounds: int
) -> dict[str, dict[str, float]]:
    """What each index of the job table costs a plain start, alone beside the primary key.

    The copy table keeps its primary key and gets one index at a time; ``n`` single-row
    insert transactions are timed with it (wall and server CPU per row) and, in the same
    round, without it; the median difference over ``rounds`` is that index's cost. An index
    whose partial predicate a new pending row does not meet costs only the predicate's test.
    """
    for name in [
        row[0]
        for row in raw.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexname NOT LIKE %s",
            [COPY, "%pkey"],
        ).fetchall()
    ]:
        raw.execute(f"DROP INDEX {name}")
    raw.commit()

    def measure() -> tuple[float, float]:
        def insert() -> None:
            raw.execute(insert_copy, _params(uuid.uuid4()))
            raw.commit()

        insert()
        server0 = _schedstat(pid)
        wall = _time(n, insert)
        return wall, (_schedstat(pid) - server0) / n / 1e3 if pid else float("nan")

    deltas: dict[str, list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for definition in definitions:
            name = definition.split(" INDEX ", 1)[1].split(" ON ", 1)[0]
            base_wall, base_server = measure()
            raw.execute(_copy_index(definition))
            raw.commit()
            wall, server = measure()
            raw.execute(f"DROP INDEX {name.replace('durable_jobs_', 'bench_copy_')}")
            raw.execute(f"TRUNCATE {COPY}")  # every index measured against a table of equal size
            raw.commit()
            deltas.setdefault(name, []).append((wall - base_wall, server - base_server))
    return {
        name: {
            "wall_us": statistics.median(d[0] for d in values),
            "server_cpu_us": statistics.median(d[1] for d in values),
        }
        for name, values in deltas.items()
    }


def _uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7 layout) for the what-if step only."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(uuid.uuid4().bytes[6:], "big") & ((1 << 74) - 1)
    value = (
        (ms << 80) | (0x7 << 76) | ((rand >> 62) << 64) | (0b10 << 62) | (rand & ((1 << 62) - 1))
    )
    return uuid.UUID(int=value)


def render(result: dict) -> str:
    wall, client, server = result["us_per_job"], result["client_cpu_us"], result["server_cpu_us"]
    header = (
        f"{'step (one transaction per job, 1 client, synchronous_commit off)':66}  {'us/job':>7}  "
        f"{'jobs/s':>7}  {'client CPU':>10}  {'server CPU':>10}"
    )
    lines = [header]
    for name, us in wall.items():
        lines.append(
            f"{name:66}  {us:7.0f}  {1e6 / us:7,.0f}  {client[name]:10.0f}  {server[name]:10.0f}"
        )
    timings = result.get("server_ms") or {}
    if timings:
        lines += [
            "",
            "the server's own times for one row (EXPLAIN ANALYZE, median):",
            f"{'':40}  {'planning us':>11}  {'execution us':>12}",
        ]
        for name, (plan, execute) in timings.items():
            lines.append(f"{name:40}  {plan * 1000:11.0f}  {execute * 1000:12.0f}")
    costs = result.get("index_costs") or {}
    if costs:
        lines += [
            "",
            "each index alone beside the primary key, against none (median of the rounds):",
            f"{'index':44}  {'wall us/start':>13}  {'server CPU us':>13}",
        ]
        for name, cost in sorted(costs.items(), key=lambda item: -item[1]["server_cpu_us"]):
            lines.append(f"{name:44}  {cost['wall_us']:13.1f}  {cost['server_cpu_us']:13.1f}")
    lines += ["", "where the time goes (differences of the steps above, microseconds per job):"]
    lines += [f"  {text}" for text in explain(result)]
    return "\n".join(lines)


def explain(result: dict) -> list[str]:
    """The profile's reading: what each added thing costs, from the measured steps."""
    wall, client, server = result["us_per_job"], result["client_cpu_us"], result["server_cpu_us"]
    timings = result.get("server_ms") or {}

    def d(table: dict, a: str, b: str) -> float:
        return table[a] - table[b]

    out = [
        "the raw psycopg steps down to the start's own statement run prepared (psycopg's default "
        "prepare_threshold, 5), so they show the row, the indexes and the NOTIFY without parse and "
        "plan; "
        "Django's cursor binds on the client and prepares nothing, so its steps pay both on every "
        "start"
    ]
    floor = "floor: 1-row INSERT + COMMIT (bigserial key)"
    pk = "job row, copy table, primary key only, UUIDv7"
    every = "job row, copy table, every index, UUIDv7"
    if pk in wall and floor in wall:
        out.append(
            f"the job row instead of a 1-column row (primary key only): {d(wall, pk, floor):+.0f} "
            f"wall, {d(client, pk, floor):+.0f} client CPU (dumping 22 parameters), "
            f"{d(server, pk, floor):+.0f} server CPU"
        )
    if {"floor row", "job row, copy table, no index at all"} <= timings.keys():
        (fp, fe), (jp, je) = timings["floor row"], timings["job row, copy table, no index at all"]
        out.append(
            f"  of which the server plans the 23-column insert in {jp * 1000:.0f} "
            f"(floor {fp * 1000:.0f}) and executes it in {je * 1000:.0f} (floor {fe * 1000:.0f}); "
            "the rest: binding 22 parameters, the wider row and its WAL"
        )
    if every in wall and pk in wall:
        extra = result.get("indexes_touched", result["indexes"]) - 1
        out.append(
            f"indexes: {result['indexes']} on the table, {extra + 1} take an entry from a plain "
            f"start (the primary key and {extra} more): {d(wall, every, pk):+.0f} wall, "
            f"~{d(wall, every, pk) / max(extra, 1):.0f} each; server CPU "
            f"{d(server, every, pk):+.0f}"
        )
    indexed, bare = "job row, copy table, every index", "job row, copy table, no index at all"
    if {indexed, bare} <= timings.keys():
        out.append(
            f"  the server's execution time with every index vs none: "
            f"{(timings[indexed][1] - timings[bare][1]) * 1000:+.0f}"
        )
    notify = "  + NOTIFY (second statement)"
    plain = "job row, real table (every index), UUIDv4"
    if notify in wall:
        out.append(
            f"NOTIFY as a second statement: {d(wall, notify, plain):+.0f} wall, "
            f"{d(server, notify, plain):+.0f} server CPU (start() sends it inside the insert's "
            "statement)"
        )
    binds = (
        "autocommit: client-side binding (Django's default)",
        "autocommit: server-side binding, unnamed statement",
        "autocommit: server-side binding, prepared statement",
    )
    if all(b in wall for b in binds):
        out.append(
            "binding (one statement, autocommit): "
            + "; ".join(
                f"{b.split(': ')[1]} {wall[b]:.0f} wall / {client[b]:.0f} client / {server[b]:.0f} "
                "server"
                for b in binds
            )
        )
        out.append(
            "  parse, analysis and plan of the unprepared statement: "
            f"{d(server, binds[1], binds[2]):+.0f} "
            f"server CPU, {d(wall, binds[1], binds[2]):+.0f} wall (what "
            "OPTIONS['prepare_threshold'] removes)"
        )
    begin = (
        "transaction: BEGIN alone, statement, COMMIT (3 round trips)",
        "transaction: BEGIN pipelined with the statement, COMMIT (2)",
    )
    if all(b in wall for b in begin):
        out.append(
            "BEGIN pipelined with the insert (one round trip fewer): "
            f"{d(wall, begin[1], begin[0]):+.0f} "
            f"wall, {d(client, begin[1], begin[0]):+.0f} client CPU, "
            f"{d(server, begin[1], begin[0]):+.0f} server CPU"
        )
    dj_auto, dj_atomic = "Django cursor, autocommit", "Django cursor in transaction.atomic()"
    st_auto, st_atomic = "durable.start(), autocommit", "durable.start() in transaction.atomic()"
    if all(k in wall for k in (dj_auto, dj_atomic, st_auto, st_atomic, binds[0])):
        out.append(
            f"Django's cursor over a raw psycopg one: {d(wall, dj_auto, binds[0]):+.0f} wall, "
            f"{d(client, dj_auto, binds[0]):+.0f} client CPU"
        )
        out.append(
            f"transaction.atomic() (BEGIN and COMMIT round trips, savepoint bookkeeping): "
            f"{d(wall, dj_atomic, dj_auto):+.0f} wall, {d(client, dj_atomic, dj_auto):+.0f} client "
            "CPU"
        )
        out.append(
            f"durable.start() over the bare statement (validation, id, the Job, signal, metrics): "
            f"{d(wall, st_auto, dj_auto):+.0f} wall, {d(client, st_auto, dj_auto):+.0f} client CPU"
        )
    return out
