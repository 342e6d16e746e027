"""Handlers the benchmark starts.

``bench.noop`` does nothing, so what is measured is the machinery alone; ``bench.sleep``
sleeps ``input["s"]`` seconds, a slice that waits on I/O (the trial's 1 ms to 5 s slices).
"""

from __future__ import annotations

import time

import durable_jobs as durable


@durable.handler("bench.noop")
def noop(job: durable.Slice):
    return durable.DONE


@durable.handler("bench.sleep")
def sleep(job: durable.Slice):
    time.sleep(float(job.input["s"]))
    return durable.DONE
