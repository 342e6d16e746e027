"""What containment of a wait check covers (invariant 21; docs/waits.rst, "What containment covers").

Every check is a real shell script written by the test. The observables are the ones an
operator has: which processes exist after a check returned, the uid a check ran as, what
it could read, the test process's own threads and open files, and the rows of the jobs.
"""

from __future__ import annotations

import http.server
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

import durable_jobs as durable
from durable_jobs import conf, testing
from durable_jobs.exceptions import ConfigurationError
from durable_jobs.runtime.worker import Worker
from durable_jobs.waits import checks
from tests.docs.examples import ROOT, extract
from tests.factories import reload

pytestmark = pytest.mark.django_db

KIND = "tests.contained"
CHECK_USER = "durable-check-test"


@pytest.fixture
def where():
    """A directory every user may read and write: checks run as CHECK_USER read it too
    (pytest's own tmp_path sits under a directory only root may enter)."""
    path = Path(tempfile.mkdtemp(prefix="durable-contain-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def script(where: Path, name: str, body: str) -> str:
    path = where / f"{name}.sh"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def with_marker(marker: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def exists(pid: int) -> bool:
    """True while ``pid`` is a process of any state, a zombie included (nobody reaped it)."""
    return Path(f"/proc/{pid}").exists()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def detaching_check(where: Path, marker: str, *, then: str) -> tuple[str, Path]:
    """A check that starts a grandchild in a session of its own, waits until it runs, then ``then``."""
    pidfile = where / f"{marker}.pid"
    path = script(
        where,
        marker,
        # The grandchild leaves the check's session and group (setsid) and keeps the
        # output pipe open; the check waits for its pid so the order is certain.
        f"setsid sh -c 'echo $$ > {pidfile}; sleep 60; : {marker}' &\n"
        f"while [ ! -s {pidfile} ]; do sleep 0.01; done\n{then}",
    )
    return path, pidfile


def test_check__a_grandchild_that_setsids_and_detaches_is_killed_and_reaped_when_the_check_answers(
    where,
):
    marker = f"durable-marker-{uuid.uuid4().hex}"
    path, pidfile = detaching_check(where, marker, then="echo answered\nexit 75")
    threads, fds = threading.active_count(), open_fds()

    answer = checks.run(path, env=dict(checks.BASE_ENVIRONMENT), timeout=30, output_cap=100)

    assert answer.answer == checks.NOT_YET and answer.output == b"answered\n"
    grandchild = int(pidfile.read_text())
    assert not exists(grandchild), "the detached grandchild was killed and reaped before the answer"
    assert with_marker(marker) == [], "nothing the check started survives the call"
    assert threading.active_count() == threads, "no reader thread outlives the call"
    assert open_fds() == fds, "no pipe outlives the call"


def test_check__at_its_timeout_the_check_and_every_descendant_are_gone(where):
    marker = f"durable-marker-{uuid.uuid4().hex}"
    path, pidfile = detaching_check(where, marker, then=f"sleep 60 # {marker}")
    threads, fds = threading.active_count(), open_fds()

    answer = checks.run(path, env=dict(checks.BASE_ENVIRONMENT), timeout=0.5, output_cap=100)

    assert answer.answer == checks.CANNOT_TELL and "timed out" in answer.detail
    assert not exists(int(pidfile.read_text()))
    assert with_marker(marker) == []
    assert (threading.active_count(), open_fds()) == (threads, fds)


def test_check__a_stopping_worker_interrupts_it_and_leaves_nothing_running(where):
    marker = f"durable-marker-{uuid.uuid4().hex}"
    started = where / "started"
    path, pidfile = detaching_check(where, marker, then=f"touch {started}\nsleep 60")
    stop = threading.Event()

    def stop_once_started() -> None:
        while not started.exists():
            threading.Event().wait(0.01)
        stop.set()

    threading.Thread(target=stop_once_started, daemon=True).start()
    answer = checks.run(
        path, env=dict(checks.BASE_ENVIRONMENT), timeout=60, output_cap=100, stop=stop
    )

    assert answer.answer == checks.INTERRUPTED
    assert not exists(int(pidfile.read_text()))
    assert with_marker(marker) == []


def test_check__many_runs_leave_the_worker_as_they_found_it(where):
    marker = f"durable-marker-{uuid.uuid4().hex}"
    path, _ = detaching_check(where, marker, then="exit 0")
    threads, fds = threading.active_count(), open_fds()
    answers = [
        checks.run(path, env=dict(checks.BASE_ENVIRONMENT), timeout=30, output_cap=10).answer
        for _ in range(5)
    ]
    assert answers == [checks.GO] * 5
    assert with_marker(marker) == []
    assert (threading.active_count(), open_fds()) == (threads, fds)


# --- the user a check runs as ------------------------------------------------------------


@pytest.fixture
def check_user() -> pwd.struct_passwd:
    """The unprivileged system user the tests run checks as, created when missing (never skipped)."""
    try:
        return pwd.getpwnam(CHECK_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", CHECK_USER], check=True, capture_output=True
        )
        return pwd.getpwnam(CHECK_USER)


def identity_check(where: Path) -> str:
    return script(
        where,
        "who",
        'echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"\n'
        'if cat "/proc/$WORKER_PID/environ" > /dev/null 2>&1; then echo environ=read; '
        "else echo environ=refused; fi\n"
        "exit 0",
    )


def test_check__runs_as_the_configured_user_and_cannot_read_the_workers_environment(
    where, check_user, monkeypatch
):
    monkeypatch.setenv("DURABLE_TEST_SECRET", "do-not-leak")
    env = {**checks.BASE_ENVIRONMENT, "WORKER_PID": str(os.getpid())}
    path = identity_check(where)

    as_worker = checks.run(path, env=env, timeout=30, output_cap=1000)
    as_user = checks.run(path, env=env, timeout=30, output_cap=1000, user=CHECK_USER)

    assert b"environ=read" in as_worker.output, "the worker's own user can read it: the hazard"
    assert as_user.answer == checks.GO
    uid, gid = check_user.pw_uid, check_user.pw_gid
    assert as_user.output.decode().splitlines() == [
        f"uid={uid} gid={gid} groups={gid}",  # no supplementary group of the worker's
        "environ=refused",
    ]


def test_wait__a_profile_check_runs_as_wait_check_user_through_the_gate(
    where, check_user, settings, kinds
):
    kinds.add(KIND, lambda job: durable.DONE)
    seen = where / "uid"
    path = script(where, "uid", f"id -u > {seen}\nexit 0")
    settings.DURABLE_JOBS = {
        **settings.DURABLE_JOBS,
        "WAIT_PROFILES": {"as-user": path},
        "WAIT_CHECK_USER": CHECK_USER,
    }
    job = durable.start(KIND, wait_for=[{"profile": "as-user"}], wait_key="ticket:1")

    assert [r.outcome for r in testing.run_jobs()] == ["completed"]
    assert reload(job).status == "completed"
    assert seen.read_text().strip() == str(check_user.pw_uid)


def test_settings__an_unknown_wait_check_user_stops_the_worker_naming_it(settings):
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "WAIT_CHECK_USER": "no-such-user-here"}
    with pytest.raises(ConfigurationError, match="'no-such-user-here', which is no user"):
        conf.get()
    with pytest.raises(ConfigurationError, match="root"):
        conf.load({"WAIT_CHECK_USER": "root"})


def test_worker__without_the_privilege_to_switch_users_it_refuses_to_start(check_user, settings):
    """A worker that is not root (and lacks CAP_SETUID/CAP_SETGID) says so at boot, and a
    check it runs anyway answers "cannot tell" with the same reason."""
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "WAIT_CHECK_USER": CHECK_USER}
    nobody = pwd.getpwnam("nobody")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the unprivileged worker
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            try:
                Worker(burst=True)
                said = "started"
            except ConfigurationError as error:
                said = str(error)
            answer = checks.run("/bin/true", env={}, timeout=5, output_cap=10, user=CHECK_USER)
            os.write(write, f"{said}\n{answer.answer}: {answer.detail}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        boot, run = pipe.read().decode().split("\n")
    os.waitpid(pid, 0)
    assert "WAIT_CHECK_USER" in boot and CHECK_USER in boot and "CAP_SETUID" in boot
    assert run.startswith("cannot_tell: ") and "CAP_SETUID" in run


# --- the documented example check --------------------------------------------------------


def test_docs__the_example_check_encodes_the_wait_key_it_puts_in_a_url(where):
    (example,) = [e for e in extract(ROOT / "docs" / "waits.rst") if "urllib.parse.quote" in e.code]
    requested: list[str] = []

    class Tracker(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requested.append(self.path)
            body = b"closed"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Tracker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        path = where / "ticket_closed.py"
        code = example.code.replace(
            "https://tracker.example", f"http://127.0.0.1:{server.server_address[1]}"
        )
        path.write_text(f"#!{sys.executable} -I\n{code}")
        path.chmod(0o755)
        env = {**checks.BASE_ENVIRONMENT, "DURABLE_WAIT_KEY": "ticket:ops/db@eu-1"}
        answer = checks.run(str(path), env=env, timeout=30, output_cap=1000)
    finally:
        server.shutdown()
        server.server_close()
    assert answer.answer == checks.GO, answer
    assert requested == ["/api/tickets/ops%2Fdb%40eu-1/state"]
