"""Handlers the benchmark starts.

``bench.noop`` does nothing, so what is measured is the machinery alone; ``bench.sleep``
sleeps ``input["s"]`` seconds, a slice that waits on I/O (the trial's 1 ms to 5 s slices).
"""

from __future__ import annotations

import os
import time

import durable_jobs as durable


@durable.handler("bench.noop")
def noop(job: durable.Slice):
    return durable.DONE


@durable.handler("bench.sleep")
def sleep(job: durable.Slice):
    time.sleep(float(job.input["s"]))
    return durable.DONE


# The schedules scenario (benchmarks/schedules_bench.py): BENCH_SCHEDULES yearly schedules,
# so none comes due by itself while their idle cost is measured.
for _n in range(int(os.environ.get("BENCH_SCHEDULES") or 0)):
    durable.schedule("bench.noop", "0 0 1 1 *", name=f"bench.yearly.{_n}", catch_up="skip")


@durable.handler("bench.fanout")
def fanout(job: durable.Slice):
    """Spawn ``input["n"]`` no-op children in one statement, wait for all, count them.

    The spawn's own time (the fenced transaction, commit included) goes into the result,
    so the benchmark reads it from the row.
    """
    if not job.checkpoint:
        began = time.perf_counter()
        with job.fenced():
            job.spawn_many([{"kind": "bench.noop", "key": str(i)} for i in range(job.input["n"])])
            job.save_checkpoint({"spawned": job.input["n"]})
        job.save_checkpoint({"spawned": job.input["n"], "spawn_s": time.perf_counter() - began})
        return job.wait_for_children()
    done = sum(1 for child in job.children() if child.status == "completed")
    return durable.Done({"completed": done, "spawn_s": job.checkpoint["spawn_s"]})


def _long_slices(job: durable.Slice):
    """Batches of ``input["batch"]`` seconds of sleep, each one checkpointed, for
    ``input["slices"]`` slices: the handler loop the docs recommend (save a checkpoint per
    batch, return ``YIELD`` when ``should_yield()`` says so), for the bookkeeping scenario
    (benchmarks/bookkeeping_bench.py). The last slice completes the job."""
    done = job.checkpoint or {"batches": 0}
    while True:
        time.sleep(float(job.input["batch"]))
        done = {"batches": done["batches"] + 1}
        job.save_checkpoint(done, processed=done["batches"])
        if job.should_yield():
            last = job.continuation + 1 >= int(job.input["slices"])
            return durable.Done(done) if last else durable.YIELD


# One kind per slice length (the slice budget is a kind's setting): bench.slice1 runs 1 s
# slices, bench.slice20 20 s ones. Everything else is the library's default.
for _seconds in (1, 2, 5, 20):
    durable.handler(f"bench.slice{_seconds}", slice_budget=float(_seconds))(_long_slices)
