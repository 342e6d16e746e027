"""Run one check executable, contained (invariant 21).

A check is an operator's program answering one question about one job: may it run yet?
It is bounded in every direction a program can run away in:

* **descendants**: it runs under a supervisor of its own (this file run as a script), a child
  subreaper on Linux: whatever the check started -- even a grandchild that calls
  ``setsid()`` and detaches -- is killed and reaped as soon as the check exits, and the answer is
  given the moment the check exits, never when its last grandchild lets go of the pipe;
* **time**: at its timeout the check and every descendant are killed, so the slot that
  ran it is never lost; the call leaves no thread and no pipe behind;
* **user**: with DURABLE_JOBS['WAIT_CHECK_USER'] it runs as that unprivileged user, with
  its primary group and no supplementary groups, so it cannot read the worker's
  ``/proc/<pid>/environ`` (this needs a worker running as root or with CAP_SETUID and
  CAP_SETGID; ``user_refusal`` says why not otherwise);
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

import ctypes
import dataclasses
import json
import os
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

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

#: The supervisor every check runs under: this file, run as a script (see the end of it).
SUPERVISOR = str(Path(__file__).resolve())
#: How long past the check's timeout its supervisor may take to kill and reap, before
#: the worker kills the supervisor itself.
SUPERVISOR_GRACE = 5.0
CAP_SETGID, CAP_SETUID = 6, 7


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
    user: str | None = None,
) -> CheckAnswer:
    """Run the check at ``path`` once, contained, and return its answer; never raises for the check's sake.

    The check runs under its own supervisor (this file as a script), as ``user`` when one is
    named (DURABLE_JOBS['WAIT_CHECK_USER']). The answer comes back as soon as the check
    itself exits; by the time this returns, every process it started has been killed and
    reaped, and no thread or pipe of this call is left. ``stop`` (the worker shutting
    down) ends the check early with ``interrupted``: the check never answered, so the
    caller charges nothing.
    """
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        return CheckAnswer(
            answer=CANNOT_TELL, detail="the declared check is not an executable file on this worker"
        )
    ids: tuple[int, int] | None = None
    if user is not None:
        refused = user_refusal(user)
        if refused is not None:
            return CheckAnswer(answer=CANNOT_TELL, detail=refused)
        import pwd  # POSIX only, like the whole of switching users

        entry = pwd.getpwnam(user)
        ids = (entry.pw_uid, entry.pw_gid)
    spec = {
        "path": path,
        "env": env,
        "timeout": timeout,
        "uid": None if ids is None else ids[0],
        "gid": None if ids is None else ids[1],
    }
    try:
        supervisor = subprocess.Popen(
            # -I -S: the supervisor is standard library only; nothing of the worker's
            # environment (PYTHONPATH, site packages) or of the project is imported.
            [sys.executable, "-I", "-S", SUPERVISOR],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(BASE_ENVIRONMENT),
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
    except OSError as error:
        return CheckAnswer(
            answer=CANNOT_TELL, detail=f"its supervisor could not be started (errno {error.errno})"
        )
    try:
        return _converse(
            supervisor, spec, timeout=timeout, output_cap=output_cap, stop=stop, user=user
        )
    finally:
        for stream in (supervisor.stdin, supervisor.stdout, supervisor.stderr):
            if stream is not None:
                stream.close()
        if supervisor.poll() is None:
            _kill_group(supervisor.pid)
        supervisor.wait()


def _converse(
    supervisor: subprocess.Popen,
    spec: dict[str, Any],
    *,
    timeout: float,
    output_cap: int,
    stop: threading.Event | None,
    user: str | None,
) -> CheckAnswer:
    """Hand the supervisor its check, read the output (capped) and the status line, and answer."""
    assert supervisor.stdin and supervisor.stdout and supervisor.stderr  # all three are pipes
    try:
        supervisor.stdin.write(json.dumps(spec).encode() + b"\n")
        supervisor.stdin.flush()  # and kept open: closing it is how this side aborts
    except OSError:
        pass  # it died at once: its status (none) says so below
    kept = bytearray()
    total = 0
    status = bytearray()
    stopped = False
    # The supervisor enforces the timeout; this bound is only for a supervisor that hangs.
    backstop = time.monotonic() + timeout + SUPERVISOR_GRACE
    out, err = supervisor.stdout.fileno(), supervisor.stderr.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(out, selectors.EVENT_READ)
        selector.register(err, selectors.EVENT_READ)
        while selector.get_map():
            if stop is not None and stop.is_set() and not stopped:
                stopped = True
                supervisor.stdin.close()  # end of file: the supervisor kills and reaps all
            remaining = backstop - time.monotonic()
            if remaining <= 0:
                _kill_group(supervisor.pid)
                return CheckAnswer(
                    answer=CANNOT_TELL,
                    detail=f"its supervisor did not end {SUPERVISOR_GRACE:g}s past the timeout and was killed",
                    output=bytes(kept),
                    output_bytes=total,
                )
            # The stop event cannot be selected on: look at it every 50 ms.
            for key, _ in selector.select(min(remaining, 0.05) if stop is not None else remaining):
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                elif key.fd == out:
                    # Read to the end, keeping only the cap: a check blocked on a full pipe
                    # would otherwise look like a hang and be killed for our slowness.
                    total += len(chunk)
                    kept.extend(chunk[: max(0, output_cap - len(kept))])
                else:
                    status.extend(chunk[: max(0, 200 - len(status))])
    supervisor.wait()
    return _answer(
        status.decode("ascii", "replace").split("\n", 1)[0],
        supervisor.returncode,
        timeout=timeout,
        stopped=stopped,
        user=user,
        output=bytes(kept),
        output_bytes=total,
    )


def _answer(
    line: str,
    returncode: int,
    *,
    timeout: float,
    stopped: bool,
    user: str | None,
    output: bytes,
    output_bytes: int,
) -> CheckAnswer:
    """The answer a supervisor's status line means (its words are numbers and our own text)."""
    word, _, number = line.partition(" ")
    code = int(number) if number.lstrip("-").isdigit() else None

    def said(answer: str, detail: str, exit_status: int | None = None) -> CheckAnswer:
        return CheckAnswer(
            answer=answer,
            detail=detail,
            exit_status=exit_status,
            output=output,
            output_bytes=output_bytes,
        )

    if word == "exit" and code is not None:
        answer = {EXIT_GO: GO, EXIT_NOT_YET: NOT_YET, EXIT_NEVER: NEVER}.get(code, CANNOT_TELL)
        return said(answer, f"exit status {code}", code)
    if word == "signal" and code is not None:
        return said(CANNOT_TELL, f"ended by signal {code}", -code)
    if word == "timeout":
        return said(CANNOT_TELL, f"timed out after {timeout:g}s and was killed")
    if word == "user_refused":
        return said(
            CANNOT_TELL,
            f"could not switch to DURABLE_JOBS['WAIT_CHECK_USER'] {user!r} (errno {code})",
        )
    if word == "spawn_failed":
        return said(CANNOT_TELL, f"could not be started (errno {code})")
    if stopped:  # "aborted", or killed before it could say so
        return said(INTERRUPTED, "the worker is stopping")
    return said(CANNOT_TELL, f"its supervisor failed without an answer (exit status {returncode})")


