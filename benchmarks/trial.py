"""The throughput machinery on trial: what each mechanism buys on slices that do something.

Each run pre-fills jobs of ``bench.sleep`` (a slice that sleeps ``input["s"]``: work that
waits on I/O, the common case, and the only kind 16 slots can overlap on 2 cores), then
drains them with one ``durable_worker --burst --concurrency S``. Slice lengths: 1 ms,
20 ms, 500 ms, 5 s, and a mix (per 100 jobs: 80 of 1 ms, 15 of 20 ms, 4 of 500 ms, 1 of
5 s, shuffled with a fixed seed but the 5 s ones first, so the run is not as long as
its last-started 5 s slice), at 1, 4 and 16 slots (5 s at 4 and 16 only).

Configurations, each a worker subprocess (see ``settings_bench.py`` and
``bench_app/apps.py`` for how a mechanism is switched off without touching the product):

``all on``            the product defaults (process execution, forkserver zygote, adaptive
                      prefetch up to MAX_PREFETCH's default, send-ahead, C timestamp loader),
                      with ``prepare_threshold = 0`` so the server-binding cursor applies;
``prefetch off``      ``MAX_PREFETCH = 1``: one claim per job;
``send-ahead off``    a batch's runs go to the handler process one at a time;
``zygote off``        ``START_METHOD = "spawn"``: handler processes are plain subprocesses;
``C loader off``      ``durable_jobs.db.C_TIMESTAMPTZ_LOADER = None``;
``server binding off`` ``durable_jobs.db.ServerBindingCursor = None`` (prepare_threshold 0 kept);
``prepare off``       context: ``prepare_threshold`` unset, Django's default;
``thread execution``  context: ``--execution thread`` (handlers on the slot threads).

At each slice length and slot count every configuration runs once, back to back, the
order rotated from one point to the next, so a slow patch of the shared machine is not
all charged to one configuration. Figures: jobs/s over the database-clock window from the
first claim to the last completion, its ratio to "all on" at the same point (below 1:
switching the mechanism off costs that much), and the worker's CPU seconds (its handler
processes included) per job.
"""

from __future__ import annotations

import random

from benchmarks import procs, report
from benchmarks.durable_bench import REPO, TABLE, Ctx, reset

KIND = "bench.sleep"

#: name -> (extra environment, execution)
CONFIGS: dict[str, tuple[dict[str, str], str]] = {
    "all on": ({}, "process"),
    "prefetch off": ({"BENCH_OFF": "prefetch"}, "process"),
    "send-ahead off": ({"BENCH_OFF": "sendahead"}, "process"),
    "zygote off": ({"BENCH_OFF": "zygote"}, "process"),
    "C loader off": ({"BENCH_OFF": "cloader"}, "process"),
    "server binding off": ({"BENCH_OFF": "srvbind"}, "process"),
    "prepare off": ({"BENCH_PREPARE_THRESHOLD": ""}, "process"),
    "thread execution": ({}, "thread"),
}
BASE_ENV = {"BENCH_PREPARE_THRESHOLD": "0", "BENCH_OFF": ""}

SLICES = ("1 ms", "20 ms", "500 ms", "5 s", "mix")
SECONDS = {"1 ms": 0.001, "20 ms": 0.02, "500 ms": 0.5, "5 s": 5.0}
SLOTS = (1, 4, 16)

#: jobs per run, by (slice, slots): a few seconds of work per configuration.
JOBS = {
    ("1 ms", 1): 2000, ("1 ms", 4): 2000, ("1 ms", 16): 2000,
    ("20 ms", 1): 100, ("20 ms", 4): 400, ("20 ms", 16): 800,
    ("500 ms", 1): 4, ("500 ms", 4): 16, ("500 ms", 16): 64,
    ("5 s", 4): 8, ("5 s", 16): 32,
    ("mix", 1): 100, ("mix", 4): 300, ("mix", 16): 1200,
}  # fmt: skip
MIX = ((0.001, 80), (0.02, 15), (0.5, 4), (5.0, 1))

INSERT = f"""
INSERT INTO {TABLE} (id, tenant_id, kind, status, created_at, updated_at, queue_name,
                     next_run_at, pending_since, input)
SELECT gen_random_uuid(), 'default', %(kind)s, 'pending', now(), now(), 'default',
       clock_timestamp(), now(), jsonb_build_object('s', s)
  FROM unnest(%(seconds)s::float8[]) WITH ORDINALITY AS t(s, i) ORDER BY i
"""


