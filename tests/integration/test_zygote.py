"""Handler processes are forked from a zygote that set Django up once (START_METHOD)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.test import override_settings

import durable_jobs as durable
from durable_jobs import registry, store
from durable_jobs.runtime import zygote
from durable_jobs.runtime.runner import ChildRunner

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_zygote():
    """Each test starts without a zygote and leaves none behind."""
    zygote.close_shared()
    yield
    zygote.close_shared()


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True  # ended; only its parent's bookkeeping is left
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _run_one(runner: ChildRunner, kind: str, **start):
    from durable_jobs.runtime.control import SliceControl
    from durable_jobs.states import Lease

    job = durable.start(kind, **start)
    [claimed] = store.dequeue(["default"], "slot", 60_000, kinds=None, limit=1)
    assert claimed.id == job.id
    lease = Lease(
        job_id=claimed.id, owner=claimed.lease_owner, epoch=claimed.lease_epoch, ttl_ms=60_000
    )
    return runner.run(SliceControl(claimed, registry.get(kind), lease))


def test_every_slots_handler_process_is_forked_from_one_zygote_and_runs_handlers():
    runners = [ChildRunner(role=f"durable-child-{n}", stopping=threading.Event()) for n in range(3)]
    try:
        for runner in runners:
            runner.ensure_started()
        parents = {_parent_of(runner.pid) for runner in runners}
        assert len(parents) == 1 and os.getpid() not in parents, (
            "children of one zygote, not of the worker"
        )
        ran = _run_one(runners[1], "demo.progress_then_fail", input={"steps": 1})
        assert (ran.end, ran.code) == ("failed", "after_progress"), (
            "the handler ran, and wrote its checkpoint"
        )
    finally:
        for runner in runners:
            runner.close()


def test_a_forked_child_killed_mid_slice_is_reported_with_its_signal_and_replaced():
    runner = ChildRunner(role="durable-child-test", stopping=threading.Event())
    try:
        runner.ensure_started()
        pid = runner.pid
        timer = threading.Timer(0.3, lambda: os.killpg(pid, signal.SIGKILL))
        timer.start()
        ran = _run_one(runner, "demo.sleep", input={"seconds": 30, "stubborn": True})
        timer.join()
        assert ran.end == "interrupted" and "died (signal 9)" in ran.message
        assert _gone(pid)
        again = _run_one(runner, "demo.noop")
        assert again.end == "done" and runner.pid != pid
    finally:
        runner.close()


def test_a_zygote_that_dies_is_started_again_for_the_next_child():
    runner = ChildRunner(role="durable-child-test", stopping=threading.Event())
    try:
        runner.ensure_started()
        first_zygote = _parent_of(runner.pid)
        os.kill(first_zygote, signal.SIGKILL)
        assert _gone(first_zygote)
        runner.kill()
        runner.ensure_started()
        assert _parent_of(runner.pid) not in (first_zygote, os.getpid())
        assert _run_one(runner, "demo.noop").end == "done"
    finally:
        runner.close()


def test_a_zygote_that_cannot_start_falls_back_to_starting_children_from_scratch(
    monkeypatch, caplog
):
    # The zygote reads the fault plan from the environment it inherits; it dies once
    # Django is set up, before it says it is ready.
    monkeypatch.setenv("DURABLE_JOBS_FAULTS", "zygote_ready=kill")
    runners = [ChildRunner(role=f"durable-child-{n}", stopping=threading.Event()) for n in range(2)]
    try:
        with caplog.at_level("DEBUG", logger="durable_jobs.worker"):
            for runner in runners:
                runner.ensure_started()
        assert all(_parent_of(runner.pid) == os.getpid() for runner in runners), (
            "spawned by the worker itself"
        )
        warnings = [
            r
            for r in caplog.records
            if r.levelname == "WARNING" and "from scratch" in r.getMessage()
        ]
        assert len(warnings) == 1, "said once, not for every child"
        assert _run_one(runners[0], "demo.noop").end == "done"
    finally:
        for runner in runners:
            runner.close()


@override_settings(DURABLE_JOBS={"START_METHOD": "spawn"})
def test_start_method_spawn_starts_each_child_from_scratch():
    runner = ChildRunner(role="durable-child-test", stopping=threading.Event())
    try:
        runner.ensure_started()
        assert _parent_of(runner.pid) == os.getpid()
        assert _run_one(runner, "demo.noop").end == "done"
    finally:
        runner.close()


def test_a_handler_process_opens_no_connection_its_handler_does_not_need():
    """The connection budget (docs/operations.rst) counts one connection per handler
    process only for handlers that use the database: a forked child must not open one
    on its own, or 64 idle slots hold 64 more connections than they use."""
    from django.db import connection

    runner = ChildRunner(role="durable-child-budget", stopping=threading.Event())
    try:
        runner.ensure_started()
        assert _run_one(runner, "demo.noop").end == "done"
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
                ["%durable-child-budget"],
            )
            assert cursor.fetchone()[0] == 0
        ran = _run_one(runner, "demo.progress_then_fail", input={"steps": 1})
        assert ran.code == "after_progress"
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
                ["%durable-child-budget"],
            )
            assert cursor.fetchone()[0] == 1, (
                "a handler that writes connects, under the slot's name"
            )
    finally:
        runner.close()


def test_start_method_is_forkserver_or_spawn():
    from durable_jobs import conf
    from durable_jobs.exceptions import ConfigurationError

    assert conf.load({}).START_METHOD == "forkserver"
    assert conf.load({"START_METHOD": "spawn"}).START_METHOD == "spawn"
    with pytest.raises(ConfigurationError, match="START_METHOD.*'forkserver', 'spawn'.*'fork'"):
        conf.load({"START_METHOD": "fork"})
