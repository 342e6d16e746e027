"""A PgBouncer in transaction mode, started by a test (or the benchmark) in front of a server.

Debian's ``pgbouncer`` (``apt-get install pgbouncer``; ``.ci/run`` installs it). Its ini
and userlist live in a directory of its own (a test's ``tmp_path``); it listens on a free
TCP port of 127.0.0.1, logs to ``pgbouncer.log`` there (its stderr, written by us) and is
stopped by its process id. Started as root, it drops to the ``postgres`` system user
(PgBouncer refuses to run as root) after reading its files, or, for a server on a unix
socket (the embedded one), to the owner of the socket's directory, who may open it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

EXECUTABLE = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PgBouncer:
    """``PgBouncer(server_url, directory).start()``; ``url`` reaches the same database
    through it."""

    def __init__(self, server_url: str, directory: Path, *, pool_size: int = 20) -> None:
        self.server = conninfo_to_dict(server_url)
        self.directory = Path(directory)
        self.pool_size = pool_size
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.log_path = self.directory / "pgbouncer.log"

    @property
    def url(self) -> str:
        user = quote(self.server.get("user") or "postgres")
        return f"postgresql://{user}@127.0.0.1:{self.port}/{quote(self.server['dbname'])}"

    def start(self) -> PgBouncer:
        self.directory.mkdir(parents=True, exist_ok=True)
        host = self.server.get("host") or "127.0.0.1"
        port = self.server.get("port") or "5432"
        user = self.server.get("user") or "postgres"
        (self.directory / "userlist.txt").write_text(f'"{user}" ""\n')
        (self.directory / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.directory / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            "max_client_conn = 1000\n"
            f"default_pool_size = {self.pool_size}\n"
        )
        command = [EXECUTABLE]
        if os.geteuid() == 0:
            command += ["-u", _account_for(host)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*command, str(self.directory / "pgbouncer.ini")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + 15
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return self
            except psycopg.OperationalError as error:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = self.log_path.read_text() if self.log_path.exists() else ""
                    self.stop()
                    raise RuntimeError(
                        f"pgbouncer did not start (exit {self.process.poll()}): {log[-2000:]}"
                    ) from error
                time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)  # PgBouncer: SIGINT is a safe shutdown
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _account_for(host: str) -> str:
    """The system user a root-started PgBouncer drops to: one allowed to reach ``host``."""
    if host.startswith("/"):
        import pwd

        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    return "postgres"