def user_refusal(name: str) -> str | None:
    """Why this process cannot run checks as the user ``name``, or None when it can.

    Switching user needs root or CAP_SETUID and CAP_SETGID (and dropping supplementary
    groups CAP_SETGID). The worker's own user is refused too: a check running as the
    worker can read the worker's environment, which is what the setting is there to stop.
    """
    label = f"DURABLE_JOBS['WAIT_CHECK_USER'] = {name!r}"
    try:
        import pwd
    except ImportError:
        return f"{label}: switching users needs a POSIX host"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return f"{label}: there is no such user on this host"
    if entry.pw_uid == 0:
        return f"{label} is root: a check running as root is contained by nothing"
    if entry.pw_uid == os.geteuid():
        return (
            f"{label} is the worker's own user: a check running as it can read the worker's "
            "environment; name a separate unprivileged user, or leave the setting unset"
        )
    if not _can_switch_user():
        return (
            f"{label}: this worker runs as uid {os.geteuid()} without CAP_SETUID and CAP_SETGID, so it "
            "cannot run checks as another user; run the worker as root (or grant it those two "
            "capabilities), or leave the setting unset"
        )
    return None


def _can_switch_user() -> bool:
    """True when this process may set its uid, gid and groups: root, or both capabilities."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    effective = int(line.split()[1], 16)
                    return bool(effective & (1 << CAP_SETUID)) and bool(
                        effective & (1 << CAP_SETGID)
                    )
    except (OSError, ValueError):
        pass
    return os.geteuid() == 0


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --- The supervisor: this file run as a script, one process per check run ------------
# Keep this module standard library only: the supervisor imports it with -I -S.
#
# The worker never runs a check itself. It runs this very file as a script
# (``python -I -S checks.py``: this module imports the standard library only, so nothing
# of the project or of Django is imported there), and that process, on Linux, makes
# itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): a descendant that calls
# ``setsid()`` and detaches is re-parented to it instead of to init, so none escapes.
# The worker itself never becomes a subreaper of unrelated processes.
#
# The conversation with the worker, over the three standard streams:
#
# * **stdin**: one JSON line ``{"path", "env", "timeout", "uid", "gid"}``, then kept open.
#   End of file before the check finished (the worker stopping, or dead) means abort.
# * **stdout**: handed to the check as its stdout and stderr; this process closes its own
#   copy, so the worker's end of the pipe sees end of file once no descendant is left.
# * **stderr**: one status line, written the moment the check itself exits (so a detached
#   grandchild can never delay the answer): ``exit N``, ``signal N``, ``timeout``,
#   ``aborted``, ``user_refused ERRNO`` or ``spawn_failed ERRNO``.
#
# After the status line every remaining descendant is killed (``SIGKILL``) and reaped, and
# only then does this process exit: when the worker has reaped it, nothing the check
# started is still running. Elsewhere than Linux there is no subreaper: the check's
# process group is killed instead (what leaves the group escapes).

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every process below ``root``, read from /proc (an empty list where there is none)."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                # The command name may hold spaces and parentheses: split after the last ")".
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        parents[int(entry)] = int(fields[1])
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def kill_and_reap_all(check: subprocess.Popen, subreaper: bool) -> None:
    """Kill every descendant, reap each, and return once none is left."""
    try:
        os.killpg(check.pid, signal.SIGKILL)  # the check's own group first: the cheap case
    except OSError:
        pass
    while True:
        if subreaper:
            for pid in descendants(os.getpid()):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            while True:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
        except ChildProcessError:
            return  # no child left: every orphan was re-parented here and reaped
        if not subreaper:
            check.wait()
            return
        # A descendant forked between the scan and the kill, or a killed one is not yet
        # a zombie: look again shortly.
        time.sleep(0.005)


def wait_for(check: subprocess.Popen, timeout: float) -> str:
    """Wait for the check to exit, its timeout, or the worker's abort; say which."""
    deadline = time.monotonic() + timeout
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(check.pid)
        except OSError:
            pidfd = None
    try:
        while True:
            if check.poll() is not None:
                status = check.returncode
                return f"signal {-status}" if status < 0 else f"exit {status}"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            watched = [0] + ([pidfd] if pidfd is not None else [])
            ready, _, _ = select.select(
                watched, [], [], remaining if pidfd is not None else min(remaining, 0.01)
            )
            if 0 in ready and not os.read(0, 4096):
                return "aborted"
    finally:
        if pidfd is not None:
            os.close(pidfd)


