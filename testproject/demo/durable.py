"""Demo and test handlers, discovered at startup like admin.py."""

from __future__ import annotations

import os
import time

import durable_jobs as durable
from testproject.demo.models import Effect, Report


def mirror_report(job, outcome: str) -> None:
    """Reflect the job's outcome onto its Report, inside the terminal transaction."""
    if job.subject_type == "demo.report":
        Report.objects.filter(pk=job.subject_id).update(
            status=outcome, rows_written=job.processed_count
        )
        if os.environ.get("DEMO_FAIL_MIRROR"):
            raise RuntimeError("mirror refused (DEMO_FAIL_MIRROR)")


@durable.handler("demo.import", mirror=mirror_report)
def import_rows(job: durable.Slice):
    """Write ``input.rows`` effects in batches, checkpointing after each batch.

    ``input.delay`` seconds per batch makes it slow enough to watch, kill or stall.
    """
    total = int(job.input.get("rows", 10))
    batch = int(job.input.get("batch", 2))
    delay = float(job.input.get("delay", 0.0))
    cursor = (job.checkpoint or {}).get("next", 0)
    while cursor < total:
        time.sleep(delay)
        upto = min(total, cursor + batch)
        with job.fenced():
            for item in range(cursor, upto):
                Effect.objects.create(job_id=job.id, item=item, epoch=job.lease.epoch)
            job.save_checkpoint({"next": upto}, processed=upto, total=total)
        cursor = upto
        if cursor < total and job.should_yield():
            return durable.YIELD
    return durable.Done({"rows": total})


@durable.handler("demo.flaky")
def flaky(job: durable.Slice):
    """Fail transiently ``input.failures`` times, then succeed."""
    if job.attempt <= int(job.input.get("failures", 2)):
        raise durable.TransientError(f"attempt {job.attempt} failed on purpose", code="flaky")
    return durable.Done({"attempts": job.attempt})


@durable.handler("demo.always_fails")
def always_fails(job: durable.Slice):
    """Fail every slice transiently: ends failed/retry_exhausted."""
    raise durable.TransientError(f"attempt {job.attempt} failed", code="always")


@durable.handler("demo.progress_then_fail")
def progress_then_fail(job: durable.Slice):
    """Commit one unit, then fail, ``input.steps`` times; then finish.

    Each failure follows a committed unit, so the consecutive-failure count never
    builds up (invariant 7) however many failures there are in all.
    """
    step = (job.checkpoint or {}).get("step", 0)
    if step >= int(job.input["steps"]):
        return durable.Done({"steps": step})
    job.save_checkpoint({"step": step + 1}, processed=step + 1)
    raise durable.TransientError(f"failed after step {step + 1}", code="after_progress")


@durable.handler("demo.sleep")
def sleep(job: durable.Slice):
    """Sleep ``input.seconds`` in all without touching the database, then finish.

    The time slept so far is checkpointed when the slice yields, so a long sleep spans
    slices. ``input.stubborn`` ignores should_yield(), like a handler stuck in a long call.
    """
    remaining = float(job.input.get("seconds", 1)) - float((job.checkpoint or {}).get("slept", 0))
    began = time.monotonic()
    while time.monotonic() - began < remaining:
        if job.should_yield() and not job.input.get("stubborn"):
            slept = float((job.checkpoint or {}).get("slept", 0)) + time.monotonic() - began
            job.save_checkpoint({"slept": slept})
            return durable.YIELD
        time.sleep(0.05)
    return durable.DONE


@durable.handler("demo.suicide")
def suicide(job: durable.Slice):
    """Kill the worker process running it: a poison job (never commits anything)."""
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


@durable.handler("demo.noop")
def noop(job: durable.Slice):
    """Do nothing: for measuring the machinery itself."""
    return durable.DONE


@durable.handler("demo.brief")
def brief(job: durable.Slice):
    """Sleep ``input.seconds`` (default 0) in one go and finish: a short slice of a set length."""
    time.sleep(float(job.input.get("seconds", 0)))
    return durable.DONE


def sleeping_mirror(job, outcome: str) -> None:
    """A mirror that holds the job's row (the terminal transaction) for ``input.mirror_seconds``."""
    time.sleep(float(job.input.get("mirror_seconds", 0)))


@durable.handler("demo.slow_mirror", mirror=sleeping_mirror)
def slow_mirror(job: durable.Slice):
    """Finish at once; the slowness is all in the mirror, with the row locked."""
    return durable.DONE


