"""Handlers the benchmark starts: a no-op, so what is measured is the machinery alone."""

from __future__ import annotations

import durable_jobs as durable


@durable.handler("bench.noop")
def noop(job: durable.Slice):
    return durable.DONE
