"""The peers durable_jobs is compared with, each in its own virtual environment.

``prepare()`` builds ``benchmarks/.venvs/<peer>`` with the pinned requirements (reused
while the pins are unchanged), then creates the peer's schema in its own database on the
benchmark's server. A peer that cannot be installed or set up is reported with the reason
and skipped; nothing is ever estimated in its place.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import procs

HERE = Path(__file__).resolve().parent
VENVS = HERE.parent / ".venvs"


@dataclass
class PeerSpec:
    key: str
    label: str
    requirements: list[str]
    script: str
    database: str
    setup_command: list[str]
    dists: list[str]  # distributions whose versions go into the results


SPECS = [
    PeerSpec(
        key="pgqueuer",
        label="pgqueuer",
        # asyncpg: pgqueuer's own default driver (its README and `pgq` examples use it).
        # typer 0.29 breaks pgqueuer 1.6.0's `pgq run` (its log-level option arrives as a str).
        requirements=["pgqueuer==1.6.0", "asyncpg>=0.29", "typer<0.29"],
        script="pgqueuer_peer.py",
        database="pgqueuer",
        setup_command=["schema"],
        dists=["pgqueuer", "asyncpg"],
    ),
    PeerSpec(
        key="procrastinate",
        label="Procrastinate",
        requirements=["procrastinate==3.10.0", "psycopg[binary]>=3.1"],
        script="procrastinate_peer.py",
        database="procrastinate",
        setup_command=["schema"],
        dists=["procrastinate", "psycopg", "psycopg-pool"],
    ),
    PeerSpec(
        key="tasks_db",
        label="django-tasks-db",
        # Django 6 (native django.tasks) needs Python 3.12+; on Django 5.2 the backend runs on
        # the django-tasks backport, which is what its [compat] extra installs.
        requirements=[
            "django-tasks-db[compat]==0.13.0",
            "django-tasks==0.12.0",
            "Django>=5.2,<6",
            "psycopg[binary]>=3.1",
        ],
        script="tasks_db_peer.py",
        database="tasks_db",
        setup_command=["migrate"],
        dists=["django-tasks-db", "django-tasks", "Django", "psycopg"],
    ),
]


@dataclass
class Peer:
    spec: PeerSpec
    python: Path | None = None
    url: str | None = None
    versions: dict = field(default_factory=dict)
    problem: str | None = None  # why the peer is not measured

    @property
    def ok(self) -> bool:
        return self.problem is None

    def cmd(self, *args: str) -> list[str]:
        assert self.python is not None
        return [str(self.python), str(HERE / self.spec.script), *args]

    def tool(self, name: str, *args: str) -> list[str]:
        """A console script of the peer's own venv (pgqueuer's ``pgq``)."""
        assert self.python is not None
        return [str(self.python.with_name(name)), *args]

    def env(self, base: dict) -> dict:
        env = {
            k: v
            for k, v in base.items()
            if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH")
        }
        env["PEER_DATABASE_URL"] = self.url or ""
        env["PYTHONPATH"] = str(HERE)  # so a peer's own worker command imports its factory module
        return env


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(
    name: str, requirements: list[str], *, log: Path, timeout: float = 600
) -> tuple[Path | None, str | None]:
    """Create (or reuse) ``.venvs/<name>`` with ``requirements``; return (python, problem)."""
    venv = VENVS / name
    marker = venv / ".bench-requirements"
    wanted = "\n".join(requirements)
    python = _venv_python(venv)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python, None
    VENVS.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    output = ""
    try:
        for cmd, limit in (
            ([sys.executable, "-m", "venv", "--clear", str(venv)], 120),
            (
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    *requirements,
                ],
                timeout,
            ),
        ):
            done = subprocess.run(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=limit
            )
            output += done.stdout or ""
            done.check_returncode()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as error:
        output += getattr(error, "stdout", None) or ""
        log.write_text(_redact(output))
        lines = [ln for ln in _redact(output).splitlines() if ln.strip() and "is ignored" not in ln]
        reason = " | ".join(lines[-2:]) or str(error)
        return None, f"not installed ({type(error).__name__}): {reason[:300]}"
    log.write_text(_redact(output))
    marker.write_text(wanted)
    return python, None


def _redact(text: str) -> str:
    """Keep index host names out of the files a run writes (logs, results)."""
    return re.sub(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s'\"]+", r"\1<index>", text)


def installed_versions(python: Path, dists: list[str]) -> dict:
    code = (
        "import json, sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
        "out = {'python': sys.version.split()[0]}\n"
        f"for d in {dists!r}:\n    try: out[d] = version(d)\n"
        "    except PackageNotFoundError: out[d] = None\nprint(json.dumps(out))"
    )
    try:
        done = subprocess.run(
            [str(python), "-c", code], check=True, capture_output=True, text=True, timeout=60
        )
        return json.loads(done.stdout)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, ValueError) as error:
        return {"error": str(error)}


def prepare(
    server, *, env: dict, logs: Path, skip: bool, only: list[str] | None = None
) -> dict[str, Peer]:
    from benchmarks.server import DATABASES

    peers: dict[str, Peer] = {}
    for spec in SPECS:
        peer = Peer(spec=spec)
        peers[spec.key] = peer
        if skip or (only is not None and spec.key not in only):
            peer.problem = "skipped (--no-peers)" if skip else "skipped (--peers)"
            continue
        print(f"  peer {spec.label}: preparing {VENVS / spec.key} ...", flush=True)
        python, problem = ensure_venv(
            spec.key, spec.requirements, log=logs / f"venv-{spec.key}.log"
        )
        if problem:
            peer.problem = problem
            continue
        peer.python = python
        peer.versions = installed_versions(python, spec.dists)
        peer.url = server.url(DATABASES[spec.database])
        result = procs.run(
            peer.cmd(*spec.setup_command),
            env=peer.env(env),
            cwd=HERE,
            log=logs / f"setup-{spec.key}.log",
            timeout=300,
        )
        if result.exit_code != 0:
            peer.problem = (
                f"setup failed (exit {result.exit_code}): {procs.tail(result.log, 2)[:300]}"
            )
    return peers
