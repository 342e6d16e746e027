"""Flow control (``--only flow``): what each limit costs, and the bounds it keeps.

* throughput of ``n`` no-op jobs drained by one ``durable_worker --burst`` at 4 and 16
  slots: unkeyed (the default claim), keyed without limits, a concurrency limit, a
  non-binding rate limit, and fair claiming across tenants; the same run, interleaved;
* the claim statement's server time (EXPLAIN ANALYZE, limit 1) in each of those shapes;
* DEQUEUE flat: its server time with 10 and with ``blocked`` jobs waiting on a full key,
  other keys' jobs claimable behind them;
* the fairness bound: claims (limit 1, as a slot makes them) from a tenant's single job's
  start to its claim, while another tenant's ``blocked``-job flood waits, against the
  unfair order (the flood's jobs all keyless: the lone job waits for the whole flood).

Rows are written by SQL exactly as ``start()`` writes them (the flow key included), all of
kind ``bench.noop``; limits are an operator's (``store.set_flow_limit``), so the workers
need no settings of their own.
"""

from __future__ import annotations

import time
import uuid

from django.db import connection

from benchmarks import durable_bench as bench
from durable_jobs import conf, store
from durable_jobs.models import TABLE

FILL_KEYED = f"""
INSERT INTO {TABLE} (id, tenant_id, kind, status, created_at, updated_at, queue_name,
                     next_run_at, pending_since, flow_key)
SELECT gen_random_uuid(), %(tenant)s || CASE WHEN %(tenants)s > 1 THEN (i %% %(tenants)s)::text ELSE '' END,
       %(kind)s, 'pending', now(), now(), 'default', clock_timestamp(), now(),
       CASE WHEN %(keys)s = 0 THEN NULL
            WHEN %(prefix)s = 'tenant:' THEN 'tenant:' || %(tenant)s
                 || CASE WHEN %(tenants)s > 1 THEN (i %% %(tenants)s)::text ELSE '' END
            ELSE %(prefix)s || (i %% %(keys)s)::text END
  FROM generate_series(1, %(n)s) AS i
"""

#: name -> (keys, key prefix, tenants, operator limits per key)
SHAPES = {
    "unkeyed (default claim)": (0, "", 1, {}),
    "keyed, no limit (8 keys)": (8, "bench:k", 1, {}),
    "concurrency 2 per key (8 keys)": (8, "bench:k", 1, {"concurrency": 2}),
    "rate 1,000,000/s, not binding (1 key)": (
        1,
        "bench:r",
        1,
        {"rate": 1_000_000, "rate_window_ms": 1000},
    ),
    "fair across 8 tenants": (8, "tenant:", 8, {}),
}


def _fill(n: int, keys: int, prefix: str, tenants: int, *, tenant: str = "t") -> None:
    with connection.cursor() as cur:
        cur.execute(
            FILL_KEYED,
            {
                "n": n,
                "keys": keys,
                "prefix": prefix,
                "tenants": tenants,
                "tenant": tenant,
                "kind": bench.KIND,
            },
        )
        cur.execute(f"ANALYZE {TABLE}")


def _limit_keys(keys: int, prefix: str, tenants: int, limits: dict) -> None:
    names = (
        [f"tenant:t{i}" for i in range(tenants)]
        if prefix == "tenant:"
        else [f"{prefix}{i}" for i in range(keys)]
    )
    for key in names:
        store.set_flow_limit(key, **limits)


def _reset() -> None:
    bench.reset()
    with connection.cursor() as cur:
        cur.execute("DELETE FROM durable_jobs_flow_key")


def _params(limit: int = 1) -> dict:
    settings = conf.get()
    return store.claim_params(
        [settings.DEFAULT_QUEUE],
        f"bench:{uuid.uuid4().hex[:6]}",
        conf.ms(settings.LEASE_TTL),
        kinds=None,
        limit=limit,
    )


