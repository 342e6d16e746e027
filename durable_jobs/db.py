"""The database seam: connection health, and every use of a library's private internals.

Everything here is about the connection, not about jobs: no statement of this module
writes a row. It exists so that four kinds of knowledge live in one place:

* **Connection health.** Telling a lost connection from a failed statement
  (``is_connection_loss``), leaving a handler's broken transaction before bookkeeping
  (``leave_broken_transaction``), and dropping a connection a handler left broken
  between slices (``keep_connection_healthy``). The worker, the executor and the handler
  process all use the same three rules.
* **psycopg's C timestamp loader** (``read_timestamps_in_c``): a private module of
  psycopg, used only where it gives exactly what Django's loader would.
* **Django's server-binding cursor** (``start_cursor``): built by hand, because Django
  builds one only when ``OPTIONS["server_side_binding"]`` is set for the whole connection.
  Measured (docs/performance.rst): where the connection prepares statements, ``start()``
  in autocommit ran 1.68x faster with it; the worker's path does not use it.
* **Statements prepared in the server session** (``SessionStatement``): where the
  connection prepares nothing itself (Django's default), a statement an application
  repeats in autocommit is ``PREPARE``d by a name that its text decides, so a pooler's
  shared server session can only ever hold the same statement under that name.

Each private use has a test in ``tests/integration/test_database_seam.py`` that fails
loudly (not silently slower) when a library upgrade removes or changes what it relies on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

import psycopg
from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, connections, transaction
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

try:
    from django.db.backends.postgresql.base import ServerBindingCursor
except ImportError:  # psycopg2: no server-side binding, so nothing is prepared
    ServerBindingCursor = None  # type: ignore[assignment,misc]

try:
    # psycopg's C implementation (psycopg[binary] or [c]); absent in pure-Python installs.
    from psycopg._cmodule import _psycopg as _psycopg_c

    C_TIMESTAMPTZ_LOADER: Any = _psycopg_c.TimestamptzLoader
except (ImportError, AttributeError):
    C_TIMESTAMPTZ_LOADER = None

from durable_jobs.models import Job

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import CursorWrapper

T = TypeVar("T")

__all__ = [
    "C_TIMESTAMPTZ_LOADER",
    "NOT_RUN",
    "ServerBindingCursor",
    "SessionStatement",
    "connection_usable",
    "dump_json",
    "is_connection_loss",
    "keep_connection_healthy",
    "leave_broken_transaction",
    "read_timestamps_in_c",
    "reset_connection",
    "retry_after_a_cut",
    "sqlstate",
    "start_cursor",
]


# ---------------------------------------------------------------------------------------
# Connection health
# ---------------------------------------------------------------------------------------

#: The server ended the session (admin shutdown, crash shutdown, cannot connect now).
_SESSION_ENDED = frozenset({"57P01", "57P02", "57P03"})


def is_connection_loss(error: BaseException) -> bool:
    """Return True when ``error`` says the database connection itself was lost, not a statement.

    Read from the error, not from the connection afterwards: by the time a handler's
    exception reaches us, Django's ``atomic()`` may already have replaced the broken
    connection with a fresh one. A deadlock, a serialization failure, a lock or
    statement timeout leave the session alive: those are the work's own (transient)
    failures.
    """
    original = error.__cause__ if isinstance(error.__cause__, psycopg.Error) else error
    if isinstance(error, InterfaceError) or isinstance(original, psycopg.InterfaceError):
        return True
    if not isinstance(original, psycopg.OperationalError):
        return False
    state = getattr(original, "sqlstate", None)
    return state is None or state.startswith("08") or state in _SESSION_ENDED


def connection_usable(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Return True when ``using`` has an open connection that answers."""
    connection = connections[using]
    try:
        return connection.connection is not None and connection.is_usable()
    except Exception:  # noqa: BLE001 - asking a dead connection may itself fail
        return False


def reset_connection(using: str = DEFAULT_DB_ALIAS) -> None:
    """Close ``using`` so the next statement reconnects (never inside the caller's atomic block)."""
    connection = connections[using]
    try:
        if connection.in_atomic_block:
            return
        connection.close()
    except Exception:  # noqa: BLE001 - closing a dead connection may itself fail
        connection.connection = None