@durable.handler("demo.long_fence")
def long_fence(job: durable.Slice):
    """One fenced unit that spends ``input.seconds`` on the server (``pg_sleep``), then writes.

    Nothing is committed before the unit ends, so a connection cut inside it shows how
    the slice's end is charged. From the ``input.short_after``-th re-drive on it is quick.
    """
    from django.db import connection

    seconds = float(job.input.get("seconds", 1))
    if job.row.redrives >= int(job.input.get("short_after", 10**6)):
        seconds = 0.1
    with job.fenced():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(%s)", [seconds])
        Effect.objects.create(job_id=job.id, item=0, epoch=job.lease.epoch)
    return durable.Done({"written": 1})


@durable.handler("demo.nested_fence")
def nested_fence(job: durable.Slice):
    """A fenced write inside the handler's own ``atomic()``, which then stays open
    ``input.hold`` seconds: the row stays locked past the fence until the outer commit."""
    from django.db import transaction

    with transaction.atomic():
        with job.fenced():
            Effect.objects.create(job_id=job.id, item=0, epoch=job.lease.epoch)
        time.sleep(float(job.input.get("hold", 0)))
    time.sleep(float(job.input.get("after", 0)))
    return durable.DONE


@durable.handler("demo.spawner")
def spawner(job: durable.Slice):
    """Start a long-lived subprocess, record its pid in the checkpoint, then never return:
    whatever ends this handler must end what it started too."""
    import subprocess

    child = subprocess.Popen(["sleep", "300"])
    job.save_checkpoint({"grandchild": child.pid})
    while True:
        time.sleep(0.1)


@durable.handler("demo.tree")
def tree(job: durable.Slice):
    """Spawn ``input.children`` ``demo.leaf`` children, ``input.batch`` per fenced
    transaction, each batch's checkpoint in a transaction of its own (so a crash can land
    between a spawn and its checkpoint), wait for them all, then write one summary effect
    (item -1) and finish with the children's count."""
    children, batch = int(job.input["children"]), int(job.input.get("batch", 100))
    state = job.checkpoint or {"spawned": 0}
    while state["spawned"] < children:
        upto = min(children, state["spawned"] + batch)
        with job.fenced():
            job.spawn_many(
                [
                    {
                        "kind": "demo.leaf",
                        "key": f"{i:06d}",
                        "input": {"i": i, **job.input.get("leaf", {})},
                    }
                    for i in range(state["spawned"], upto)
                ]
            )
        state = {"spawned": upto}
        job.save_checkpoint(state)
        if state["spawned"] < children and job.should_yield():
            return durable.YIELD
    if not state.get("waited"):
        job.save_checkpoint({**state, "waited": True})
        return job.wait_for_children(policy=job.input.get("policy", "continue"))
    outcomes = job.children()
    with job.fenced():
        Effect.objects.create(job_id=job.id, item=-1, epoch=job.lease.epoch)
    return durable.Done(
        {"children": len(outcomes), "completed": sum(c.status == "completed" for c in outcomes)}
    )


@durable.handler("demo.leaf")
def leaf(job: durable.Slice):
    """One child of ``demo.tree``: sleep ``input.delay``, write one effect (item ``input.i``),
    with the checkpoint that says so in the same fenced transaction (a re-run after a
    crash between that commit and the completion writes nothing again)."""
    time.sleep(float(job.input.get("delay", 0)))
    if not job.checkpoint:
        with job.fenced():
            Effect.objects.create(job_id=job.id, item=job.input["i"], epoch=job.lease.epoch)
            job.save_checkpoint({"written": True})
    return durable.Done({"i": job.input["i"]})


@durable.handler("demo.limited", flow=durable.FlowControl(key="input:account", concurrency=2))
def limited(job: durable.Slice):
    """At most two at once per ``input.account``: record a start and an end effect (items 0
    and 1, fenced, with the epoch) around ``input.seconds`` of work, so a test can see
    every pair of slices that overlapped and every write a stale holder tried to land."""
    with job.fenced():
        Effect.objects.create(job_id=job.id, item=0, epoch=job.lease.epoch)
    time.sleep(float(job.input.get("seconds", 0.5)))
    with job.fenced():
        Effect.objects.create(job_id=job.id, item=1, epoch=job.lease.epoch)
    return durable.DONE
