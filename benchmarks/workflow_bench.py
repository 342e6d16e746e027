"""The ``workflows`` scenario: fan-out at bulk-start speed, fan-in without a lease.

One ``bench.fanout`` job spawns N ``bench.noop`` children in one slice (``spawn_many``:
one statement, like ``start_many``), waits for them holding no lease, and resumes to count
them. A burst worker runs the whole tree. Figures:

* the spawn's own seconds (the fenced transaction, its commit included; read from the
  parent's result) and ``start_many`` of the same N, in one transaction, for reference;
* how long after its last child ended the parent finished (database clock): the wake-up
  is written by that child's own terminal statement, so this is the claim's latency (the
  worker's poll or its next dequeue) plus one short slice;
* the tree's integrity: exactly N children, all completed, one summary.
"""

from __future__ import annotations

import time

import durable_jobs as durable
from benchmarks import procs
from benchmarks.durable_bench import REPO, TABLE, Ctx, bulk_start, reset


def run(ctx: Ctx, n: int, *, timeout: float) -> dict:
    reference = bulk_start(n)
    reset()
    parent = durable.start("bench.fanout", input={"n": n})
    began = time.perf_counter()
    group = procs.Group(
        [ctx.worker_cmd(4, burst=True)],
        env=ctx.worker_env(),
        cwd=REPO,
        logs=[ctx.logs / "durable-workflows.log"],
    )
    group.wait(timeout)
    elapsed = time.perf_counter() - began
    (status, result, children, completed, lag) = ctx.sql(
        f"""SELECT p.status, p.result,
                   (SELECT count(*) FROM {TABLE} WHERE parent_id = p.id),
                   (SELECT count(*) FROM {TABLE} WHERE parent_id = p.id AND status = 'completed'),
                   extract(epoch FROM p.finished_at
                           - (SELECT max(finished_at) FROM {TABLE} WHERE parent_id = p.id))
              FROM {TABLE} AS p WHERE p.id = %s""",
        [parent.id],
    )[0]
    result = result or {}
    return {
        "n": n,
        "status": status,
        "children": children,
        "completed": completed,
        "summary": result.get("completed"),
        "spawn_seconds": result.get("spawn_s"),
        "spawn_per_second": n / result["spawn_s"] if result.get("spawn_s") else None,
        "start_many_seconds": reference.get("seconds"),
        "parent_done_after_last_child_s": float(lag) if lag is not None else None,
        "tree_seconds": elapsed,
    }