def supervise() -> int:
    """The supervisor's whole run (see "The supervisor" above); its exit status is always 0."""
    spec = json.loads(sys.stdin.buffer.readline() or b"null")
    status_out = os.fdopen(os.dup(2), "w")
    subreaper = become_subreaper()
    output = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)  # this process keeps no copy of the output pipe
    user = {}
    if spec.get("uid") is not None:
        # setgroups([]) drops every supplementary group of the worker's user.
        user = {"user": spec["uid"], "group": spec["gid"], "extra_groups": []}
    try:
        check = subprocess.Popen(
            [spec["path"]],
            stdin=devnull,
            stdout=output,
            stderr=output,
            env=spec["env"],
            cwd="/",
            start_new_session=True,
            close_fds=True,
            **user,
        )
    except PermissionError as error:
        stage = "user_refused" if user and error.filename is None else "spawn_failed"
        status_out.write(f"{stage} {error.errno}\n")
        return 0
    except OSError as error:
        status_out.write(f"spawn_failed {error.errno}\n")
        return 0
    finally:
        os.close(output)
    answer = wait_for(check, float(spec["timeout"]))
    if answer not in ("timeout", "aborted"):
        status_out.write(answer + "\n")
        status_out.flush()  # the answer leaves before the clean-up begins
    kill_and_reap_all(check, subreaper)
    if answer in ("timeout", "aborted"):
        status_out.write(answer + "\n")
    status_out.close()
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(supervise())