def shapes(ctx: bench.Ctx, n: int, *, slots: tuple[int, ...], reps: int, timeout: float) -> dict:
    """Throughput at each slot count and the claim's server time, for each shape."""
    out: dict = {}
    for name, (keys, prefix, tenants, limits) in SHAPES.items():
        entry: dict = {}
        for count in slots:
            _reset()
            _fill(n, keys, prefix, tenants)
            _limit_keys(keys, prefix, tenants, limits)
            run = bench.throughput_prefilled(
                ctx, n, processes=1, slots=count, tag=f"flow-{keys}-{count}", timeout=timeout
            )
            entry[f"throughput_{count}"] = run.get("per_second")
        _reset()
        _fill(max(1000, n), keys, prefix, tenants)
        _limit_keys(keys, prefix, tenants, limits)
        # The statement a worker runs for this shape: the default claim without keys.
        statement = store.DEQUEUE_OPEN if keys == 0 else store.DEQUEUE
        entry["dequeue_ms"] = bench._pct(
            [bench._explain_time(statement, _params()) for _ in range(reps)], 50
        )
        out[name] = entry
    return out


def flat(ctx: bench.Ctx, blocked: int, *, reps: int) -> dict:
    """DEQUEUE's server time with 10 and with ``blocked`` jobs waiting on a full key."""
    out = {}
    for waiting in (10, blocked):
        _reset()
        _fill(waiting + 1, 1, "bench:full", 1)
        store.set_flow_limit("bench:full0", concurrency=1)
        store.dequeue(
            ["default"], "bench:holder", 600_000, kinds=None, limit=1, flow="{}"
        )  # takes the permit
        _fill(200, 50, "bench:other", 1)  # other keys' jobs, behind the blocked ones
        out[waiting] = bench._pct(
            [bench._explain_time(store.DEQUEUE, _params()) for _ in range(reps)], 50
        )
        claimed = store.dequeue(["default"], "bench:w", 600_000, kinds=None, limit=10, flow="{}")
        assert claimed and all(j.flow_key != "bench:full0" for j in claimed)
    return {
        "blocked_small": 10,
        "blocked": blocked,
        "ms_small": out[10],
        "ms_blocked": out[blocked],
    }


def fairness(ctx: bench.Ctx, flood: int, *, history: int = 100) -> dict:
    """Claims from the lone tenant's start to its claim, fair (tenant keys) and unfair."""
    out = {}
    for fair in (True, False):
        _reset()
        _fill(flood, 1 if fair else 0, "tenant:", 1, tenant="flood")
        for _ in range(history):
            store.dequeue(["default"], "bench:w", 600_000, kinds=None, limit=1, flow="{}")
        lone = uuid.uuid4()
        with connection.cursor() as cur:
            cur.execute(
                f"INSERT INTO {TABLE} (id, tenant_id, kind, status, created_at, updated_at, queue_name,"
                " next_run_at, pending_since, flow_key) VALUES (%s, 'lone', %s, 'pending', now(), now(),"
                " 'default', clock_timestamp(), now(), %s)",
                [lone, bench.KIND, "tenant:lone" if fair else None],
            )
        if fair:
            claims, began = 0, time.perf_counter()
            while True:
                claims += 1
                got = store.dequeue(["default"], "bench:w", 600_000, kinds=None, limit=1, flow="{}")
                if not got or got[0].id == lone:
                    break
            out["fair"] = {"claims_until_lone": claims, "seconds": time.perf_counter() - began}
        else:
            # The unfair order claims every flood job due before it first: its place in
            # the (priority, run time) order, counted rather than drained.
            with connection.cursor() as cur:
                cur.execute(
                    f"SELECT count(*) + 1 FROM {TABLE} WHERE status = 'pending' AND id <> %s"
                    " AND next_run_at <= (SELECT next_run_at FROM " + TABLE + " WHERE id = %s)",
                    [lone, lone],
                )
                out["unfair"] = {"claims_until_lone": cur.fetchone()[0]}
    out["flood"] = flood
    return out