def retry_after_a_cut(using: str, statement: Callable[[], T]) -> T:
    """Run ``statement``; when the connection was cut under it, reconnect and run it once more.

    A cut connection (``pg_terminate_backend``, a pooler or a proxy closing an idle
    session) is an event of one connection, not an outage: the next connect usually
    works at once, so a loop should not wait out its backoff (or log an outage) for it.
    Only for statements that may run twice (reads, renewals, fenced writes whose second
    run finds its first one landed); a second failure, or any other error, propagates.
    """
    try:
        return statement()
    except Exception as error:
        if not is_connection_loss(error):
            raise
        reset_connection(using)
    return statement()


def leave_broken_transaction(using: str = DEFAULT_DB_ALIAS) -> None:
    """Make sure no half-finished transaction of the handler's leaks into bookkeeping."""
    connection = connections[using]
    if connection.in_atomic_block:
        return  # the caller's own transaction (testing helpers inside a test case)
    try:
        if connection.connection is not None and not connection.get_autocommit():
            connection.rollback()
    except Exception:  # noqa: BLE001
        reset_connection(using)


def keep_connection_healthy(using: str = DEFAULT_DB_ALIAS) -> None:
    """Drop the slot's connection if a handler left it broken; otherwise keep it.

    Not ``close_old_connections()``: under the default ``CONN_MAX_AGE = 0`` that closes
    the connection on every call, and a worker polling in a loop would reconnect for
    every dequeue. A worker's connections live as long as the process; a connection the
    server or a pooler cuts is replaced on the next error.
    """
    connection = connections[using]
    if connection.connection is None:
        return
    if connection.get_autocommit() != connection.settings_dict["AUTOCOMMIT"]:
        connection.close()  # a handler left a transaction open: do not take chances
    elif connection.errors_occurred:
        if connection.is_usable():
            connection.errors_occurred = False
        else:
            connection.close()


# ---------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------


def dump_json(value: Any) -> str | None:
    """Serialise a payload for a jsonb parameter (None stays SQL NULL)."""
    if value is None:
        return None
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


# ---------------------------------------------------------------------------------------
# Rows in, Job objects out: the plumbing every raw statement on the job table shares
# ---------------------------------------------------------------------------------------

JOB_FIELDS = tuple(Job._meta.concrete_fields)
_FIELD_NAMES = tuple(f.attname for f in JOB_FIELDS)
_JSON_POSITIONS = tuple(i for i, f in enumerate(JOB_FIELDS) if f.get_internal_type() == "JSONField")
#: Selected by every statement that returns a job row, so the mapper always sees every column.
#: The column of each of JOB_FIELDS, in order. (A concrete field's column is set once its
#: model class is built; the stubs declare ``Field.column`` as ``str | None``.)
JOB_COLUMN_NAMES = tuple(cast(str, f.column) for f in JOB_FIELDS)
JOB_COLUMNS = ", ".join(JOB_COLUMN_NAMES)


def job_from_row(row: Sequence[Any], using: str = DEFAULT_DB_ALIAS) -> Job:
    """Build the ``Job`` a row of ``JOB_COLUMNS`` stands for (raw cursors give jsonb as text)."""
    values = list(row)
    for position in _JSON_POSITIONS:
        if isinstance(values[position], str):
            values[position] = json.loads(values[position])
    return build_job(values, using)


def build_job(values: Sequence[Any], using: str) -> Job:
    """The ``Job`` ``Job.from_db`` would build from every concrete field's value, in
    ``JOB_COLUMNS`` order, without running ``Model.__init__``.

    A claim builds one per row and the handler process one per slice: the constructor's
    per-field ``setattr`` and its two model signals cost twice the rest of it (4 against
    12 us a row here; issue #27 item 2). The instance is the same as long as nothing
    listens to ``pre_init`` or ``post_init`` for ``Job`` (the library does not; a project
    that does gets ``from_db``) and no field of it is a data descriptor (none is).
    """
    # ``receivers`` first: empty unless somebody connected to either signal at all, and
    # reading it costs a tenth of the two ``has_listeners`` calls.
    if (pre_init.receivers or post_init.receivers) and (
        pre_init.has_listeners(Job) or post_init.has_listeners(Job)
    ):
        return Job.from_db(using, _FIELD_NAMES, values)
    job = Job.__new__(Job)
    job.__dict__.update(zip(_FIELD_NAMES, values, strict=True))
    state = ModelState()
    state.adding = False
    state.db = using
    job._state = state
    return job


