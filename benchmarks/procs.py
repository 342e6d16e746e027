"""Subprocesses with resource accounting, and the server's CPU time.

Worker processes are reaped with ``os.wait4``, which returns the child's own CPU time.
Peak memory is the kernel's high-water mark of the worker's address space, ``VmHWM`` in
``/proc/<pid>/status``, read every 20 ms while it runs (it only grows, so the last read is
the peak up to a few milliseconds before exit). Not ``ru_maxrss``: a child forked from
this (large) runner process inherits the runner's resident size into that figure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

_LIVE: list[subprocess.Popen] = []


@dataclass
class ProcResult:
    cmd: list[str]
    exit_code: int | None
    wall_seconds: float
    user_cpu: float = 0.0
    system_cpu: float = 0.0
    max_rss_kib: int = 0
    timed_out: bool = False
    log: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def cpu_seconds(self) -> float:
        return self.user_cpu + self.system_cpu


class Group:
    """A set of processes started together and reaped with their rusage."""

    def __init__(self, cmds: list[list[str]], *, env: dict, cwd: Path, logs: list[Path]) -> None:
        self.cmds = cmds
        self.began = time.monotonic()
        self.procs: list[subprocess.Popen] = []
        self.logs = logs
        self.results: dict[int, ProcResult] = {}
        self.peaks: dict[int, int] = {}
        for cmd, log in zip(cmds, logs, strict=False):
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "wb") as sink:
                proc = subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=cwd,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            self.procs.append(proc)
            _LIVE.append(proc)

    def sample(self) -> None:
        for index, proc in enumerate(self.procs):
            if index not in self.results:
                hwm = proc_status_kib(proc.pid, "VmHWM")
                if hwm:
                    self.peaks[index] = max(self.peaks.get(index, 0), hwm)

    def poll(self) -> bool:
        """Reap whatever exited; True when every process has."""
        self.sample()
        for index, proc in enumerate(self.procs):
            if index in self.results:
                continue
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == 0:
                continue
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code
            if proc in _LIVE:
                _LIVE.remove(proc)
            self.results[index] = ProcResult(
                cmd=self.cmds[index],
                exit_code=code,
                wall_seconds=time.monotonic() - self.began,
                user_cpu=usage.ru_utime,
                system_cpu=usage.ru_stime,
                max_rss_kib=self.peaks.get(index, 0),
                log=str(self.logs[index]),
            )
        return len(self.results) == len(self.procs)

    def alive(self) -> bool:
        return not self.poll()

    def wait(self, timeout: float) -> list[ProcResult]:
        deadline = time.monotonic() + timeout
        while not self.poll():
            if time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                for result in self.results.values():
                    result.timed_out = True
                break
            time.sleep(0.02)
        return [self.results[i] for i in range(len(self.procs))]

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 20.0) -> list[ProcResult]:
        """Signal every live process (SIGTERM: a graceful stop), then reap them."""
        self.sample()
        for index, proc in enumerate(self.procs):
            if index not in self.results:
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        while not self.poll():
            if time.monotonic() > deadline and signum != signal.SIGKILL:
                return self.stop(signal.SIGKILL, timeout=10)
            time.sleep(0.02)
        return [self.results[i] for i in range(len(self.procs))]


def drain_figures(
    results: list[ProcResult],
    *,
    n: int,
    completed: int,
    rows: int,
    window: float | None,
    server_cpu: tuple[float | None, float | None],
    logs: list[Path],
) -> dict:
    """The figures of one drain (ours or a peer's): ``completed`` of ``n`` over the
    database-clock ``window``, the worker processes' exit, peak RSS and CPU, the server's CPU
    (``server_cpu_seconds`` before and after); ``verified`` when every job completed and every
    worker exited cleanly in time."""
    window = float(window or 0)
    cpu0, cpu1 = server_cpu
    out = {
        "n": n,
        "completed": completed,
        "rows": rows,
        "db_window_seconds": window,
        "per_second": completed / window if window else None,
        "wall_seconds": max(r.wall_seconds for r in results),
        "exit_codes": [r.exit_code for r in results],
        "timed_out": any(r.timed_out for r in results),
        "max_rss_mib": max(r.max_rss_kib for r in results) / 1024,
        "worker_cpu_seconds": sum(r.cpu_seconds for r in results),
        "server_cpu_seconds": (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
        "logs": [str(p) for p in logs],
    }
    out["verified"] = (
        completed == n and not out["timed_out"] and all(c == 0 for c in out["exit_codes"])
    )
    return out


def proc_status_kib(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory field (``VmHWM``, ``VmRSS``) in KiB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def kill_all() -> None:
    """Last resort on an interrupted run: kill the processes this run started (by pid)."""
    for proc in list(_LIVE):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass
        _LIVE.remove(proc)


def run(cmd: list[str], *, env: dict, cwd: Path, log: Path, timeout: float) -> ProcResult:
    return Group([cmd], env=env, cwd=cwd, logs=[log]).wait(timeout)[0]


def tail(path: str | Path, lines: int = 5) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


# --- the server's CPU ---------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int, *, with_children: bool) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    # fields[0] is state (field 3); utime=14, stime=15, cutime=16, cstime=17 (1-based)
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    total = utime + stime + ((cutime + cstime) if with_children else 0)
    return total / _TICKS


def server_cpu_seconds(postmaster_pid: int | None) -> float | None:
    """CPU seconds used so far by a local server: the postmaster, its live backends, and
    (through the postmaster's reaped-children counters) every backend that has exited."""
    by_process = server_cpu_by_process(postmaster_pid)
    return None if by_process is None else sum(by_process.values())


#: The server's own processes, by the title they run under (``postgres: walwriter``).
_AUXILIARY = (
    "checkpointer",
    "background writer",
    "walwriter",
    "autovacuum launcher",
    "autovacuum worker",
    "logical replication launcher",
    "io worker",
)


def server_cpu_by_process(postmaster_pid: int | None) -> dict[str, float] | None:
    """``server_cpu_seconds`` split by what each process is: ``backends`` (client
    sessions), each auxiliary process by name, and ``postmaster and exited`` (the
    postmaster and every reaped child)."""
    if postmaster_pid is None:
        return None
    try:
        split = {"postmaster and exited": _proc_cpu(postmaster_pid, with_children=True)}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    stat = handle.read()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if ppid == postmaster_pid:
                    role = _server_role(int(entry))
                    split[role] = split.get(role, 0.0) + _proc_cpu(int(entry), with_children=False)
            except (OSError, ValueError, IndexError):
                continue
        return split
    except OSError:
        return None


def _server_role(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        title = handle.read().replace(b"\0", b" ").decode(errors="replace")
    title = title.removeprefix("postgres: ").strip()
    return next((name for name in _AUXILIARY if title.startswith(name)), "backends")
