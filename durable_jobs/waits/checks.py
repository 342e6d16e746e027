"""Run one check executable, contained (invariant 21).

A check is an operator's program answering one question about one job: may it run yet?
It is bounded in every direction a program can run away in:

* **time**: it runs in its own session (its own process group); at its timeout the whole
  group is killed, so a grandchild holding the output pipe cannot keep the worker
  waiting, and the slot that ran it is never lost;
* **output**: at most ``output_cap`` bytes are kept; the rest is read and dropped so a
  chatty check cannot block on a full pipe or fill the worker's memory;
* **environment**: only what ``environment()`` builds — a fixed ``PATH``, a locale and
  the job's identity. Never the worker's environment, so never ``DATABASE_URL``,
  ``SECRET_KEY`` or anything else a deployment keeps there.

The answer is the exit status:

=======================  ============================================================
exit status              answer
=======================  ============================================================
0                        ``go``: this condition has cleared
75 (``EX_TEMPFAIL``)     ``not_yet``: hold and ask again later
65 (``EX_DATAERR``)      ``never``: it will never clear; the job fails ``wait_never``
anything else            ``cannot_tell``: a consecutive fault (a crash, exit 1, a
                         missing interpreter, a timeout, a signal, a file that cannot
                         be started)
=======================  ============================================================

Ordinary failure statuses (1, 2, 126, 127) deliberately mean "cannot tell": a check
that crashes must run out of fault budget and say so, not hold a job as "not yet"
until its maximum hold.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time

GO, NOT_YET, CANNOT_TELL, NEVER, INTERRUPTED = (
    "go",
    "not_yet",
    "cannot_tell",
    "never",
    "interrupted",
)

EXIT_GO = 0
EXIT_NOT_YET = 75
EXIT_NEVER = 65

#: The whole environment a check starts with, besides the job's identity.
BASE_ENVIRONMENT = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

_CHUNK = 65536


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CheckAnswer:
    """What one check run answered, and why, in words built only from numbers and our own text."""

    answer: str  # go | not_yet | cannot_tell | never | interrupted
    detail: str
    exit_status: int | None = None
    output: bytes = b""  # at most the cap; never logged
    output_bytes: int = 0  # how many it printed in all

    @property
    def fault(self) -> bool:
        return self.answer == CANNOT_TELL


def environment(
    *,
    job_id: object,
    kind: str,
    profile: str,
    tenant: str,
    organization: str | None,
    wait_key: str | None,
    checks_so_far: int,
) -> dict[str, str]:
    """The documented environment of a check: nothing of the worker's own.

    Every value is a validated name, a UUID or a number, except the wait key, which the
    start validated as printable text without control characters.
    """
    env = dict(BASE_ENVIRONMENT)
    env.update(
        {
            "DURABLE_JOB_ID": str(job_id),
            "DURABLE_JOB_KIND": kind,
            "DURABLE_JOB_TENANT": tenant,
            "DURABLE_WAIT_PROFILE": profile,
            "DURABLE_WAIT_CHECKS": str(int(checks_so_far)),
        }
    )
    if organization is not None:
        env["DURABLE_JOB_ORGANIZATION"] = organization
    if wait_key is not None:
        env["DURABLE_WAIT_KEY"] = wait_key
    return env


def run(
    path: str,
    *,
    env: dict[str, str],
    timeout: float,
    output_cap: int,
    stop: threading.Event | None = None,
) -> CheckAnswer:
    """Run the check at ``path`` once and return its answer; never raises for the check's sake.

    ``stop`` (the worker shutting down) ends the check early with ``interrupted``: the
    check never answered, so the caller charges nothing.
    """
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        return CheckAnswer(
            answer=CANNOT_TELL, detail="the declared check is not an executable file on this worker"
        )
    try:
        process = subprocess.Popen(
            [path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
    except OSError as error:
        return CheckAnswer(answer=CANNOT_TELL, detail=f"could not be started (errno {error.errno})")
    stdout = process.stdout
    assert stdout is not None  # stdout=PIPE: always a pipe
    kept = bytearray()
    total = [0]

    def drain() -> None:
        # Reads to the end, keeping only the cap: a check blocked on a full pipe would
        # otherwise look like a hang and be killed for our reading too slowly.
        try:
            while True:
                chunk = stdout.read1(_CHUNK) if hasattr(stdout, "read1") else stdout.read(_CHUNK)
                if not chunk:
                    return
                total[0] += len(chunk)
                room = output_cap - len(kept)
                if room > 0:
                    kept.extend(chunk[:room])
        except (OSError, ValueError):
            return

    reader = threading.Thread(target=drain, name="durable-check-output", daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    outcome: str | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            outcome = "timeout"
            break
        if stop is not None and stop.is_set():
            outcome = "stopped"
            break
        if _exited(process):
            break
        time.sleep(min(0.02, remaining))
    # The whole group goes, finished or not: whatever the check left running (a
    # background child holding the pipe) is not allowed to outlive its answer.
    _kill_group(process.pid)
    process.wait()
    reader.join(timeout=2.0)
    if not reader.is_alive():
        # Closing while the reader is blocked in a read would wait for that read (the
        # buffer's lock): a descendant that left the group (its own setsid) and kept the
        # pipe must not hang this slot. The reader then ends when that process does.
        stdout.close()
    output = bytes(kept)
    if outcome == "timeout":
        return CheckAnswer(
            answer=CANNOT_TELL,
            detail=f"timed out after {timeout:g}s and was killed",
            output=output,
            output_bytes=total[0],
        )
    if outcome == "stopped":
        return CheckAnswer(
            answer=INTERRUPTED,
            detail="the worker is stopping",
            output=output,
            output_bytes=total[0],
        )
    status = process.returncode
    if status < 0:
        return CheckAnswer(
            answer=CANNOT_TELL,
            detail=f"ended by signal {-status}",
            exit_status=status,
            output=output,
            output_bytes=total[0],
        )
    answer = {EXIT_GO: GO, EXIT_NOT_YET: NOT_YET, EXIT_NEVER: NEVER}.get(status, CANNOT_TELL)
    return CheckAnswer(
        answer=answer,
        detail=f"exit status {status}",
        exit_status=status,
        output=output,
        output_bytes=total[0],
    )


def _exited(process: subprocess.Popen) -> bool:
    """True once the check has exited, without reaping it where the platform allows.

    A zombie keeps its process id, and with it its group's id, reserved: killing the group
    before the reap can never reach an unrelated process that reused the number. Where
    ``waitid`` is missing (macOS before Python 3.13) the check is reaped by ``poll()``
    and its group killed right after, as closely as that platform allows.
    """
    if not hasattr(os, "waitid"):
        return process.poll() is not None
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