#: One lexical piece of a statement: a string literal (quotes doubled inside), a quoted
#: identifier, a line comment, a block comment, a run of blanks, or anything else.
_SQL_PIECE = re.compile(
    r"""(?P<text>'(?:[^']|'')*'|"(?:[^"]|"")*")"""
    r"|(?P<comment>--[^\n]*|/\*.*?\*/)"
    r"|(?P<blank>\s+)"
    r"""|(?P<other>[^'"\s/-]+|.)""",
    re.DOTALL,
)


def compact_sql(sql: str) -> str:
    """``sql`` without its comments and with each run of blanks made one space; literals
    and quoted identifiers are left as they are.

    psycopg remembers how it split a statement into text and parameters only for
    statements of up to 4,096 characters, and splits a longer one again on every
    execution: the claim, commented for its readers, was 4,645 characters and spent
    43 us a claim there (issue #27). The statements a slot runs per job are compacted
    once, where they are defined; their source keeps its comments.
    """
    pieces: list[str] = []
    for match in _SQL_PIECE.finditer(sql):
        if match.lastgroup in ("comment", "blank"):
            if pieces and pieces[-1] != " ":
                pieces.append(" ")
        else:
            pieces.append(match.group())
    return "".join(pieces).strip()


def array_literal(values: Iterable[Any]) -> str:
    """``values`` as one PostgreSQL array literal (``{"a","b"}``), for a parameter the
    statement casts to an array (``%(kinds)s::text[]``).

    Django's cursor binds parameters on the client, and psycopg quotes a list parameter
    element by element on every execution, once per place the statement names it. The
    claim names a worker's kinds twice: with 24 kinds that was 117 of the 178 us it took
    to bind a claim (issue #27). A worker's kinds and queues are the same on every claim,
    so their literal is built once (cached) and bound as one string. Elements are
    written with ``str()``: text, numbers and timestamps (ISO form) read back exactly.
    """
    return _array_literal(tuple(str(value) for value in values))


def array_text(values: Iterable[str]) -> str:
    """``values`` as one PostgreSQL array literal, built afresh: for values that differ on
    every execution (a batch's ids), which ``array_literal``'s cache would only churn."""
    quoted = (value.replace("\\", "\\\\").replace('"', '\\"') for value in values)
    return "{" + ",".join(f'"{value}"' for value in quoted) + "}"


@functools.lru_cache(maxsize=256)
def _array_literal(values: tuple[str, ...]) -> str:
    return array_text(values)


def execute(using: str, sql: str, params: dict[str, Any] | Sequence[Any]) -> CursorWrapper:
    """Run ``sql`` on ``using``'s connection and return the open cursor (close it: ``with``)."""
    cursor = connections[using].cursor()
    cursor.execute(sql, params)
    return cursor


def fetch_job(using: str, sql: str, params: dict[str, Any]) -> Job | None:
    """Run a statement returning at most one job row; None when it matched nothing."""
    with execute(using, sql, params) as cursor:
        row = cursor.fetchone()
    return job_from_row(row, using) if row is not None else None


def _fetch_job_rows(
    using: str, sql: str, params: dict[str, Any], *, server_bound: bool = False
) -> list[tuple[Any, ...]]:
    """Run a statement returning job rows (timestamps read by the C loader where it may);
    ``server_bound``: through ``start_cursor``, prepared where the connection prepares."""
    with start_cursor(using) if server_bound else connections[using].cursor() as cursor:
        read_timestamps_in_c(cursor, using)
        cursor.execute(sql, params)
        return cursor.fetchall()


def fetch_jobs(using: str, sql: str, params: dict[str, Any]) -> list[Job]:
    """Run a statement returning job rows."""
    return [job_from_row(row, using) for row in _fetch_job_rows(using, sql, params)]


