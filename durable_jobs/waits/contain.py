"""The supervisor of one check run: start it, wait for it, then kill and reap all it left.

The worker never runs a check itself. It runs this file (``python -I -S contain.py``,
standard library only, so nothing of the project or Django is imported) and this
process, on Linux, makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``):
a descendant that calls ``setsid()`` and detaches is re-parented to it instead of to init,
so none escapes. The worker itself never becomes a subreaper of unrelated processes.

The conversation with the worker, over the three standard streams:

* **stdin**: one JSON line ``{"path", "env", "timeout", "uid", "gid"}``, then kept open.
  End of file before the check finished (the worker stopping, or dead) means abort.
* **stdout**: handed to the check as its stdout and stderr; this process closes its own
  copy, so the worker's end of the pipe sees end of file once no descendant is left.
* **stderr**: one status line, written the moment the check itself exits (so a detached
  grandchild can never delay the answer): ``exit N``, ``signal N``, ``timeout``,
  ``aborted``, ``user_refused ERRNO`` or ``spawn_failed ERRNO``.

After the status line every remaining descendant is killed (``SIGKILL``) and reaped, and
only then does this process exit: when the worker has reaped it, nothing the check
started is still running. Elsewhere than Linux there is no subreaper: the check's
process group is killed instead (what leaves the group escapes).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

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


def main() -> int:
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
    sys.exit(main())
