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