def fetch_jobs_with(
    using: str, sql: str, params: dict[str, Any], *, server_bound: bool = False
) -> list[tuple[Job, Any]]:
    """``fetch_jobs`` for a statement whose rows carry one column after the job's; each
    job with that value. ``server_bound``: see ``_fetch_job_rows`` (the statement must
    cast every parameter whose type PostgreSQL cannot infer)."""
    rows = _fetch_job_rows(using, sql, params, server_bound=server_bound)
    return [(job_from_row(row[:-1], using), row[-1]) for row in rows]


def fetch_value(using: str, sql: str, params: dict[str, Any] | Sequence[Any]) -> Any:
    """Run a statement and return its first row's first value (None for no row)."""
    with execute(using, sql, params) as cursor:
        row = cursor.fetchone()
    return None if row is None else row[0]


# ---------------------------------------------------------------------------------------
# Library internals, each with its reason
# ---------------------------------------------------------------------------------------


def read_timestamps_in_c(cursor: CursorWrapper, using: str = DEFAULT_DB_ALIAS) -> None:
    """Have ``cursor`` read timestamptz with psycopg's C loader where it gives what Django's would.

    Django registers on each connection a Python subclass of psycopg's pure-Python
    timestamptz loader (to set ``tzinfo`` to the connection's zone): about 2.6 µs a value
    here, against 0.15 µs for the C loader, and a claimed batch of 32 rows carries some
    200 of them, read on the worker's one GIL. With the session's TimeZone UTC and Django's
    zone UTC (``USE_TZ``, no database ``TIME_ZONE``: what Django sets up by default) the C
    loader returns the very same values, ``datetime.timezone.utc`` included; in any other
    set-up Django's loader stays. Measured (docs/performance.rst, the mechanism trial): a
    32-row claimed batch costs the worker 610 µs of CPU with it against 2,155 µs without,
    48 µs a job, about 4 % of a 1 ms job's worker CPU.
    """
    connection = connections[using]
    raw = connection.connection
    if (
        C_TIMESTAMPTZ_LOADER is None
        or raw is None
        or connection.timezone_name != "UTC"
        or raw.info.parameter_status("TimeZone") not in (b"UTC", "UTC")
    ):
        return
    psycopg_cursor = getattr(cursor, "cursor", None)
    if psycopg_cursor is not None and hasattr(psycopg_cursor, "adapters"):
        psycopg_cursor.adapters.register_loader("timestamptz", C_TIMESTAMPTZ_LOADER)


#: A SessionStatement's answer when it did not run: the caller runs its statement as usual.
NOT_RUN: Any = object()


