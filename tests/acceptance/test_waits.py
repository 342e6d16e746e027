"""Wait conditions in real worker processes: an `after` starts on time without polling, a
hanging check costs its worker nothing, a garbled declaration stops the worker at boot."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

import durable_jobs as durable
from durable_jobs import db
from tests.acceptance.harness import ROOT, backends_of, wait_until
from tests.factories import reload

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def test_after__the_job_starts_within_a_second_of_its_instant_without_polling(processes):
    # A poll interval far longer than the promise: only the worker's own knowledge of the
    # instant it rescheduled to can make the start prompt.
    processes.worker("--concurrency", "1", env={"DURABLE_JOBS_POLL_INTERVAL": "20"})
    probe = durable.start("demo.noop")
    wait_until(
        lambda: reload(probe).status == "completed", timeout=30, message="the worker to take work"
    )
    wait_until(
        lambda: backends_of("durable-test-worker/durable-listener"), message="the worker's listener"
    )
    instant = (db.database_now() + timedelta(seconds=3)).replace(microsecond=0)
    job = durable.start("demo.noop", wait_for=[{"after": instant.isoformat()}])
    wait_until(lambda: reload(job).status == "completed", timeout=20, message="the job to complete")
    done = reload(job)
    late = (done.started_at - instant).total_seconds()
    assert 0 <= late < 1.0, f"started {late:.3f}s after its instant"
    assert done.lease_epoch == 2, "claimed twice: once to hold it until the instant, once to run it"
    assert done.wait_checks == 0 and done.consecutive_failures == 0 and done.redrives == 0
    assert done.held_since is not None and done.wait_satisfied_at >= instant


def test_check__a_hanging_check_is_killed_with_its_group_and_the_slot_keeps_working(
    processes, tmp_path, settings
):
    pidfile = tmp_path / "grandchild.pid"
    script = tmp_path / "hangs.sh"
    script.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > '{pidfile}'\nsleep 300\n")
    script.chmod(0o755)
    declaration = f"hangs:{script}"
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "WAIT_PROFILES": declaration}
    worker = processes.worker(
        "--concurrency",
        "1",
        env={
            "DURABLE_WAIT_PROFILES": declaration,
            "DURABLE_JOBS_WAIT_CHECK_TIMEOUT": "1",
            "DURABLE_JOBS_EXECUTION": "process",
        },
    )
    held = durable.start("demo.noop", wait_for=[{"profile": "hangs"}])
    wait_until(lambda: pidfile.exists(), timeout=20, message="the check to start")
    plain = durable.start("demo.noop")
    wait_until(
        lambda: reload(plain).status == "completed", timeout=20, message="the plain job to complete"
    )
    after = reload(held)
    assert (after.status, after.lease_owner, after.wait_faults) == ("pending", None, 1)
    grandchild = int(pidfile.read_text())
    assert not Path(f"/proc/{grandchild}").exists() or _zombie(grandchild), (
        "the check's group was killed"
    )
    assert worker.popen.poll() is None, "the worker is still running"
    assert not [pid for pid in worker.children() if _command(pid).startswith("sleep")]


def test_worker__refuses_to_start_on_a_garbled_profile_declaration_naming_the_entry(db_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    env.update(
        DATABASE_URL=db_url,
        DJANGO_SETTINGS_MODULE="testproject.settings_test",
        DURABLE_WAIT_PROFILES="ok:/bin/true,bad:checks/relative.sh",
    )
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "durable_worker", "--burst"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    assert "'bad:checks/relative.sh'" in result.stderr and "absolute path" in result.stderr
    assert "starting" not in result.stderr


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\x00", " ")
    except OSError:
        return ""


def test_check__a_check_longer_than_the_lease_keeps_the_claim_alive(processes, tmp_path, settings):
    # The test settings' LEASE_TTL is 3 s: without the heartbeat over the gate the claim
    # would expire mid-check and the reconciler would take the job for an orphan.
    script = tmp_path / "slow.sh"
    script.write_text("#!/bin/sh\nsleep 8\nexit 0\n")
    script.chmod(0o755)
    declaration = f"slow:{script}"
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "WAIT_PROFILES": declaration}
    processes.worker(
        "--concurrency",
        "1",
        env={"DURABLE_WAIT_PROFILES": declaration, "DURABLE_JOBS_WAIT_CHECK_TIMEOUT": "20"},
    )
    job = durable.start("demo.noop", wait_for=[{"profile": "slow"}])
    wait_until(lambda: reload(job).status == "completed", timeout=40, message="the job to complete")
    done = reload(job)
    assert (done.lease_epoch, done.redrives, done.wait_checks) == (1, 0, 1), (
        "one claim, never taken as an orphan"
    )


def test_hold__its_clock_and_counters_survive_a_worker_killed_and_restarted(
    processes, tmp_path, settings
):
    script = tmp_path / "later.sh"
    script.write_text("#!/bin/sh\nexit 75\n")
    script.chmod(0o755)
    declaration = f"later:{script}"
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "WAIT_PROFILES": declaration}
    # A one-second cadence (floor lowered for the test) so checks come round quickly.
    env = {
        "DURABLE_WAIT_PROFILES": declaration,
        "DURABLE_JOBS_WAIT_CHECK_INTERVAL": "1",
        "DURABLE_JOBS_WAIT_CHECK_INTERVAL_FLOOR": "1",
    }
    first = processes.worker("--concurrency", "1", env=env, app_name="durable-test-first")
    job = durable.start("demo.noop", wait_for=[{"profile": "later"}])
    wait_until(
        lambda: reload(job).wait_checks >= 2, timeout=30, message="two checks by the first worker"
    )
    since = reload(job).held_since
    first.signal(9)
    first.wait()
    checks_before = reload(job).wait_checks
    processes.worker("--concurrency", "1", env=env, app_name="durable-test-second")
    wait_until(
        lambda: reload(job).wait_checks >= checks_before + 2,
        timeout=30,
        message="two more checks by the restarted worker",
    )
    after = reload(job)
    assert after.held_since == since, "the hold clock started once and survived the restart"
    assert after.consecutive_failures == 0, "holding is not failing"