def durations(slice_name: str, n: int) -> list[float]:
    if slice_name != "mix":
        return [SECONDS[slice_name]] * n
    out = [s for s, per_100 in MIX for _ in range(max(1, per_100 * n // 100))]
    random.Random(6).shuffle(out)
    # The 5 s slices first: one started last would make the run's length its own.
    return sorted(out, key=lambda s: s < 5.0)


def points(quick: bool) -> list[tuple[str, int, int]]:
    """(slice, slots, jobs) of every point; ``quick``: a tenth of the jobs, 5 s left out."""
    out = []
    for name in SLICES:
        for slots in SLOTS:
            n = JOBS.get((name, slots))
            if n is None or (quick and name == "5 s"):
                continue
            out.append((name, slots, max(slots, n // 10) if quick else n))
    return out


def run_point(ctx: Ctx, config: str, seconds: list[float], *, slots: int, tag: str, timeout: float):
    extra, execution = CONFIGS[config]
    reset()
    ctx.sql(INSERT, {"kind": KIND, "seconds": seconds})
    ctx.sql(f"VACUUM (ANALYZE) {TABLE}")
    env = ctx.worker_env() | BASE_ENV | extra
    cmd = ctx.worker_cmd(slots, burst=True, execution=execution)
    log = ctx.logs / f"trial-{tag}.log"
    (result,) = procs.Group([cmd], env=env, cwd=REPO, logs=[log]).wait(timeout)
    completed, total, window = ctx.sql(
        f"""SELECT count(*) FILTER (WHERE status = 'completed'), count(*),
                   extract(epoch FROM max(finished_at) - min(started_at))
              FROM {TABLE} WHERE kind = %s""",
        [KIND],
    )[0]
    figures = procs.drain_figures(
        [result],
        n=len(seconds),
        completed=completed,
        rows=total,
        window=window,
        server_cpu=(None, None),
        logs=[log],
    )
    return figures | {
        "work_seconds": sum(seconds),
        "cpu_ms_per_job": 1000 * result.cpu_seconds / len(seconds),
    }


def run(ctx: Ctx, *, quick: bool, timeout: float, configs: list[str] | None = None) -> dict:
    names = configs or list(CONFIGS)
    results: dict[str, dict[str, dict]] = {}
    for i, (slice_name, slots, n) in enumerate(points(quick)):
        key = f"{slice_name} x {slots}"
        seconds = durations(slice_name, n)
        order = names[i % len(names) :] + names[: i % len(names)]
        print(f"    trial {key}: {len(seconds)} jobs, {len(order)} configurations", flush=True)
        results[key] = {}
        for config in order:
            tag = f"{slice_name.replace(' ', '')}-{slots}-{config.replace(' ', '-')}"
            results[key][config] = run_point(
                ctx, config, seconds, slots=slots, tag=tag, timeout=timeout
            )
    return {"configs": names, "points": results}


def tables(trial: dict) -> str:
    """The trial's tables: all-on jobs/s, each configuration's ratio to it, CPU per job."""
    names = trial["configs"]
    keys = list(trial["points"])
    width = max(len(k) for k in keys)

    def grid(title: str, cell) -> list[str]:
        head = [title, "point".ljust(width) + "  " + "  ".join(f"{c:>13.13}" for c in names)]
        for key in keys:
            row = trial["points"][key]
            base = row.get(names[0], {})
            cells = "  ".join(f"{cell(row.get(c, {}), base):>13}" for c in names)
            head.append(key.ljust(width) + "  " + cells)
        return head

    def rate(r, base):
        if not r.get("verified"):
            return "failed"
        return report.num(r["per_second"], 0 if r["per_second"] >= 100 else 1)

    def ratio(r, base):
        if not r.get("verified") or not base.get("verified"):
            return "failed"
        return f"{r['per_second'] / base['per_second']:.2f}"

    def cpu(r, base):
        return "failed" if not r.get("verified") else f"{r['cpu_ms_per_job']:.2f}"

    lines = grid("jobs/s (database-clock window)", rate)
    lines += ["", *grid("ratio to 'all on' (jobs/s; < 1: switching it off costs)", ratio)]
    lines += ["", *grid("worker CPU ms per job (handler processes included)", cpu)]
    return "\n".join(lines)