class SessionStatement:
    """A statement ``PREPARE``d in the server session by SQL, run by ``EXECUTE`` in autocommit.

    Django's default cursor binds on the client and prepares nothing, so the server
    parses, analyses and plans every statement again. For the start's insert that is
    about as much server time as the rest of the start (a 70-column row whose defaults
    the rewriter fills in, 26 indexes: the start profile, docs/performance.rst); pgqueuer
    prepares its enqueue. psycopg's own prepared statements are left to the connection's
    ``prepare_threshold`` because their names (``_pg3_0``, ...) are per client: behind a
    transaction-mode pooler a client can execute another client's statement of the same
    name. Here the name is derived from the statement's text, so whichever server session
    holds it holds this statement.

    ``fetchone`` runs it only where nothing is lost if the server session does not hold
    it: in autocommit (a failed ``EXECUTE`` aborts no caller's transaction), on a
    connection that binds on the client and does not prepare by itself. A connection
    prepares it at its ``after``-th run (a request's connection that starts one job pays
    no extra round trip); a server session that loses it afterwards (a transaction-mode
    pooler handing the next statement to another session, a ``DISCARD ALL``) turns it off
    for the rest of that connection's life, and that run falls back to the plain statement.
    """

    _GIVEN_UP = -1

    def __init__(self, prefix: str, sql: str, *, after: int = 3) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        positional = re.sub(r"%\((\w+)\)s", number, sql).strip()
        self.name = f"{prefix}_{hashlib.sha256(positional.encode()).hexdigest()[:16]}"
        self.prepare_sql = f"PREPARE {self.name} AS {positional}"
        self.execute_sql = f"EXECUTE {self.name} ({', '.join(f'%({n})s' for n in names)})"
        self.after = after
        # Per connection (the driver's, so a reconnect starts afresh): runs seen before
        # it was prepared, ``after`` once prepared, or _GIVEN_UP.
        self._runs: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def fetchone(self, params: dict[str, Any], using: str = DEFAULT_DB_ALIAS) -> Any:
        """The statement's first row, or ``NOT_RUN`` when the caller should run it itself."""
        connection = connections[using]
        # get_autocommit() connects first, so connection.connection is set below.
        if connection.in_atomic_block or not connection.get_autocommit():
            return NOT_RUN
        raw = connection.connection
        if (
            getattr(raw, "prepare_threshold", None) is not None
            or connection.settings_dict["OPTIONS"].get("server_side_binding") is True
        ):
            return NOT_RUN  # the driver prepares (start_cursor), or EXECUTE cannot bind
        with self._lock:
            runs = self._runs.get(raw, 0)
            if runs == self._GIVEN_UP or runs < self.after - 1:
                if runs != self._GIVEN_UP:
                    self._runs[raw] = runs + 1
                return NOT_RUN
            self._runs[raw] = self.after
        cursor = _kept_cursor(using)
        if runs < self.after:
            try:
                cursor.execute(self.prepare_sql)
            except DatabaseError as error:
                # Another client prepared it in this server session (a pooler's):
                # the same text under the same name.
                if sqlstate(error) != "42P05":
                    raise
        try:
            cursor.execute(self.execute_sql, params)
        except DatabaseError as error:
            # 26000: the server session changed under the connection. 0A000: a
            # migration changed a returned column's type ("cached plan must not
            # change result type"). Either way, nothing ran: the plain statement does.
            if sqlstate(error) not in ("26000", "0A000"):
                raise
            with self._lock:
                self._runs[raw] = self._GIVEN_UP
            return NOT_RUN
        return cursor.fetchone()


#: Per thread, per database alias: the driver cursor ``SessionStatement`` runs its
#: ``EXECUTE`` on, kept from one run to the next (a Django connection is per thread).
_KEPT = threading.local()


def _kept_cursor(using: str) -> CursorWrapper:
    """Django's cursor over a driver cursor kept for the life of its connection.

    The steps are those of ``connection.cursor()`` (health check, connect, thread check,
    error wrapping, the debug cursor when queries are logged, so that execute wrappers,
    ``assertNumQueries`` and tools that patch Django's cursor see the statement) save
    one: the driver's cursor is made once per connection, not once per statement. For a
    start in autocommit that making, and closing, was about a sixth of the client's CPU
    (30 of 170 us; docs/performance.rst). A cursor of a connection since replaced is
    made afresh; it holds the old connection only until then.
    """
    connection = connections[using]
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    kept: dict[str, Any] = _KEPT.__dict__
    cursor: Any = kept.get(using)
    made = cursor is None or cursor.closed or cursor.connection is not connection.connection
    if made:
        with connection.wrap_database_errors:
            cursor = kept[using] = connection.create_cursor()
    wrapped = _wrapped(connection, cursor)
    if made:
        read_timestamps_in_c(wrapped, using)  # once per cursor, where it gives the same values
    return wrapped


#: SQLSTATE of a lock wait that ran past ``lock_timeout``.
LOCK_NOT_AVAILABLE = "55P03"


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a database error, as Django raises it (the driver's is its cause)."""
    return getattr(error.__cause__, "sqlstate", None) or getattr(error, "sqlstate", None)


def start_cursor(using: str = DEFAULT_DB_ALIAS) -> CursorWrapper:
    """Return Django's cursor, or where the connection prepares statements one binding server-side.

    psycopg prepares a statement it has run ``prepare_threshold`` times on a connection,
    but only one bound server-side, and Django's default cursor binds on the client. The
    start's insert is the statement an application repeats most; prepared, the server
    neither parses nor plans it again (the start profile: about half the server's time per
    start). Django leaves ``prepare_threshold`` off unless ``OPTIONS`` sets it, because a
    transaction-mode pooler without prepared-statement support (PgBouncer before 1.21)
    hands the next transaction a server connection that never saw the statement: so the
    connection's own setting decides, and with Django's default nothing is prepared.

    The steps are those of Django's ``BaseDatabaseWrapper._cursor()`` and ``cursor()``
    with the cursor class swapped: health check, connect, thread check, error wrapping,
    and the debug cursor when queries are logged.
    """
    connection = connections[using]
    raw = connection.connection
    if (
        ServerBindingCursor is None
        or raw is None
        or getattr(raw, "prepare_threshold", None) is None
        or connection.settings_dict["OPTIONS"].get("server_side_binding") is True
    ):
        return connection.cursor()  # a server-binding Django cursor prepares by itself
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        # django-stubs declare ServerBindingCursor without psycopg.Cursor, its other base
        # (which takes the connection).
        cursor = ServerBindingCursor(connection.connection)  # type: ignore[call-arg]
    return _wrapped(connection, cursor)


def _wrapped(connection: BaseDatabaseWrapper, cursor: Any) -> CursorWrapper:
    """``cursor`` (the driver's) in Django's cursor, as ``connection.cursor()`` wraps its
    own: the thread check, then the debug cursor when queries are logged, so that
    ``connection.queries``, ``assertNumQueries`` and execute wrappers see its statements."""
    connection.validate_thread_sharing()
    # django-stubs declare make_cursor()/make_debug_cursor() as taking a CursorWrapper,
    # where Django passes them the DB-API cursor they wrap (``Any`` here says so).
    return (
        connection.make_debug_cursor(cursor)
        if connection.queries_logged
        else connection.make_cursor(cursor)
    )


# ---------------------------------------------------------------------------------------
# Session settings, the clock and LISTEN/NOTIFY: statements about the connection, not a row
# ---------------------------------------------------------------------------------------

SET_LOCAL_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %(ms)s, true)"


def with_lock_timeout(
    lock_timeout_ms: int, write: Callable[[], T], *, using: str = DEFAULT_DB_ALIAS
) -> T:
    """Run ``write()`` in a transaction whose row-lock waits give up after ``lock_timeout_ms``.

    For writers that must never queue behind a slice's own fenced transaction or a slow
    mirror: a timeout raises ``OperationalError`` and the caller tries again later.
    """
    with transaction.atomic(using=using):
        fetch_value(using, SET_LOCAL_LOCK_TIMEOUT, {"ms": f"{int(lock_timeout_ms)}ms"})
        return write()


# A worker stopped (SIGSTOP, a debugger, swap) inside a fenced transaction holds the
# job's row lock, and SKIP LOCKED reconcilers would skip the job forever. PostgreSQL
# ends such a session after this timeout, releasing the lock; the worker's late COMMIT
# then fails and lands nothing.
SET_LOCAL_IDLE_TIMEOUT = "SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, true)"

# A handler process killed in the middle of a statement (a lock wait, a long query inside
# fenced()) leaves its backend running that statement, row locks held, until the server
# next talks to the client. With this setting the server checks the client socket while
# it runs a query and ends the session once the client is gone (PostgreSQL 14+).
SET_CLIENT_CONNECTION_CHECK = "SELECT set_config('client_connection_check_interval', %(ms)s, false)"


def check_client_connection(ms: int, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Have the server notice within ``ms`` that this session's client died mid-query."""
    fetch_value(using, SET_CLIENT_CONNECTION_CHECK, {"ms": f"{int(ms)}ms"})


def limit_idle_in_transaction(ms: int, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Bound how long the current transaction may sit idle before the server ends it."""
    fetch_value(using, SET_LOCAL_IDLE_TIMEOUT, {"ms": f"{int(ms)}ms"})


def database_now(*, using: str = DEFAULT_DB_ALIAS) -> datetime:
    """Return the database's clock: the only clock a decision may use."""
    return fetch_value(using, "SELECT clock_timestamp()", {})


def listen(raw_connection: Any, channel: str) -> None:
    """Subscribe a raw autocommit psycopg connection to the wake-up channel."""
    from psycopg import sql

    raw_connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


NOTIFY_PROBE = "SELECT pg_notify(%(channel)s, %(payload)s)"


def notify_probe(raw_connection: Any, channel: str, payload: str) -> None:
    """Send a probe NOTIFY on a raw autocommit connection: it must come back to the listener."""
    raw_connection.execute(NOTIFY_PROBE, {"channel": channel, "payload": payload})
