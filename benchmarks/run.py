"""``python -m benchmarks``: every scenario, one command, one table.

The run starts its own PostgreSQL (an embedded server with fsync on, or the server of
``DATABASE_URL``, on which it creates and later drops its own databases), builds the
peers' virtual environments under ``benchmarks/.venvs/``, runs each scenario, prints a
table with a PASS/MISS column against the targets, and writes the table, the machine,
the versions, the settings, the EXPLAIN plans and the raw figures to
``benchmarks/results/<timestamp>.md`` (and ``.json``).

Scenarios (``--only`` picks some):

``start``       ``durable.start()`` one per transaction, one client; the peers' equivalent;
                a 1-row INSERT+COMMIT baseline; bulk start (``durable.start_many`` if present).
``throughput``  N pre-filled no-op jobs drained by ``durable_worker --burst`` at 1 slot, 4 slots,
                and 2 processes × 2 slots (peers side by side, interleaved); completions
                counted in SQL; the workers' peak RSS (VmHWM) and CPU per job.
``latency``     M single starts to an idle 4-slot worker, NOTIFY path and poll path;
                ``started_at - created_at`` (database clock) percentiles computed in SQL.
``heartbeat``   ``store.heartbeat`` in a loop on one lease; HOT share from pg_stat_user_tables.
``size``        dequeue and reconciler-pass time with 0 / 100k (/ 1M with --large) finished
                rows; EXPLAIN (ANALYZE, BUFFERS) of DEQUEUE and the reconciler's selections.
``scale``       throughput by total slots (1 to 64), claim contention, wake-ups per start.
``priorities``  100,000 due jobs across priorities: DEQUEUE flat, priority order kept.
``memory``      a long-running worker's RSS over many jobs.
``schedules``   2 idle workers with 0 and with 1,000 schedules: the fleet's statements/s
                (pg_stat_database xact_commit deltas); then all 1,000 ticks made due at once.
``workflows``   one parent spawns 10,000 children in one slice (--quick 1,000), waits for them
                with no lease, and resumes: spawn seconds beside ``start_many``, how soon the
                parent finishes after its last child, and the tree's integrity.
``flow``        flow control: throughput and claim time with each limit at 4 and 16 slots,
                DEQUEUE flat beside a full key's backlog, the fairness bound against a
                flood (``benchmarks/flow_bench.py``).
``transports``  the database transport against RabbitMQ and Redis Streams at 4, 16 and 64
                slots over several processes: jobs/s, start-to-claim latency, commits and
                server CPU per job (``benchmarks/transport_bench.py``).
``churn``       (~40 s) short jobs drained by one 4-slot worker
                undisturbed and with two of its backends terminated every second:
                jobs/s ratio, the backlog's drain after the churn, warnings, re-drives
                (``benchmarks/churn_bench.py``).
``sustained``   (only with --only sustained) a default fleet's peak, then a producer at 80 % of it
                for --sustained-minutes (default 10; --quick 20 s): first minute against last,
                the worst 10 s, dead tuples, autovacuums, sizes (``benchmarks/sustained_bench.py``).
``trial``       (only with --only trial) each throughput mechanism switched off vs all on,
                on 1 ms to 5 s slices at 1, 4 and 16 slots (``benchmarks/trial.py``).
``bookkeeping``  (only with --only bookkeeping; pg_stat_statements preloaded) statements per
                1 s, 5 s and 20 s slice by role; heartbeat statements/s and server CPU for
                10,000 leases over 20 Heartbeaters (``benchmarks/bookkeeping_bench.py``).
``profile``     (only with --profile) statements per slice from pg_stat_statements, CPU per job,
                a py-spy profile of the 4-slot worker, and the 1-slot drain and start() with
                the operator console's five newest-first indexes whole (before migration
                0017), as built (the claim's version kept out), and without them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from benchmarks import procs, report
from benchmarks import server as server_mod
from benchmarks.django_env import setup_django

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
SCENARIOS = (
    "start",
    "throughput",
    "latency",
    "heartbeat",
    "size",
    "scale",
    "priorities",
    "memory",
    "schedules",
    "workflows",
    "flow",
    "transports",
    "duty",
    "churn",
    "steady",
)
#: Run only when named in ``--only``: the trial takes ~15 minutes on 2 cores by itself, the
#: horizon and the sustained run several minutes each; the bookkeeping scenario ~3 minutes,
#: and it needs pg_stat_statements preloaded (a setting the other scenarios are not
#: measured with); the brief pin over a backlog about two minutes.
EXTRA_SCENARIOS = ("trial", "horizon", "sustained", "bookkeeping", "pinburst")

#: How long (seconds) the ``pinburst`` scenario pins the horizon over a backlog: longer
#: than any claim takes, short enough that the 40,000 jobs outlast it at full speed.
PIN_BURST_SECONDS = 5.0

#: Goals, each keyed by what it measures. PASS/MISS never fails the command.
TARGETS = {
    "throughput_4": 1500.0,  # no-op jobs/s drained at 4 slots
    "latency_notify_p99_ms": 5.0,  # p99 claim latency of a single start, NOTIFY path
    "start_vs_pgqueuer": 1.5,  # start() rate / pgqueuer enqueue() rate, same run
    "start_vs_pgbench": 0.5,  # start() rate / pgbench's insert-only rate, same run
    # our jobs/s / pgqueuer's default worker process (issue #27: 1.0x at 1 slot, 1.3x at 4)
    "throughput_vs_pgqueuer": {"1x1": 1.0, "1x4": 1.3},
    # start() in atomic() / the same row's bare INSERT through Django's cursor in atomic()
    "start_vs_insert_in_atomic": 1.3,
    # jobs/s x 20 ms / slots for 20 ms jobs: the share of a slot's time the work gets
    "duty_20ms": 0.95,
    "latency_poll_slack_ms": 20.0,  # poll path: p99 <= poll interval + this
    "bulk_start": 20000.0,  # start_many() jobs/s
    "dequeue_growth": 0.10,  # DEQUEUE at 1M finished rows within 10 % of an empty table
    "hot_share": 0.95,  # share of heartbeat updates that are HOT
    "memory_growth_mib": 5.0,  # worker RSS growth after warm-up
    "churn_ratio": 0.8,  # jobs/s with 2 backends terminated a second / undisturbed
    "churn_drain_ratio": 0.9,  # the backlog's drain rate after the churn / undisturbed
    # statements a long slice costs besides its heartbeats and the handler's own checkpoints
    # (a claim, the yield or completion, their transactions): constant in the slice's length
    "slice_bookkeeping_statements": 10.0,
    # heartbeat statements per heartbeat interval of one worker (one Heartbeater) holding
    # many leases: a beat takes along the leases due within a quarter interval
    "heartbeat_statements_per_worker_interval": 4.0,
    "sustained_ratio": 0.9,  # last minute's jobs/s / first minute's, at 80 % of the peak
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run (about 4 minutes on 2 cores): small N, fewer samples",
    )
    parser.add_argument(
        "--large", action="store_true", help="also measure with 1,000,000 finished rows"
    )
    parser.add_argument(
        "--n", type=int, help="no-op jobs per throughput run (default 5000; --quick 500)"
    )
    parser.add_argument(
        "--latency-jobs", type=int, help="single jobs per latency run (default 200; --quick 20)"
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        help="POLL_INTERVAL of the poll-path latency run, seconds (default 1, the library default)",
    )
    parser.add_argument(
        "--repeat", type=int, help="throughput rounds, median reported (default 3; --quick 1)"
    )
    parser.add_argument("--no-peers", action="store_true", help="measure durable_jobs only")
    parser.add_argument(
        "--peers",
        help="comma-separated peers to measure (default: all of pgqueuer, procrastinate, tasks_db)",
    )
    parser.add_argument(
        "--execution",
        choices=("process", "thread"),
        default="process",
        help="durable_worker --execution for every durable_jobs run (default: process, "
        "the product default)",
    )
    parser.add_argument(
        "--only",
        help=f"comma-separated scenarios among {', '.join(SCENARIOS + EXTRA_SCENARIOS)} "
        "(default: all but trial)",
    )
    parser.add_argument(
        "--memory-jobs",
        type=int,
        help="jobs the memory scenario runs through one worker (default 100,000; --quick 5,000; "
        "1,000,000 takes about an hour here)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile the 4-slot worker (pg_stat_statements, py-spy); "
        "restarts the server once",
    )
    parser.add_argument(
        "--pin-seconds",
        type=float,
        default=120.0,
        help="horizon scenario: how long a session holds its XID (default 120; 600 for issue #27)",
    )
    parser.add_argument(
        "--horizon-rate",
        type=float,
        default=1000.0,
        help="horizon scenario: starts per second during the run (default 1,000)",
    )
    parser.add_argument(
        "--sustained-minutes",
        type=float,
        help="sustained scenario: minutes of the steady run (default 10; --quick 20 s)",
    )
    parser.add_argument(
        "--sustained-peak",
        type=float,
        help="sustained scenario: the fleet's peak jobs/s (default: measured by a backlog drain)",
    )
    parser.add_argument(
        "--sustained-naptime",
        type=float,
        help="sustained scenario: the embedded server's autovacuum_naptime, seconds, for the "
        "run (default: the server's, 60)",
    )
    parser.add_argument(
        "--output", type=Path, help="results file (default benchmarks/results/<timestamp>.md)"
    )
    return parser.parse_args(argv)


class Plan:
    def __init__(self, args: argparse.Namespace) -> None:
        quick = args.quick
        self.quick = quick
        self.n = args.n or (500 if quick else 5000)
        self.start_n = 200 if quick else 1000
        self.latency_m = args.latency_jobs or (20 if quick else 200)
        self.gap = 0.03
        self.latency_slots = 4
        self.poll_interval = args.poll_interval
        self.hb_seconds = 2.0 if quick else 5.0
        self.sizes = [0, 10_000] if quick else [0, 100_000]
        if args.large:
            self.sizes.append(1_000_000)
        self.backlogs = [1_000, 10_000] if quick else [1_000, 10_000, 100_000]
        self.dq_reps = 50 if quick else 200
        self.passes = 5 if quick else 20
        self.explain_reps = 10 if quick else 30
        self.worker_timeout = 120 if quick else 600
        self.pin_seconds = args.pin_seconds
        self.horizon_rate = args.horizon_rate
        # bookkeeping: slice lengths (s), jobs x slices each at 2 slots; leases over owners
        self.slice_lengths = [1, 2] if quick else [1, 5, 20]
        self.lease_count, self.lease_owners = (1_000, 5) if quick else (10_000, 20)
        minutes = args.sustained_minutes or (1 / 3 if quick else 10.0)
        self.sustained_seconds = minutes * 60
        self.sustained_peak = args.sustained_peak
        self.sustained_naptime = args.sustained_naptime
        self.sustained_backlog = 2_000 if quick else 20_000
        self.repeat = args.repeat or (1 if quick else 3)
        self.scenarios = [s.strip() for s in args.only.split(",")] if args.only else list(SCENARIOS)
        unknown = set(self.scenarios) - set(SCENARIOS) - set(EXTRA_SCENARIOS)
        if unknown:
            raise SystemExit(f"unknown scenario(s): {', '.join(sorted(unknown))}")
        self.profile = args.profile
        self.execution = args.execution
        # the curve by total slots (processes x slots), and the wake-up fleet
        # (the smoke run leaves out the cold boot of 8 x 8: 72 processes on a CI machine
        # prove no more of the script than 2 x 8 does)
        self.scale_points = [(1, 1), (1, 4), (2, 8)] + ([] if quick else [(8, 8)])
        self.scale_points_warmed = [(1, 4), (2, 8)] if quick else self.scale_points
        # The warmed-up no-op drain judged for issue #27 item 3: long enough that each of 64
        # slots runs several full batches (40,000 jobs: 625 a slot; ten seconds at 4,000/s),
        # beside the ``n``-job burst, whose 78 jobs a slot are mostly its ramp.
        self.scale_drain_n = 8 * self.n
        self.wakeup_fleet = (2, 4) if quick else (8, 8)
        self.wakeup_starts = 20 if quick else 100
        self.priority_backlog = 10_000 if quick else 100_000
        self.priority_claims = 500 if quick else 2_000
        self.memory_n = args.memory_jobs or (5_000 if quick else 100_000)
        self.memory_chunk = 1_000 if quick else 5_000
        self.schedules = 1_000
        self.schedules_window = 10.0 if quick else 60.0
        self.fanout_n = 1_000 if quick else 10_000
        self.flow_n = 500 if quick else 5_000
        self.flow_flood = 10_000 if quick else 100_000

    def describe(self) -> dict:
        return {k: v for k, v in vars(self).items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = Plan(args)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + ("-quick" if plan.quick else "")
    out_path = args.output or RESULTS / f"{stamp}.md"
    logs = out_path.parent / f"{out_path.stem}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv)
    began = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)

    machine = report.machine()
    code_at_start = report.code_state()
    print(
        f"durable_jobs benchmarks: {'quick' if plan.quick else 'default'} run; results -> "
        f"{out_path}",
        flush=True,
    )
    print("  starting PostgreSQL ...", flush=True)
    server = server_mod.start(
        pg_stat_statements=plan.profile or bool({"bookkeeping", "horizon"} & set(plan.scenarios))
    )
    raw: dict = {"plan": plan.describe(), "machine": machine}
    notes: list[str] = list(server.notes)
    try:
        server_facts = server.describe()
        raw["server"] = server_facts
        env = _setup_django(server)
        from benchmarks import durable_bench
        from benchmarks import peers as peers_mod

        peers = peers_mod.prepare(
            server,
            env=env,
            logs=logs,
            skip=args.no_peers,
            only=args.peers.split(",") if args.peers else None,
        )
        for peer in peers.values():
            raw.setdefault("peers", {})[peer.spec.key] = {
                "versions": peer.versions,
                "problem": peer.problem,
            }
        ctx = durable_bench.Ctx(
            server,
            server.url(server_mod.DATABASES["durable"]),
            env,
            logs,
            sys.executable,
            execution=plan.execution,
        )
        results = Results(plan, ctx, peers, env, logs, raw, notes)
        floor_start = _baseline_commits(ctx, 500 if plan.quick else 1000)
        for name in plan.scenarios:
            print(f"  scenario {name} ...", flush=True)
            scenario_began = time.monotonic()
            try:
                getattr(results, f"scenario_{name}")()
            except Exception as error:  # noqa: BLE001 - one broken scenario must not lose the others
                notes.append(f"scenario {name} failed: {type(error).__name__}: {error}")
                raw.setdefault("errors", {})[name] = traceback.format_exc()
                traceback.print_exc()
                procs.kill_all()
                _fresh_connection()
            # Where a run's time goes: CI's smoke run is judged on its length.
            print(f"  scenario {name}: {time.monotonic() - scenario_began:.0f} s", flush=True)
        profile_text = ""
        if plan.profile:
            print("  profile ...", flush=True)
            from benchmarks import profiling

            try:
                profile_text = profiling.run(ctx, plan, raw)
            except Exception as error:  # noqa: BLE001
                notes.append(f"profile failed: {type(error).__name__}: {error}")
                raw.setdefault("errors", {})["profile"] = traceback.format_exc()
                traceback.print_exc()
                procs.kill_all()
        floor_end = _baseline_commits(ctx, 500 if plan.quick else 1000)
        raw["commit_floor"] = {"start": floor_start, "end": floor_end}
        results.table_obj.rows.insert(
            0,
            {
                "scenario": "server floor: 1-row INSERT + COMMIT, 1 client, at start / end (/s)",
                "durable_jobs": f"{report.num(floor_start['per_second'])} / "
                f"{report.num(floor_end['per_second'])}",
                "pgqueuer": "-",
                "procrastinate": "-",
                "tasks_db": "-",
                "target": "",
                "status": "info",
            },
        )
        start_arithmetic(raw, notes)
        table = results.table()
    except KeyboardInterrupt:
        procs.kill_all()
        print("interrupted", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 - set-up failed: say so, clean up, fail
        traceback.print_exc()
        print("benchmark set-up failed; see the traceback above", file=sys.stderr)
        return 1
    finally:
        procs.kill_all()
        server.stop()

    machine["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    code_at_end = report.code_state()
    if code_at_end != code_at_start:
        notes.insert(
            0,
            f"durable_jobs/ changed during the run ({code_at_start} at start, {code_at_end} at "
            "the end): figures may mix two versions of the code",
        )
    elapsed = time.monotonic() - began
    rendered = table.render()
    print()
    print(rendered)
    print()
    for note in notes:
        print(f"note: {note}")
    versions = report.versions()
    versions["durable_jobs code (HEAD+diff digest)"] = code_at_start
    raw["versions"] = versions
    peer_versions = {p.spec.label: (p.versions if p.ok else p.problem) for p in peers.values()}
    sections = [
        ("Results", report.block(rendered)),
        ("Notes", "\n".join(f"* {n}" for n in notes + results.method_notes()) or "(none)"),
        ("Machine", report.kv(machine)),
        (
            "Versions",
            report.kv(versions) + "\n\nPeers (each in its own virtual environment under "
            "benchmarks/.venvs/):\n\n" + report.kv(peer_versions),
        ),
        ("PostgreSQL", report.kv(server_facts)),
        (
            "Parameters",
            report.kv(plan.describe() | {"elapsed_seconds": round(elapsed, 1), "logs": str(logs)}),
        ),
        ("EXPLAIN (ANALYZE, BUFFERS)", results.plans_text()),
    ]
    if results.start_profile_text:
        sections.append(
            ("Profile: where one start() per transaction goes", results.start_profile_text)
        )
    if profile_text:
        sections.append(("Profile: a no-op slice at 4 slots", profile_text))
    if results.trial_text:
        sections.append(("Trial: each mechanism off vs all on", report.block(results.trial_text)))
    for title, text in results.sample_tables.items():
        sections.append((f"{title}, sample by sample", report.block(text)))
    if results.scale_waits_text:
        sections.append(
            (
                "Scale: what the cold bursts' backends wait on",
                report.block(results.scale_waits_text),
            )
        )
    if results.bookkeeping_text:
        sections.append(
            ("Bookkeeping of long slices and many leases", report.block(results.bookkeeping_text))
        )
    report.write(
        out_path,
        title=f"durable_jobs benchmarks, {stamp}",
        command=command,
        sections=sections,
        raw=raw,
    )
    print(
        f"results written to {out_path} (and {out_path.with_suffix('.json').name}); took "
        f"{elapsed:.0f} s"
    )
    broken = sorted(k for k in raw.get("errors", {}) if k not in results.peers)
    unverified = results.unverified()
    if broken or unverified:
        # PASS/MISS never fails the command (targets are goals); a scenario that crashed or a
        # durable_jobs run whose completions do not add up does.
        print(
            f"FAILED: scenarios with errors: {broken or 'none'}; unverified durable_jobs runs: "
            f"{unverified or 'none'}",
            file=sys.stderr,
        )
        return 1
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt()


def _setup_django(server) -> dict:
    setup_django(server.url(server_mod.DATABASES["durable"]), "durable_jobs_bench")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    return env


#: What ``_drain_cpu_cell`` reports, for a row's title.
_CPU_COLUMNS = "CPU ms/job, fleet + server; cores that keeps busy"


def _drain_cpu_cell(point: dict, *rates: float | None) -> str:
    """The fleet's and the server's CPU a job in a warmed-up drain, and how many of the
    machine's cores that keeps busy at each of ``rates`` (jobs/s): where the figure
    reaches the core count, the machine's CPU is what bounds the rate."""
    fleet, server = point["worker_cpu_ms_per_job"], point.get("server_cpu_ms_per_job")
    if server is None:
        return f"{fleet:.2f} + ? ms"
    cost = f"{fleet:.2f} + {server:.2f} ms"
    busy = " / ".join(f"{(fleet + server) * rate / 1000:.1f}" for rate in rates if rate)
    return f"{cost}; {busy} of {os.cpu_count()} cores" if busy else cost


def _scale_waits(points: dict, top: int = 8) -> str:
    """Each cold burst's busiest statement kinds and waits, from ``ActivitySampler``: where
    a larger fleet's time goes besides the CPU (docs/performance.rst, "What 64 slots wait on")."""
    blocks = []
    for tag, point in points.items():
        waits = point.get("waits")
        if not waits:
            continue
        lines = [
            f"{tag} ({point.get('samples', 0)} samples): active backends on average, "
            "by statement and wait (CPU: none, on a CPU or waiting for one)"
        ]
        lines += [f"  {mean:6.2f}  {what}" for what, mean in list(waits.items())[:top]]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def start_arithmetic(raw: dict, notes: list[str]) -> None:
    """Say what the start target asks of a start in this run, against the server's floor."""
    pgq = (raw.get("start_rate_peers") or {}).get("pgqueuer") or {}
    floor = raw.get("commit_floor") or {}
    if not pgq.get("per_second") or not floor.get("start"):
        return
    target = TARGETS["start_vs_pgqueuer"] * pgq["per_second"]
    budget = 1e6 / target
    floors = [floor[k]["per_second"] for k in ("start", "end") if floor.get(k)]
    shares = " / ".join(f"{target / f:.0%}" for f in floors)
    us = " / ".join(f"{1e6 / f:.0f}" for f in floors)
    text = (
        f"start target arithmetic: {TARGETS['start_vs_pgqueuer']:g} x pgqueuer's "
        f"{pgq['per_second']:,.0f}/s is "
        f"{target:,.0f} starts/s, {budget:.0f} us per start, which is {shares} of the server's "
        "1-row "
        f"INSERT + COMMIT floor at the start / end of the run ({us} us per commit): a start may "
        "cost "
        + " / ".join(f"{budget - 1e6 / f:+.0f}" for f in floors)
        + " us over a 1-column insert."
    )
    profile = raw.get("start_profile") or {}
    client, server = profile.get("client_cpu_us") or {}, profile.get("server_cpu_us") or {}
    floor_step, ours = "floor: 1-row INSERT + COMMIT (bigserial key)", "durable.start(), autocommit"
    if floor_step in client and ours in client:
        text += (
            f" The start profile (synchronous_commit off) puts durable.start() in autocommit at "
            f"{client[ours] - client[floor_step]:+.0f} us of client CPU and "
            f"{server[ours] - server[floor_step]:+.0f} us of server CPU over that floor."
        )
    limit = (raw.get("start_limit_pgbench") or {}).get("per_second")
    if limit:
        half = TARGETS["start_vs_pgbench"] * limit
        text += (
            f" pgbench's own insert-only rate in the same rounds was {limit:,.0f}/s "
            f"({1e6 / limit:.0f} us per "
            f"commit, a C client with a prepared statement): {TARGETS['start_vs_pgbench']:.0%} of "
            f"it is {half:,.0f}/s, and {TARGETS['start_vs_pgqueuer']:g} x pgqueuer is "
            f"{target / limit:.0%} of it."
        )
    notes.append(text)


class Results:
    """Runs the scenarios and turns their figures into table rows."""

    def __init__(
        self, plan: Plan, ctx, peers: dict, env: dict, logs: Path, raw: dict, notes: list[str]
    ) -> None:
        self.plan = plan
        self.ctx = ctx
        self.peers = peers
        self.env = env
        self.logs = logs
        self.raw = raw
        self.notes = notes
        self.table_obj = report.Table(
            {
                "scenario": "scenario",
                "durable_jobs": "durable_jobs",
                "pgqueuer": f"pgqueuer {peers['pgqueuer'].versions.get('pgqueuer') or ''}".strip(),
                "procrastinate": _versioned(
                    "Procrastinate", peers, "procrastinate", "procrastinate"
                ),
                "tasks_db": _versioned("django-tasks-db", peers, "tasks_db", "django-tasks-db"),
                "target": "target (durable_jobs)",
                "status": "PASS/MISS",
            }
        )
        self.plans: dict[str, dict[str, str]] = {}
        self.start_profile_text = ""
        self.trial_text = ""
        self.bookkeeping_text = ""
        #: The tables of samples of the long scenarios, by title, for the results file.
        self.sample_tables: dict[str, str] = {}
        self.scale_waits_text = ""

    # --- helpers -------------------------------------------------------------------
    def _peer_cells(self, fn, fmt) -> dict[str, str]:
        """Run ``fn(peer)`` for each peer; cells hold the formatted figure or why there is none."""
        cells = {}
        for key, peer in self.peers.items():
            if not peer.ok:
                cells[key] = "not measured: " + _short(peer.problem)
                continue
            try:
                result = fn(peer)
            except Exception as error:  # noqa: BLE001
                result = {"error": f"{type(error).__name__}: {error}"}
                self.raw.setdefault("errors", {})[f"{key}"] = traceback.format_exc()
                procs.kill_all()
            self.raw.setdefault(key, {}).setdefault("runs", []).append(result)
            cells[key] = fmt(result)
        return cells

    def _start_against_insert(self, breakdown: dict) -> None:
        """Issue #27 item 7: start() in atomic() against the same row's bare INSERT through
        Django's cursor in atomic(), both from the profile's interleaved rounds."""
        from benchmarks.start_profile import INSERT_IN_ATOMIC, START_IN_ATOMIC

        wall = breakdown["us_per_job"]
        if INSERT_IN_ATOMIC not in wall or START_IN_ATOMIC not in wall:
            return
        ratio = wall[START_IN_ATOMIC] / wall[INSERT_IN_ATOMIC]
        wanted = TARGETS["start_vs_insert_in_atomic"]
        self.table_obj.add(
            "start() in atomic() / the same row's INSERT through Django's cursor in atomic() "
            "(us per job, synchronous_commit off)",
            f"{ratio:.2f}x ({wall[START_IN_ATOMIC]:.0f} / {wall[INSERT_IN_ATOMIC]:.0f} us)",
            "-",
            "-",
            f"<= {wanted:g}x",
            report.verdict(ratio <= wanted),
            pgqueuer="-",
        )

    def _sampled(self, name: str, title: str, result: dict, table) -> bool:
        """Keep a long scenario's figures and print and keep its table of samples; False
        (and a note saying why) when it failed."""
        self.raw[name] = result
        if "error" in result:
            self.notes.append(f"{name}: {result['error']}")
            return False
        text = table(result)
        print(text, flush=True)
        self.sample_tables[title] = text
        return True

    def _peer(self, key: str):
        return self.peers[key]

    # --- scenarios -------------------------------------------------------------------
    def scenario_start(self) -> None:
        from benchmarks import durable_bench, peer_bench, pgbench_limit

        # Rounds interleaved (ours, each peer, pgbench, ours again in autocommit and with
        # prepared statements), the median run of each reported: a shared machine's load
        # swings by a factor of several within a minute, and one sequential pass would hand
        # that swing to whichever system ran in the quiet moment.
        n = self.plan.start_n
        variants = {  # raw key -> (atomic, prepare_threshold, row label)
            "start_rate": (
                True,
                None,
                "start rate: 1 start() in atomic()/transaction, 1 client (/s)",
            ),
            "start_rate_autocommit": (
                False,
                None,
                "start rate: 1 start() in autocommit (its own transaction), 1 client (/s)",
            ),
            # The opt-in: a connection that prepares statements (OPTIONS["prepare_threshold"]),
            # for a direct connection or a pooler that keeps prepared statements.
            "start_rate_prepared": (
                True,
                0,
                "start rate: 1 start() in atomic(), prepared statements (opt-in) (/s)",
            ),
            "start_rate_prepared_autocommit": (
                False,
                0,
                "start rate: 1 start() in autocommit, prepared statements (opt-in) (/s)",
            ),
        }
        mine: dict[str, list[dict]] = {key: [] for key in variants}
        theirs: dict[str, list[dict]] = {key: [] for key, peer in self.peers.items() if peer.ok}
        # One sequence per round, started one place further each round, so that no
        # measurement always follows the same one (a peer's run leaves its autovacuum
        # and checkpoint I/O to whoever comes next).
        sequence = [("ours", key) for key in variants]
        sequence[1:1] = [("peer", key) for key in theirs] + [("limit", "pgbench")]
        limits: list[dict] = []
        # Cheap (a second or two each), so at least five rounds: with three, one slow patch
        # of the machine in one round still moved a median.
        rounds = self.plan.repeat if self.plan.quick else max(self.plan.repeat, 5)
        for round_ in range(rounds):
            print(f"    start rates (round {round_ + 1}/{rounds})", flush=True)
            shift = round_ % len(sequence)
            for who, key in sequence[shift:] + sequence[:shift]:
                if who == "ours":
                    atomic, threshold, _ = variants[key]
                    mine[key].append(
                        durable_bench.start_rate(n, atomic=atomic, prepare_threshold=threshold)
                    )
                    continue
                if who == "limit":
                    limits.append(
                        pgbench_limit.measure(self.ctx.dburl, seconds=1 if self.plan.quick else 2)
                    )
                    continue
                try:
                    result = peer_bench.start_rate(self.peers[key], n, env=self.env, logs=self.logs)
                except Exception as error:  # noqa: BLE001
                    result = {"error": f"{type(error).__name__}: {error}"}
                    self.raw.setdefault("errors", {})[key] = traceback.format_exc()
                    procs.kill_all()
                theirs[key].append(result)
        for key in variants:
            self.raw[key] = {
                **_median_run(mine[key]),
                "rounds": [r.get("per_second") for r in mine[key]],
            }
        ours = self.raw["start_rate"]
        cells = {}
        for peer_key, peer in self.peers.items():
            if peer_key not in theirs:
                cells[peer_key] = "not measured: " + _short(peer.problem)
                continue
            self.raw.setdefault(peer_key, {}).setdefault("runs", []).extend(theirs[peer_key])
            cells[peer_key] = _rate_cell(_median_run(theirs[peer_key]), ours["per_second"])
        self.raw["start_rate_peers"] = {
            k: {**_median_run(v), "rounds": [r.get("per_second") for r in v]}
            for k, v in theirs.items()
        }
        pgq = self.raw["start_rate_peers"].get("pgqueuer") or {}
        limit = {**_median_run(limits), "rounds": [r.get("per_second") for r in limits]}
        self.raw["start_limit_pgbench"] = limit
        for position, (key, (_, _, label)) in enumerate(variants.items()):
            figure = self.raw[key]
            ratio = (figure["per_second"] / pgq["per_second"]) if pgq.get("per_second") else None
            share = (
                (figure["per_second"] / limit["per_second"]) if limit.get("per_second") else None
            )
            met = (
                None
                if ratio is None
                else (
                    ratio >= TARGETS["start_vs_pgqueuer"]
                    and (share is None or share >= TARGETS["start_vs_pgbench"])
                )
            )
            measured = ", ".join(
                text
                for text in (
                    None if ratio is None else f"{ratio:.2f}x",
                    None if share is None else f"{share:.0%} of pgbench",
                )
                if text
            )
            peer_cells = (
                (
                    cells.get("pgqueuer", "-"),
                    cells.get("procrastinate", "-"),
                    cells.get("tasks_db", "-"),
                )
                if position == 0
                else ("(as above)",) * 3
            )
            self.table_obj.add(
                label,
                f"{report.num(figure['per_second'])} (p99 {figure['p99_ms']:.1f} ms)",
                peer_cells[1],
                peer_cells[2],
                f">= {TARGETS['start_vs_pgqueuer']:g}x pgqueuer, >= "
                f"{TARGETS['start_vs_pgbench']:.0%} "
                "pgbench",
                report.verdict(met) + (f" ({measured})" if measured else ""),
                pgqueuer=peer_cells[0],
            )
        self.table_obj.add(
            "limit: pgbench, 1 client, prepared 1-row INSERT per transaction (/s)",
            report.num(limit["per_second"])
            if limit.get("per_second")
            else "not measured: " + _short(limit.get("error")),
            "-",
            "-",
            "",
            "info",
            pgqueuer="-",
        )
        from benchmarks import start_profile

        print("    start profile: where one start() per transaction spends its time", flush=True)
        try:
            breakdown = start_profile.breakdown(
                self.ctx.dburl,
                n=100 if self.plan.quick else 300,
                rounds=3 if self.plan.quick else 5,
            )
            self.raw["start_profile"] = {k: v for k, v in breakdown.items() if k != "cprofile"}
            self._start_against_insert(breakdown)
            self.start_profile_text = (
                report.block(start_profile.render(breakdown)) + "\n\ncProfile of "
                "durable.start() in transaction.atomic() (cumulative):\n\n"
                + report.block(breakdown["cprofile"])
            )
        except Exception as error:  # noqa: BLE001 - the profile explains; it must not cost the figures
            self.notes.append(f"start profile failed: {type(error).__name__}: {error}")
        bulk = durable_bench.bulk_start(max(self.plan.n, 10_000))
        self.raw["bulk_start"] = bulk
        if not bulk.get("implemented"):
            self.table_obj.add(
                "bulk start (jobs/s)",
                "not implemented",
                "-",
                "-",
                f">= {report.num(TARGETS['bulk_start'])}",
                "MISS",
            )
            self.notes.append(
                "bulk start: durable_jobs has no start_many() API yet; the row reports "
                "'not implemented' rather than a figure"
            )
        elif "error" in bulk:
            self.table_obj.add(
                "bulk start (jobs/s)",
                "error: " + _short(bulk["error"]),
                "-",
                "-",
                f">= {report.num(TARGETS['bulk_start'])}",
                "MISS",
            )
        else:
            ok = bulk["rows"] == bulk["n"] and bulk["per_second"] >= TARGETS["bulk_start"]
            self.table_obj.add(
                f"bulk start_many of {bulk['n']:,} (jobs/s)",
                report.num(bulk["per_second"]),
                "-",
                "-",
                f">= {report.num(TARGETS['bulk_start'])}",
                report.verdict(ok),
            )

    def scenario_throughput(self) -> None:
        from benchmarks import durable_bench, peer_bench

        n = self.plan.n
        configs = [
            ("1 slot", 1, 1, "1x1"),
            ("4 slots, 1 process", 1, 4, "1x4"),
            ("2 processes x 2 slots", 2, 2, "2x2"),
        ]
        runs: dict[str, dict[str, list]] = {
            tag: {"durable": [], "pgqueuer": [], "procrastinate": [], "tasks_db": []}
            for _, _, _, tag in configs
        }
        # Rounds, each running every configuration of every system once, so a slow patch of a
        # shared machine lands on all of them rather than on one.
        for round_ in range(self.plan.repeat):
            for label, processes, slots, tag in configs:
                print(f"    throughput {label} (round {round_ + 1}/{self.plan.repeat})", flush=True)
                runs[tag]["durable"].append(
                    durable_bench.throughput(
                        self.ctx,
                        n,
                        processes=processes,
                        slots=slots,
                        tag=f"{tag}-r{round_}",
                        timeout=self.plan.worker_timeout,
                    )
                )
                for key, peer in self.peers.items():
                    if not peer.ok:
                        continue
                    try:
                        result = peer_bench.throughput(
                            peer,
                            n,
                            processes=processes,
                            slots=slots,
                            env=self.env,
                            logs=self.logs,
                            tag=f"{tag}-r{round_}",
                            timeout=self.plan.worker_timeout,
                            server_pid=self.ctx.server.postmaster_pid(),
                        )
                    except Exception as error:  # noqa: BLE001
                        result = {"error": f"{type(error).__name__}: {error}"}
                        self.raw.setdefault("errors", {})[key] = traceback.format_exc()
                        procs.kill_all()
                    runs[tag][key].append(result)
        pgq = self.peers.get("pgqueuer")
        if pgq is not None and pgq.ok:
            # An extra, labelled row: pgqueuer tuned to claim what our 4 slots claim at a
            # time (--batch-size 4). Every other pgqueuer cell is its default worker.
            print("    throughput pgqueuer tuned (--batch-size 4)", flush=True)
            tuned_runs = []
            for round_ in range(self.plan.repeat):
                try:
                    tuned_runs.append(
                        peer_bench.throughput(
                            pgq,
                            n,
                            processes=1,
                            slots=4,
                            batch_size=4,
                            env=self.env,
                            logs=self.logs,
                            tag=f"tuned-r{round_}",
                            timeout=self.plan.worker_timeout,
                            server_pid=self.ctx.server.postmaster_pid(),
                        )
                    )
                except Exception as error:  # noqa: BLE001
                    tuned_runs.append({"error": f"{type(error).__name__}: {error}"})
            runs["pgqueuer_tuned"] = {"pgqueuer": tuned_runs}
        self.raw["throughput_runs"] = runs
        self.raw["throughput"] = {
            tag: _median_run(r["durable"]) for tag, r in runs.items() if "durable" in r
        }
        for label, _, _, tag in configs:
            ours = self.raw["throughput"][tag]
            cells = {}
            for key, peer in self.peers.items():
                if not peer.ok:
                    cells[key] = "not measured: " + _short(peer.problem)
                else:
                    cells[key] = _throughput_cell(
                        _median_run(runs[tag][key]), ours.get("per_second"), runs[tag][key]
                    )
            target, status = "", "info"
            if tag == "1x4":
                target = f">= {report.num(TARGETS['throughput_4'])}/s"
                status = report.verdict(_meets(ours, TARGETS["throughput_4"]))
            if tag in ("1x1", "1x4") and self.peers["pgqueuer"].ok and runs[tag]["pgqueuer"]:
                theirs = _median_run(runs[tag]["pgqueuer"]).get("per_second")
                ratio = (ours["per_second"] / theirs) if theirs and ours.get("per_second") else None
                wanted = TARGETS["throughput_vs_pgqueuer"][tag]
                target += ("; " if target else "") + f">= {wanted:g}x pgqueuer"
                verdict = report.verdict(
                    None if ratio is None else bool(ours.get("verified")) and ratio >= wanted
                )
                status = (
                    (status + "; " if status != "info" else "")
                    + verdict
                    + ("" if ratio is None else f" ({ratio:.2f}x)")
                )
            rounds = f", median of {self.plan.repeat}" if self.plan.repeat > 1 else ""
            self.table_obj.add(
                f"throughput, {n:,} no-op jobs, {label} (jobs/s{rounds})",
                _throughput_cell(ours, None, runs[tag]["durable"]),
                cells["procrastinate"],
                cells["tasks_db"],
                target,
                status,
                pgqueuer=cells["pgqueuer"],
            )
            if tag == "1x4" and "pgqueuer_tuned" in runs:
                theirs = _median_run(runs["pgqueuer_tuned"]["pgqueuer"])
                ratio = (
                    (ours["per_second"] / theirs["per_second"])
                    if theirs.get("per_second") and ours.get("per_second")
                    else None
                )
                self.table_obj.add(
                    f"throughput, {n:,} no-op jobs: our 4 slots vs pgqueuer TUNED "
                    "(--batch-size 4, not its default)",
                    _throughput_cell(ours, None, runs[tag]["durable"]),
                    "-",
                    "-",
                    "",
                    "info" + ("" if ratio is None else f" ({ratio:.2f}x)"),
                    pgqueuer=_throughput_cell(
                        theirs, ours.get("per_second"), runs["pgqueuer_tuned"]["pgqueuer"]
                    ),
                )
            if tag == "1x4":
                self._rss_row(
                    ours,
                    {
                        k: _median_run(runs[tag][k]) if runs[tag][k] else None
                        for k in ("pgqueuer", "procrastinate", "tasks_db")
                    },
                )

    def _rss_row(self, ours: dict, runs: dict) -> None:
        cells = {}
        for key, run in runs.items():
            peer = self.peers[key]
            if not peer.ok:
                cells[key] = "not measured"
            elif not run or "max_rss_mib" not in run:
                cells[key] = "n/a"
            else:
                cells[key] = f"{run['max_rss_mib']:.0f}" + (
                    " per process" if run.get("processes", 1) > 1 else ""
                )
        self.table_obj.add(
            "worker peak RSS at 4 slots (MiB)",
            f"{ours['max_rss_mib']:.0f}",
            cells["procrastinate"],
            cells["tasks_db"],
            "",
            "info",
            pgqueuer=cells["pgqueuer"],
        )
        cpu = {k: _cpu_cell(runs[k]) if self.peers[k].ok else "not measured" for k in runs}
        self.table_obj.add(
            "CPU ms per job at 4 slots: worker / server",
            _cpu_cell(ours),
            cpu["procrastinate"],
            cpu["tasks_db"],
            "",
            "info",
            pgqueuer=cpu["pgqueuer"],
        )

    def scenario_latency(self) -> None:
        from benchmarks import durable_bench, peer_bench

        plan = self.plan
        self.raw["latency"] = {}
        for notify in (True, False):
            interval = plan.poll_interval
            tag = "notify" if notify else "poll"
            print(f"    latency {tag}", flush=True)
            ours = durable_bench.latency(
                self.ctx,
                plan.latency_m,
                notify=notify,
                poll_interval=interval,
                slots=plan.latency_slots,
                gap=plan.gap,
                tag=tag,
            )
            self.raw["latency"][tag] = ours

            def peer_run(p, notify=notify, tag=tag):
                if notify and p.spec.key == "tasks_db":
                    return {"unsupported": "no LISTEN/NOTIFY: polls only"}
                if not notify and p.spec.key == "pgqueuer":
                    return {"unsupported": "always LISTENs"}
                return peer_bench.latency(
                    p,
                    plan.latency_m,
                    notify=notify,
                    poll_interval=interval,
                    slots=plan.latency_slots,
                    gap=plan.gap,
                    env=self.env,
                    logs=self.logs,
                    tag=tag,
                )

            cells = self._peer_cells(peer_run, _latency_cell)
            if notify:
                label = f"latency start->run p50 / p99, NOTIFY, {plan.latency_m} jobs, 4 slots (ms)"
                target_ms = TARGETS["latency_notify_p99_ms"]
            else:
                label = (
                    f"latency p50 / p99, poll path (no NOTIFY), POLL_INTERVAL {interval:g} s (ms)"
                )
                target_ms = interval * 1000 + TARGETS["latency_poll_slack_ms"]
            self.table_obj.add(
                label,
                _latency_cell(ours),
                cells["procrastinate"],
                cells["tasks_db"],
                f"p99 <= {target_ms:g} ms",
                report.verdict(_latency_ok(ours, target_ms)),
                pgqueuer=cells["pgqueuer"],
            )

    def scenario_heartbeat(self) -> None:
        from benchmarks import durable_bench

        hb = durable_bench.heartbeat(self.ctx, self.plan.hb_seconds)
        self.raw["heartbeat"] = hb
        if "error" in hb:
            self.table_obj.add("heartbeat", "error: " + hb["error"], "-", "-", "", "MISS")
            return
        self.table_obj.add(
            f"heartbeats/s, one lease, 1 connection, {hb['seconds']:.0f} s",
            f"{report.num(hb['per_second'])}" + (f" ({hb['lost']} lost)" if hb["lost"] else ""),
            "-",
            "-",
            "",
            "info",
        )
        share = hb["hot_share"]
        self.table_obj.add(
            "heartbeat HOT updates (n_tup_hot_upd / n_tup_upd)",
            "n/a" if share is None else f"{share:.1%} of {hb['n_tup_upd']:,}",
            "-",
            "-",
            f">= {TARGETS['hot_share']:.0%}",
            report.verdict(None if share is None else share >= TARGETS["hot_share"]),
        )

    def scenario_transports(self) -> None:
        """Each transport against the database transport (benchmarks/transport_bench.py)."""
        from benchmarks import transport_bench

        found = transport_bench.run(
            self.ctx,
            n=200 if self.plan.quick else 3000,
            m=20 if self.plan.quick else 100,
            timeout=self.plan.worker_timeout,
            quick=self.plan.quick,
        )
        self.raw["transports"] = found
        if found["skipped"]:
            self.notes.append(
                "transports: no broker answers for " + ", ".join(found["skipped"]) + "; skipped"
            )
        for point in found["drains"]:
            slots = point["processes"] * point["slots_per_process"]
            cpu = point["server_cpu_ms_per_job"]
            self.table_obj.add(
                f"transports: {point['transport']}, {point['n']:,} no-op jobs, "
                f"{point['processes']} x {point['slots_per_process']} = {slots} slots: jobs/s; "
                "PostgreSQL commits and server CPU per job",
                f"{_throughput_cell(point, None)}; {point['commits_per_job']:.2f} commits/job; "
                + ("-" if cpu is None else f"{cpu:.2f} ms CPU/job"),
                "-",
                "-",
                "",
                "info",
            )
        for point in found["latency"]:
            self.table_obj.add(
                f"transports: {point['transport']}, {point['m']} single starts to an idle "
                "2 x 2 fleet: start-to-claim p50/p90/p99 ms",
                " / ".join(report.num(point[k]) for k in ("p50_ms", "p90_ms", "p99_ms")),
                "-",
                "-",
                "",
                "info",
            )

    def scenario_scale(self) -> None:
        """Throughput by total slots, claim contention, wake-ups per start."""
        from benchmarks import durable_bench

        n = self.plan.n
        points = {}
        for processes, slots in self.plan.scale_points:
            tag = f"{processes}x{slots}"
            print(f"    scale {tag} ({processes * slots} slots)", flush=True)
            points[tag] = durable_bench.scale_point(
                self.ctx,
                n,
                processes=processes,
                slots=slots,
                tag=tag,
                timeout=self.plan.worker_timeout,
            )
        self.raw["scale"] = points
        for tag, point in points.items():
            processes, slots = (int(x) for x in tag.split("x"))
            if "error" in point:
                self.table_obj.add(
                    f"scale: {processes * slots} slots",
                    "error: " + _short(point["error"]),
                    "-",
                    "-",
                    "",
                    "MISS",
                )
                continue
            self.table_obj.add(
                f"scale, cold burst (burst workers: their boot is in the window): {n:,} no-op "
                f"jobs, {processes} process(es) x {slots} = {processes * slots} slots: jobs/s; "
                "claims; transactions/job; lock-waiting backends mean/max",
                f"{_throughput_cell(point, None)}; {point['claim_statements']:,} claims; "
                f"{point['transactions_per_job']:.2f} tx/job; "
                f"{point['lock_waiting_backends_mean']:.2f}"
                f"/{point['lock_waiting_backends_max']}",
                "-",
                "-",
                "",
                "info",
            )
        self.scale_waits_text = _scale_waits(points)
        self._scale_warmed(n, judged=False)
        self._scale_warmed(self.plan.scale_drain_n, judged=True)
        processes, slots = self.plan.wakeup_fleet
        print(
            f"    wake-ups: {self.plan.wakeup_starts} single starts to an idle {processes}x{slots} "
            "fleet",
            flush=True,
        )
        wake = durable_bench.wakeups(
            self.ctx,
            self.plan.wakeup_starts,
            processes=processes,
            slots=slots,
            gap=0.05,
            tag=f"{processes}x{slots}",
        )
        self.raw["wakeups"] = wake
        if "error" in wake:
            self.table_obj.add(
                "wake-ups per start", "error: " + _short(wake["error"]), "-", "-", "", "MISS"
            )
            return
        # Waking every slot would cost at least one DEQUEUE transaction per slot per start.
        ok = wake["fleet_transactions_per_start"] < processes * slots
        self.table_obj.add(
            f"wake-ups: {self.plan.wakeup_starts} single starts to an idle fleet of "
            f"{processes}x{slots} = "
            f"{processes * slots} slots: fleet transactions per start; latency p50 / p99 (ms)",
            f"{wake['fleet_transactions_per_start']:.1f} tx/start; {_latency_cell(wake)}",
            "-",
            "-",
            f"no herd: < {processes * slots} tx/start (1 per slot)",
            report.verdict(ok),
        )

    def _scale_warmed(self, n: int, *, judged: bool) -> None:
        """Issue #27 item 3 on warmed-up fleets: the same slot counts draining ``n`` no-op
        jobs put before them at once, the fleet booted and idle; 16 and 64 slots against the
        best of the smaller counts.

        Run twice: a burst of ``--n`` jobs (info), where 64 slots get 78 jobs each and the
        drain is mostly each slot's ramp to a full batch and the fleet's tail, and a drain
        eight times as long (``Plan.scale_drain_n``; judged), the throughput the issue asks
        about. Measured on 2026-12-07 (docs/performance.rst): 8 x 8 ran 48-55 % of 1 x 4 on
        the burst and 78-79 % on the long drain, in the same runs.

        ``--repeat`` rounds, each running every slot count once (a slow patch of a shared
        machine lands on all of them); each count's median run is reported, with the range.
        One round's 16-slot share ranged 69-112 % over nine probe rounds on this machine.
        """
        from benchmarks import durable_bench

        what = "drain" if judged else "burst"
        runs: dict[str, list[dict]] = {}
        for round_ in range(self.plan.repeat):
            for processes, slots in self.plan.scale_points_warmed:
                tag = f"{processes}x{slots}"
                print(
                    f"    scale {tag}, warmed-up fleet, {n:,} jobs "
                    f"(round {round_ + 1}/{self.plan.repeat})",
                    flush=True,
                )
                runs.setdefault(tag, []).append(
                    durable_bench.scale_point_warmed(
                        self.ctx,
                        n,
                        processes=processes,
                        slots=slots,
                        tag=f"{tag}-{what}-{round_ + 1}",
                    )
                )
        points = {
            tag: {
                **_median_run(tag_runs),
                "rounds": [r["per_second"] for r in tag_runs if r.get("per_second")],
                "failed_rounds": sum(1 for r in tag_runs if "error" in r or not r.get("verified")),
            }
            for tag, tag_runs in runs.items()
        }
        self.raw["scale_warmed_drain" if judged else "scale_warmed_burst"] = points
        best_small = max(
            (
                point.get("per_second") or 0.0
                for tag, point in points.items()
                if _slots_of(tag) < 16
            ),
            default=0.0,
        )
        for tag, point in points.items():
            total = _slots_of(tag)
            rate = point.get("per_second")
            compared = total >= 16 and best_small > 0
            share = rate / best_small if rate and compared else None
            if "error" in point:
                cell = "error: " + _short(point["error"])
            else:
                cell = f"{rate or 0:,.0f}"
                if len(point["rounds"]) > 1:
                    cell += f" [{min(point['rounds']):,.0f}-{max(point['rounds']):,.0f}]"
                if point["failed_rounds"]:
                    cell += f" ({point['failed_rounds']} of {len(runs[tag])} rounds failed)"
                if share is not None:
                    cell += f" ({share:.0%})"
                cell += "; " + _drain_cpu_cell(point, rate)
            rounds = f", median of {self.plan.repeat}" if self.plan.repeat > 1 else ""
            self.table_obj.add(
                f"scale, warmed-up fleet, {'a long drain' if judged else 'a short burst'}: "
                f"{n:,} no-op jobs, {tag.replace('x', ' x ')} = {total} slots: jobs/s{rounds} "
                f"(share of the best of 1 and 4 slots); {_CPU_COLUMNS}",
                cell,
                "-",
                "-",
                ">= 90%" if judged and compared else "",
                report.verdict(
                    share is not None
                    and share >= 0.9
                    and point["verified"]
                    and not point["failed_rounds"]
                )
                if judged and compared
                else "info",
                pgqueuer="-",
            )

    def scenario_priorities(self) -> None:
        """100,000 due jobs across priorities: dequeue flat, priority order holds."""
        from benchmarks import durable_bench

        r = durable_bench.priorities(
            self.ctx,
            self.plan.priority_backlog,
            claims=self.plan.priority_claims,
            reps=self.plan.explain_reps,
        )
        self.raw["priorities"] = r
        flat = r["dequeue_exec_after_ms"] <= max(0.5, 1.5 * r["dequeue_exec_first_ms"])
        self.table_obj.add(
            f"{r['backlog']:,} due jobs, priorities -10..10: DEQUEUE server ms first / after "
            f"{r['claims']:,} "
            "claims; client p50 first 100 / last 100 claims (ms)",
            f"{r['dequeue_exec_first_ms']:.3f} / {r['dequeue_exec_after_ms']:.3f}; "
            f"{r['dequeue_client_first_100_p50_ms']:.2f} / "
            f"{r['dequeue_client_last_100_p50_ms']:.2f}",
            "-",
            "-",
            "flat",
            report.verdict(flat),
        )
        self.table_obj.add(
            "  claims in priority order (higher first), none left outranking the last claim",
            "yes"
            if r["priority_order_held"]
            else f"NO ({r['pending_outranking_last_claim']} pending outrank the last claim)",
            "-",
            "-",
            "order holds",
            report.verdict(r["priority_order_held"]),
        )
        later = r["dequeue_exec_with_later_ms"]
        self.table_obj.add(
            f"  + {r['backlog']:,} more due tomorrow at priority 10: DEQUEUE server ms",
            f"{later:.3f}",
            "-",
            "-",
            "flat",
            report.verdict(later <= max(0.5, 1.5 * r["dequeue_exec_first_ms"])),
        )

    def scenario_workflows(self) -> None:
        """A parent with N children: spawn speed, fan-in wake-up, an intact tree."""
        from benchmarks import workflow_bench

        r = workflow_bench.run(self.ctx, self.plan.fanout_n, timeout=self.plan.worker_timeout)
        self.raw["workflows"] = r
        spawn, bulk = r["spawn_seconds"], r["start_many_seconds"]
        self.table_obj.add(
            f"spawn_many of {r['n']:,} children in one slice: seconds (start_many of as many)",
            f"{spawn:.2f} ({bulk:.2f})" if spawn and bulk else "n/a",
            "-",
            "-",
            "bulk-start speed",
            report.verdict(bool(spawn and bulk and spawn <= 2 * bulk + 0.5)),
        )
        lag = r["parent_done_after_last_child_s"]
        self.table_obj.add(
            "  parent finished after its last child ended (s, database clock)",
            "n/a" if lag is None else f"{lag:.3f}",
            "-",
            "-",
            "< 1 s",
            report.verdict(lag is not None and lag < 1.0),
        )
        intact = r["children"] == r["completed"] == r["summary"] == r["n"]
        self.table_obj.add(
            "  children / completed / parent's summary",
            f"{r['children']:,} / {r['completed']:,} / {r['summary']}",
            "-",
            "-",
            "all N, once",
            report.verdict(intact and r["status"] == "completed"),
        )

    def scenario_flow(self) -> None:
        """Flow control: each limit's cost, DEQUEUE flat beside a full key, the fairness bound."""
        from benchmarks import flow_bench

        plan = self.plan
        shapes = flow_bench.shapes(
            self.ctx,
            plan.flow_n,
            slots=(4, 16),
            reps=plan.explain_reps,
            timeout=plan.worker_timeout,
        )
        flat = flow_bench.flat(self.ctx, plan.flow_flood, reps=plan.explain_reps)
        fair = flow_bench.fairness(self.ctx, plan.flow_flood)
        self.raw["flow"] = {"shapes": shapes, "flat": flat, "fairness": fair}
        base = shapes["unkeyed (default claim)"]
        for name, entry in shapes.items():
            cells = []
            for count in (4, 16):
                rate = entry.get(f"throughput_{count}")
                ratio = (
                    ""
                    if not rate or not base.get(f"throughput_{count}")
                    else (f" ({rate / base[f'throughput_{count}']:.2f}x)")
                )
                cells.append(f"{rate:,.0f}{ratio}" if rate else "-")
            self.table_obj.add(
                f"flow: {plan.flow_n:,} no-op jobs, {name}: jobs/s at 4 / 16 slots; DEQUEUE server ms",
                f"{cells[0]} / {cells[1]}; {entry['dequeue_ms']:.3f}",
                "-",
                "-",
                "-",
                "info",
            )
        flat_ok = flat["ms_blocked"] <= max(0.5, 1.5 * flat["ms_small"])
        self.table_obj.add(
            f"flow: DEQUEUE server ms, {flat['blocked_small']} / {flat['blocked']:,} jobs blocked on a full key",
            f"{flat['ms_small']:.3f} / {flat['ms_blocked']:.3f}",
            "-",
            "-",
            "flat",
            report.verdict(flat_ok),
        )
        bound = fair["fair"]["claims_until_lone"]
        self.table_obj.add(
            f"flow: claims until a lone tenant's job, beside a {fair['flood']:,}-job flood: fair / unfair",
            f"{bound} / {fair['unfair']['claims_until_lone']:,}",
            "-",
            "-",
            "<= 3",
            report.verdict(bound <= 3),
        )

    def scenario_memory(self) -> None:
        """Worker RSS flat over many jobs (no growth after warm-up)."""
        from benchmarks import durable_bench

        r = durable_bench.memory(
            self.ctx, self.plan.memory_n, slots=4, chunk=self.plan.memory_chunk, tag="4slots"
        )
        self.raw["memory"] = r
        if "error" in r:
            self.table_obj.add("memory", "error: " + _short(r["error"]), "-", "-", "", "MISS")
            return
        ok = r["growth_mib"] is not None and r["growth_mib"] <= TARGETS["memory_growth_mib"]
        self.table_obj.add(
            f"worker RSS over {r['n']:,} jobs, 4 slots ({self.plan.execution} execution, worker + "
            "handler "
            "processes): after warm-up (first 10%) / at the end (MiB)",
            f"{r['rss_after_warmup_mib']:.0f} / {r['rss_at_end_mib']:.0f} ({r['growth_mib']:+.1f})",
            "-",
            "-",
            f"growth <= {TARGETS['memory_growth_mib']:g} MiB",
            report.verdict(ok),
        )

    def scenario_schedules(self) -> None:
        """1,000 schedules: the idle fleet's statements/s with and without them, then firing."""
        from benchmarks import schedules_bench

        r = schedules_bench.run(
            self.ctx, schedules=self.plan.schedules, window=self.plan.schedules_window
        )
        self.raw["schedules"] = r
        if "error" in r:
            self.table_obj.add("schedules", "error: " + _short(r["error"]), "-", "-", "", "MISS")
            return
        self.table_obj.add(
            f"statements/s of {r['workers']} idle workers, 0 / {r['schedules']:,} schedules "
            f"({r['window_seconds']:.0f} s)",
            f"{r['idle_without']:.1f} / {r['idle_with']:.1f} "
            f"({r['schedules_cost_per_second']:+.1f} for the schedules)",
            "-",
            "-",
            "",
            "info",
        )
        self.table_obj.add(
            f"statements/s reading the schedule table, 0 / {r['schedules']:,} schedules",
            f"{r['schedule_reads_without']:.2f} / {r['schedule_reads_with']:.2f}",
            "-",
            "-",
            "",
            "info",
        )
        self.table_obj.add(
            f"{r['schedules']:,} ticks made due at once: started in s (ticks/s, transactions)",
            f"{r['fire_seconds']:.2f} ({report.num(r['fire_per_second'])}/s, "
            f"{r['fire_transactions']:,})"
            + ("" if r["ticks_fired"] >= r["schedules"] else f" only {r['ticks_fired']} fired"),
            "-",
            "-",
            "",
            "info",
        )

    def scenario_churn(self) -> None:
        """Jobs/s with two of the worker's backends terminated every second vs undisturbed."""
        from benchmarks import churn_bench

        quick = self.plan.quick
        r = churn_bench.run(
            self.ctx,
            n=2000 if quick else 6000,
            churn_seconds=8.0 if quick else 20.0,
            after_seconds=4.0 if quick else 8.0,
            timeout=self.plan.worker_timeout,
        )
        self.raw["churn"] = r
        calm, churn = r["undisturbed"], r["churn"]
        job_ms = r["job_seconds"] * 1000
        self.table_obj.add(
            f"churn: {job_ms:g} ms jobs, 4 slots, jobs/s undisturbed / with {r['kills_per_second']}"
            f" backends terminated a second for {churn['churn_seconds']:.0f} s (ratio)",
            f"{report.num(calm['per_second'])} / {report.num(churn['per_second'])}"
            + (f" ({r['ratio']:.2f}x)" if r["ratio"] else ""),
            "-",
            "-",
            f">= {TARGETS['churn_ratio']:g}x",
            report.verdict(r["ratio"] is not None and r["ratio"] >= TARGETS["churn_ratio"]),
        )
        self.table_obj.add(
            "  churn: backlog left when it stopped, drained in s (rate vs undisturbed)",
            f"{churn['backlog_at_churn_end']:,} in {churn['drain_seconds']:.1f} s"
            + (f" ({r['drain_ratio']:.2f}x)" if r["drain_ratio"] else ""),
            "-",
            "-",
            f">= {TARGETS['churn_drain_ratio']:g}x",
            report.verdict(
                r["drain_ratio"] is not None and r["drain_ratio"] >= TARGETS["churn_drain_ratio"]
            ),
        )
        log = churn["log"]
        self.table_obj.add(
            "  churn: backends killed; worker WARNING lines (bookkeeping writes given up); "
            "jobs re-driven after a lease / charged an interruption",
            f"{churn['kills']}; {log['warnings']:,} ({log['failed_twice']}); "
            f"{churn['redriven']:,} / {churn['interrupted']:,}",
            "-",
            "-",
            "0 re-driven",
            report.verdict(churn["redriven"] == 0),
        )
        self.table_obj.add(
            "  churn: every job completed exactly once, none failed",
            f"{churn['completed']:,} of {churn['n']:,} ({churn['failed']} failed)",
            "-",
            "-",
            "all",
            report.verdict(r["exactly_once"]),
        )
        print(
            "    churn: "
            + json.dumps(
                {
                    "undisturbed_per_s": calm["per_second"],
                    "churn_per_s": churn["per_second"],
                    "ratio": r["ratio"],
                    "drain_ratio": r["drain_ratio"],
                    "backlog": churn["backlog_at_churn_end"],
                    "drain_s": churn["drain_seconds"],
                    "last_1pct_s": churn["last_1pct_seconds"],
                    "warnings": log["warnings"],
                    "failed_twice": log["failed_twice"],
                    "redriven": churn["redriven"],
                    "interrupted": churn["interrupted"],
                    "killed": churn["killed"],
                    "top_warnings": log["top_warnings"],
                },
                default=str,
            ),
            flush=True,
        )

    def scenario_trial(self) -> None:
        """Each throughput mechanism off vs all on, on 1 ms to 5 s slices at 1, 4, 16 slots."""
        from benchmarks import trial

        result = trial.run(self.ctx, quick=self.plan.quick, timeout=self.plan.worker_timeout)
        self.raw["trial"] = result
        self.trial_text = trial.tables(result)
        print(self.trial_text, flush=True)
        failed = [
            f"{point} / {config}"
            for point, row in result["points"].items()
            for config, r in row.items()
            if not r.get("verified")
        ]
        self.table_obj.add(
            "trial: each mechanism off vs all on (table below)",
            f"{len(result['points'])} points x {len(result['configs'])} configurations"
            + (f", {len(failed)} failed" if failed else ""),
            "-",
            "-",
            "every run drains",
            report.verdict(not failed),
        )

    def scenario_duty(self) -> None:
        """Issue #27 item 6: how much of one slot's time 20 ms jobs get (the rest is claims,
        completions and hand-offs), and the same at 4 slots; the median of interleaved rounds."""
        from benchmarks import trial

        n = 60 if self.plan.quick else 300
        seconds = [0.02] * n
        runs: dict[int, list[dict]] = {1: [], 4: []}
        for round_ in range(1 if self.plan.quick else 3):
            for slots in runs:
                runs[slots].append(
                    trial.run_point(
                        self.ctx,
                        "all on",
                        seconds if slots == 1 else seconds * 4,
                        slots=slots,
                        tag=f"duty-{slots}-r{round_}",
                        timeout=self.plan.worker_timeout,
                    )
                )
        self.raw["duty"] = runs
        for slots, results in runs.items():
            best = _median_run(results)
            rate = best.get("per_second")
            duty = None if not rate else rate * 0.02 / slots
            wanted = TARGETS["duty_20ms"]
            self.table_obj.add(
                f"duty: {n * slots:,} jobs of 20 ms, {slots} slot{'s' if slots > 1 else ''}: "
                f"jobs/s (share of {slots} x 50/s, median of {len(results)})",
                "error" if not rate else f"{rate:,.1f} ({duty:.1%})",
                "-",
                "-",
                f">= {wanted:.0%}",
                report.verdict(None if duty is None else duty >= wanted and best.get("verified")),
                pgqueuer="-",
            )

    def scenario_steady(self) -> None:
        """Issue #27 item 3: a steady producer of single starts into idle fleets of 1 x 4,
        4 x 4 and 8 x 8 slots; completions, latency and transactions per job."""
        from benchmarks import durable_bench

        rate, seconds = (200.0, 3.0) if self.plan.quick else (400.0, 8.0)
        fleets = [(1, 4)] if self.plan.quick else [(1, 4), (4, 4), (8, 8)]
        self.raw["steady"] = {}
        for processes, slots in fleets:
            tag = f"{processes}x{slots}"
            print(f"    steady producer, {rate:g}/s into {tag}", flush=True)
            r = durable_bench.steady(
                self.ctx, rate=rate, seconds=seconds, processes=processes, slots=slots, tag=tag
            )
            self.raw["steady"][tag] = r
            cell = (
                "error: " + _short(r["error"])
                if "error" in r
                else f"{r['offered_per_second']:,.0f} / {r['completed_per_second'] or 0:,.0f}; "
                f"{r['transactions_per_job']:.1f} tx/job; {r['p50_ms']:.1f} / {r['p99_ms']:.1f} ms"
            )
            self.table_obj.add(
                f"steady: one client starting {rate:g}/s into an idle {processes} x {slots} fleet "
                f"for {seconds:g} s: started / completed per s; transactions per job; latency "
                "p50 / p99",
                cell,
                "-",
                "-",
                "",
                "info",
                pgqueuer="-",
            )
        # Fleets of 16 and 64 slots on work that waits: 50 ms I/O-bound slices.
        self.raw["io_bound"] = {}
        # 8 x 8 needs more than the server's default 100 connections once it runs: each
        # process holds up to two per slot (the slot's and its handler process's) besides
        # its listener, heartbeat, reconciler, scheduler and registration ones. 64 slots
        # are measured in 1 and 4 processes.
        # The judged drains last ten seconds at the ideal rate (200 jobs a slot). A drain of
        # two (40 a slot) is reported beside them: a quarter to a third of a second of it
        # is the fleet's ramp (slots woken one claim after another) and its tail (the
        # last slots finishing their batches), which is not the rate the fleet sustains.
        fleets = [(1, 16, 200), (1, 64, 200), (4, 16, 200), (1, 64, 40)]
        for processes, slots, per_slot in fleets if not self.plan.quick else [(1, 16, 5)]:
            tag = f"{processes}x{slots}-{per_slot}"
            print(f"    50 ms I/O-bound jobs at {processes}x{slots}, {per_slot} a slot", flush=True)
            r = durable_bench.io_bound(
                self.ctx,
                processes=processes,
                slots=slots,
                per_slot=per_slot,
                seconds=0.05,
                tag=tag,
            )
            self.raw["io_bound"][tag] = r
            share = r.get("share_of_ideal")
            judged = processes * slots == 64 and per_slot >= 200
            self.table_obj.add(
                f"I/O-bound, warmed-up fleet: {r['n']:,} jobs of 50 ms "
                f"({per_slot * 0.05:g} s at the ideal rate), {processes} x {slots} = "
                f"{processes * slots} slots: jobs/s (share of the ideal slots / 0.05 s); "
                f"{_CPU_COLUMNS}, and at the ideal rate",
                "error"
                if share is None
                else f"{r['per_second']:,.0f} ({share:.0%} of {r['ideal_per_second']:,.0f}); "
                + _drain_cpu_cell(r, r["per_second"], r["ideal_per_second"]),
                "-",
                "-",
                ">= 90%" if judged else "",
                report.verdict(share is not None and share >= 0.9 and r["verified"])
                if judged
                else "info",
                pgqueuer="-",
            )

    def scenario_pinburst(self) -> None:
        """Issue #27 item 8 on a backlog: a 4 x 16 fleet drains ``Plan.scale_drain_n`` no-op
        jobs started in one statement (their run times within a second: the floor's margin
        covers them all), without and with another session pinning the horizon for
        ``PIN_BURST_SECONDS`` from the start, in ``--repeat`` rounds. Target: the pinned
        drain within 2x of the unpinned one, and back to its rate a second after the pin
        ends (docs/performance.rst, "A brief pin over a backlog")."""
        from benchmarks import durable_bench

        n, processes, slots = self.plan.scale_drain_n, 4, 16
        runs: dict[float, list[dict]] = {0.0: [], PIN_BURST_SECONDS: []}
        for round_ in range(self.plan.repeat):
            for pin in runs:
                print(
                    f"    pinburst {processes}x{slots}, {n:,} jobs, pin {pin:g} s "
                    f"(round {round_ + 1}/{self.plan.repeat})",
                    flush=True,
                )
                runs[pin].append(
                    durable_bench.drain_warmed(
                        self.ctx,
                        processes=processes,
                        slots=slots,
                        n=n,
                        seconds=0.0,
                        tag=f"pinburst-{pin:g}-{round_ + 1}",
                        pin_seconds=pin,
                    )
                )
        self.raw["pinburst"] = {f"{pin:g}": tag_runs for pin, tag_runs in runs.items()}
        base = _median_run(runs[0.0]).get("per_second")
        pinned_runs = runs[PIN_BURST_SECONDS]
        pinned = _median_run(pinned_runs)
        rates = [r.get("per_second") or 0.0 for r in pinned_runs]
        after = [r.get("per_second_after_pin") for r in pinned_runs]
        worst = min(
            (r for r in pinned_runs if r.get("per_second")),
            key=lambda r: r["per_second"],
            default=None,
        )
        where = f"{n:,} no-op jobs started at once, {processes} x {slots} slots"
        ratio = pinned.get("per_second") / base if base and pinned.get("per_second") else None
        self.table_obj.add(
            f"a {PIN_BURST_SECONDS:g} s pin over a backlog ({where}): jobs/s unpinned / pinned "
            f"(median of {self.plan.repeat}; every pinned round)",
            f"{base or 0:,.0f} / {pinned.get('per_second') or 0:,.0f}"
            + ("" if ratio is None else f" ({ratio:.2f}x)")
            + f"; [{', '.join(f'{rate:,.0f}' for rate in rates)}]",
            "-",
            "-",
            "within 2x",
            report.verdict(
                ratio is not None
                and ratio >= 0.5
                and all(r.get("verified") for r in pinned_runs)
                and min(rates) >= 0.5 * base
            ),
            pgqueuer="-",
        )
        self.table_obj.add(
            f"a {PIN_BURST_SECONDS:g} s pin over a backlog ({where}): jobs/s from a second "
            "after the pin ended, every pinned round (- : the drain was over)",
            ", ".join("-" if rate is None else f"{rate:,.0f}" for rate in after),
            "-",
            "-",
            "within 2x of unpinned",
            report.verdict(
                bool(base) and all(rate is None or rate >= 0.5 * base for rate in after)
            ),
            pgqueuer="-",
        )
        if worst is not None:
            seconds = worst.get("completions_per_second", [])
            self.table_obj.add(
                f"a {PIN_BURST_SECONDS:g} s pin over a backlog: the slowest pinned round's "
                "completions in each second from its first claim (the first 20)",
                ", ".join(f"{count:,}" for count in seconds[:20]),
                "-",
                "-",
                "",
                "info",
                pgqueuer="-",
            )

    def scenario_horizon(self) -> None:
        """Issue #27 item 8: a steady load while a session pins the horizon (only when named;
        ``--pin-seconds`` sets the pin, 600 for the issue's ten minutes)."""
        from benchmarks import horizon_bench

        pinned = self.plan.pin_seconds
        if self.ctx.server.pg_stat_statements:
            self.ctx.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        result = horizon_bench.run(
            self.ctx,
            rate=self.plan.horizon_rate,
            before=30.0,
            pinned=pinned,
            after=60.0,
        )
        if not self._sampled("horizon", "A pinned horizon", result, horizon_bench.table):
            return
        phases = result["phases"]
        base, pin, after = (phases.get(k, {}) for k in ("before", "pinned", "after"))
        for label, key, fmt in [
            ("jobs/s (median of the samples)", "jobs_per_second", "{:,.0f}"),
            ("claim server ms (worst sample)", "claim_server_ms_max", "{:.3f}"),
            ("sweep server ms (worst sample)", "sweep_server_ms_max", "{:.3f}"),
            ("latency p99 ms (worst sample)", "latency_p99_ms_max", "{:.1f}"),
            ("dead tuples (most)", "dead_tuples_max", "{:,}"),
            ("indexes MiB (most)", "indexes_mib_max", "{:.1f}"),
        ]:
            cells = " / ".join(
                "-" if key not in phase else fmt.format(phase[key]) for phase in (base, pin, after)
            )
            self.table_obj.add(
                f"horizon pinned {pinned:g} s under {self.plan.horizon_rate:g} starts/s: {label}, "
                "before / pinned / after",
                cells,
                "-",
                "-",
                "within 2x of before" if key in ("jobs_per_second", "latency_p99_ms_max") else "",
                "info",
                pgqueuer="-",
            )

    def scenario_bookkeeping(self) -> None:
        """Issue #27 item 6, second half: statements per long slice by kind, against the
        slice's length; heartbeat statements and server CPU for many leases (only when
        named: the server then runs with pg_stat_statements preloaded)."""
        from benchmarks import bookkeeping_bench as bk

        if not self.ctx.server.pg_stat_statements:
            self.notes.append("bookkeeping: pg_stat_statements could not be preloaded; skipped")
            return
        self.ctx.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        quick = self.plan.quick
        lengths = self.plan.slice_lengths
        print(f"    slices of {', '.join(f'{n} s' for n in lengths)} at 2 slots", flush=True)
        began = time.monotonic()
        sliced = bk.slices(self.ctx, lengths=lengths, jobs=2, per_job=2, slots=2)
        interval = 1.0 if quick else None  # None: HEARTBEAT_INTERVAL
        n, owners = self.plan.lease_count, self.plan.lease_owners
        print(f"    {n:,} leases over {owners} heartbeaters ({time.monotonic() - began:.0f} s)")
        began = time.monotonic()
        # --quick: staggered with and without the coalescing only (aligned is the easy case)
        arrangements = bk.ARRANGEMENTS[1:] if quick else bk.ARRANGEMENTS
        leased = bk.leases(
            self.ctx, n=n, owners=owners, interval=interval, arrangements=arrangements
        )
        print(f"    leases done ({time.monotonic() - began:.0f} s)", flush=True)
        self.raw["bookkeeping"] = {"slices": sliced, "leases": leased}
        texts = [
            "Statements per slice by role (2 jobs of 2 slices each, 2 slots, the default "
            "worker):\n" + bk.slices_table(sliced),
            bk.statements_table(sliced),
            f"{n:,} leases over {owners} Heartbeater threads, HEARTBEAT_INTERVAL "
            f"{leased['interval']:g} s:\n" + bk.leases_table(leased),
        ]
        self.bookkeeping_text = "\n\n".join(texts)
        print(self.bookkeeping_text, flush=True)
        self._bookkeeping_rows(sliced, leased)

    def _bookkeeping_rows(self, sliced: dict, leased: dict) -> None:
        from benchmarks import bookkeeping_bench as bk

        if "error" in sliced:
            self.notes.append("bookkeeping slices: " + sliced["error"])
        for length, r in sliced.get("lengths", {}).items():
            if "error" in r:
                self.notes.append(f"bookkeeping {length} s slices: " + r["error"])
                continue
            per = bk.per_slice(r)
            wanted = TARGETS["slice_bookkeeping_statements"]
            self._bookkeeping_row(
                f"{length} s slices ({r['slices']}, 2 slots, default worker), statements per "
                "slice: heartbeat / checkpoint (1 per 1 s batch) / the rest (claim, yield or "
                "completion, their transactions); all per slice-second",
                f"{per['heartbeat']:.1f} / {per['checkpoint']:.1f} / {per['fixed']:.1f}; "
                f"{per['all'] / length:.1f}/s",
                f"rest <= {wanted:g}",
                per["fixed"] <= wanted,
            )
        wanted = TARGETS["heartbeat_statements_per_worker_interval"]
        owners, interval = leased["owners"], leased["interval"]
        for name, r in leased["arrangements"].items():
            per_interval = r["statements_per_second"] * interval / owners
            cpu = (
                "-"
                if r["server_cpu_share"] is None
                else f"{r['server_cpu_share']:.1%}; {r['server_cpu_ms_per_s_per_1000']:.1f}"
            )
            self._bookkeeping_row(
                f"{r['claimed']:,} leases, {owners} heartbeaters ({name}), interval "
                f"{interval:g} s: heartbeat statements/s (per worker per interval); leases "
                "renewed/s; server CPU; server CPU ms/s per 1,000 leases",
                f"{r['statements_per_second']:.1f} ({per_interval:.1f}); "
                f"{r['rows_per_second']:,.0f}; {cpu}",
                f"<= {wanted:g} per worker per interval",
                per_interval <= wanted and r["renewed_in_window"] == r["claimed"],
            )

    def _bookkeeping_row(self, label: str, cell: str, target: str, ok: bool) -> None:
        self.table_obj.add("bookkeeping: " + label, cell, "-", "-", target, report.verdict(ok))

    def scenario_sustained(self) -> None:
        """Issue #27 item 5: a default fleet's peak, then 80 % of it for ten minutes (only when
        named; ``--sustained-minutes``, ``--sustained-peak``)."""
        from benchmarks import sustained_bench

        with sustained_bench.naptime(self.ctx, self.plan.sustained_naptime):
            r = sustained_bench.run(
                self.ctx,
                seconds=self.plan.sustained_seconds,
                peak=self.plan.sustained_peak,
                backlog=self.plan.sustained_backlog,
            )
        if not self._sampled("sustained", "Sustained throughput", r, sustained_bench.table):
            return
        first, last = r["samples"][0], r["samples"][-1]
        fleet = f"{r['processes']} default workers (1 slot each)"
        if self.plan.sustained_naptime is not None:
            fleet += f", autovacuum_naptime {self.plan.sustained_naptime:g} s"
        peak = (
            f"peak {r['peak']:,.0f}/s ({r['backlog']:,}-job drain)"
            if r["peak_measured"]
            else f"peak {r['peak']:,.0f}/s (given)"
        )
        length = f"{r['seconds']:g} s" if r["seconds"] < 120 else f"{r['seconds'] / 60:g} min"
        head = f"sustained {length}, {fleet}, {peak}:"
        edge = f"{r['edge_seconds']} s" if r["edge_seconds"] != 60 else "minute"
        wanted = TARGETS["sustained_ratio"]
        rows = [
            (
                f"{head} offered / completed jobs/s; first / last {edge} (ratio)",
                f"{r['offered_per_second']:,.0f}; {r['first_per_second']:,.0f} / "
                f"{r['last_per_second']:,.0f} ({r['ratio'] or 0:.2f})",
                f">= {wanted:.2f}",
                report.verdict(r["ratio"] is not None and r["ratio"] >= wanted),
            ),
            (
                f"{head} worst {sustained_bench.WINDOW} s window, jobs/s (share of offered; at s)",
                f"{r['worst_window_per_second'] or 0:,.0f} ({r['worst_window_share'] or 0:.0%}; "
                f"{r['worst_window_at']})",
                "",
                "info",
            ),
            (
                f"{head} dead tuples (most); autovacuums (samples with one running: their jobs/s "
                "/ the others'); checkpoints",
                f"{r['dead_tuples_max']:,}; {r['autovacuums']} ({r['vacuum_samples']}: "
                f"{r['per_second_vacuuming'] or 0:,.0f} / {r['per_second_otherwise'] or 0:,.0f}); "
                f"{r['checkpoints'] if r['checkpoints'] is not None else '-'}",
                "",
                "info",
            ),
            (
                f"{head} table / indexes MiB at start -> end; claim server planning / "
                "execution ms, start -> end",
                f"{first['table_mib']:.1f} / {first['indexes_mib']:.1f} -> "
                f"{last['table_mib']:.1f} / {last['indexes_mib']:.1f}; "
                f"{first['claim_planning_ms'] or 0:.1f} / {first['claim_server_ms'] or 0:.2f} -> "
                f"{last['claim_planning_ms'] or 0:.1f} / {last['claim_server_ms'] or 0:.2f}",
                "",
                "info",
            ),
        ]
        for label, cell, target, status in rows:
            self.table_obj.add(label, cell, "-", "-", target, status, pgqueuer="-")

    def scenario_size(self) -> None:
        from benchmarks import durable_bench

        durable_bench.reset()
        per_size = {}
        for size in self.plan.sizes:
            print(f"    table with {size:,} finished rows", flush=True)
            grown = durable_bench.grow_finished(self.ctx, size)
            measured = durable_bench.dequeue_and_reconcile(
                self.ctx,
                reps=self.plan.dq_reps,
                passes=self.plan.passes,
                explain_reps=self.plan.explain_reps,
            )
            self.plans[f"{size:,} finished rows"] = measured.pop("plans")
            per_size[size] = grown | measured
        self.raw["size"] = per_size
        sizes = list(per_size)
        labels = " / ".join(_size_label(s) for s in sizes)

        def series(key: str, digits: int = 2) -> str:
            return " / ".join(f"{per_size[s][key]:.{digits}f}" for s in sizes)

        self.table_obj.add(
            f"dequeue p50, client round trip (async commit), at {labels} finished rows (ms)",
            series("dequeue_p50_ms"),
            "-",
            "-",
            "",
            "info",
        )
        self.table_obj.add(
            f"dequeue p50, server execution, at {labels} (ms)",
            series("dequeue_exec_p50_ms", 3),
            "-",
            "-",
            "",
            "info",
        )
        self.table_obj.add(
            f"reconciler pass p50 at {labels} (ms)",
            series("reconcile_p50_ms"),
            "-",
            "-",
            "",
            "info",
        )
        if all(per_size[s].get("retention_delete", {}).get("variant_differs") for s in sizes):
            self.table_obj.add(
                f"  of which retention DELETE, server, at {labels}: as written | with now() (ms)",
                " / ".join(f"{per_size[s]['retention_delete']['as_written_ms']:.2f}" for s in sizes)
                + "  |  "
                + " / ".join(
                    f"{per_size[s]['retention_delete']['with_now_ms']:.2f}" for s in sizes
                ),
                "-",
                "-",
                "",
                "what-if",
            )
        empty = per_size.get(0)
        target = f"<= +{TARGETS['dequeue_growth']:.0%} vs empty"
        for size in sizes:
            if size == 0 or empty is None:
                continue
            client = per_size[size]["dequeue_p50_ms"] / empty["dequeue_p50_ms"] - 1
            server = per_size[size]["dequeue_exec_p50_ms"] / empty["dequeue_exec_p50_ms"] - 1
            # Judged on the server's execution time: what the table's size can change. The
            # client round trip is shown beside it; it adds the network and Python, which do
            # not depend on the table, and the noise of a shared machine.
            ok = server <= TARGETS["dequeue_growth"]
            status = (
                report.verdict(ok) if size >= 1_000_000 else report.verdict(ok) + " (indicative)"
            )
            self.table_obj.add(
                f"dequeue at {_size_label(size)} finished rows vs empty: server (client)",
                f"{server:+.1%} ({client:+.1%})",
                "-",
                "-",
                target,
                status,
            )
        backlogs = {}
        for backlog in self.plan.backlogs:
            print(f"    backlog of {backlog:,} pending jobs", flush=True)
            measured = durable_bench.dequeue_backlog(
                self.ctx, backlog, reps=self.plan.dq_reps, explain_reps=self.plan.explain_reps
            )
            self.plans[f"a backlog of {backlog:,} pending jobs"] = {"DEQUEUE": measured.pop("plan")}
            backlogs[backlog] = measured
        self.raw["backlog"] = backlogs
        if backlogs:
            labels = " / ".join(_size_label(b) for b in backlogs)
            self.table_obj.add(
                f"dequeue p50 with {labels} pending jobs due: client / server (ms)",
                " / ".join(f"{b['dequeue_p50_ms']:.2f}" for b in backlogs.values())
                + "  |  "
                + " / ".join(f"{b['dequeue_exec_p50_ms']:.2f}" for b in backlogs.values()),
                "-",
                "-",
                "",
                "info",
            )
        if 1_000_000 not in per_size:
            self.table_obj.add(
                "dequeue at 1M finished rows vs empty",
                "not run (add --large)",
                "-",
                "-",
                target,
                "not run",
            )

    # --- output --------------------------------------------------------------------------
    def unverified(self) -> list[str]:
        bad = [
            f"throughput {tag} round {i + 1}"
            for tag, r in self.raw.get("throughput_runs", {}).items()
            for i, run in enumerate(r.get("durable", []))
            if not run.get("verified")
        ]
        bad += [
            f"latency {tag}"
            for tag, r in self.raw.get("latency", {}).items()
            if not r.get("verified")
        ]
        return bad

    def table(self) -> report.Table:
        return self.table_obj

    def plans_text(self) -> str:
        if not self.plans:
            return "(the size scenario did not run)"
        parts = []
        for size, plans in self.plans.items():
            for name, text in plans.items():
                parts.append(f"### {name} with {size}\n\n" + report.block(text))
        return "\n\n".join(parts)

    def method_notes(self) -> list[str]:
        p = self.plan
        return [
            "Throughput = completed rows counted in SQL / database-clock window from the first "
            "claim "
            "(min started_at) to the last completion (max finished_at); the JSON file also has the "
            "wall "
            "time including process start-up. A run is marked UNVERIFIED unless every pre-filled "
            "job "
            "completed and every worker exited 0. With --repeat R (default 3) every configuration "
            "of every system runs once per round, rounds one after the other; the cell shows the "
            "median "
            "run and [min-max] of the rounds.",
            "durable_jobs runs with the test project's settings (benchmarks/settings_bench.py adds "
            "only the "
            "no-op handler and the NOTIFY/poll switches). The django-tasks-db peer runs with "
            "persistent "
            "connections (CONN_MAX_AGE=None): its db_worker calls close_old_connections() around "
            "every "
            "task, which under Django's default CONN_MAX_AGE=0 would open a new session per task; "
            "the "
            "peer gets its best reasonable configuration, not its default.",
            "Latency = started_at - created_at, both stamped by the database (django-tasks-db: by "
            "the "
            f"Python clock of the same machine), percentiles computed over {p.latency_m} single "
            "jobs started "
            f"{p.gap * 1000:.0f} ms apart on average (uniform jitter), each in its own "
            "transaction, to an "
            f"idle worker with {p.latency_slots} slots.",
            "Peers run their default worker configuration: pgqueuer its own `pgq run` command "
            "as is (batch of 10, no concurrency limit; it has no slot count, so each row runs "
            "the same worker), the row marked TUNED excepted (--batch-size 4); Procrastinate an "
            "async no-op task (its cheapest path) with --concurrency K in one process, and "
            "LISTEN/NOTIFY (or --no-listen for the poll path); django-tasks-db has no "
            "in-process concurrency and no NOTIFY, so '4 slots' is 4 db_worker processes and "
            "'2 processes x 2 slots' is 2 db_worker processes. Ratios in brackets are peer / "
            "durable_jobs measured in the same run on the same server.",
            "Every system logs at INFO (durable_worker -v 1, Procrastinate and db_worker at INFO) "
            "to a file.",
            "Peak RSS is the kernel's high-water mark of the worker process (VmHWM in "
            "/proc/<pid>/status, "
            "read every 20 ms; for several processes, the largest). CPU per job is the worker "
            "processes' "
            "user+system time (os.wait4 rusage, process start-up included: ~0.3 s, so a small --n "
            "inflates it) / completed jobs; the server's is the postmaster's and its "
            "backends' CPU over the same run (a local embedded server only).",
        ]


def _slots_of(tag: str) -> int:
    processes, slots = (int(x) for x in tag.split("x"))
    return processes * slots


def _fresh_connection() -> None:
    from django.db import connection

    try:
        connection.close()
    except Exception:  # noqa: BLE001
        connection.connection = None


def _baseline_commits(ctx, n: int) -> dict:
    import psycopg

    with psycopg.connect(ctx.dburl, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_baseline (id bigserial PRIMARY KEY, at timestamptz)"
        )
        conn.execute("TRUNCATE bench_baseline")
        began = time.perf_counter()
        for _ in range(n):
            conn.execute("INSERT INTO bench_baseline (at) VALUES (now())")
        elapsed = time.perf_counter() - began
        conn.execute("DROP TABLE bench_baseline")
    return {"n": n, "seconds": elapsed, "per_second": n / elapsed}


def _versioned(label: str, peers: dict, key: str, package: str) -> str:
    return f"{label} {peers[key].versions.get(package) or ''}".strip()


def _short(text: str | None, limit: int = 60) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _size_label(size: int) -> str:
    if size >= 1_000_000 and size % 1_000_000 == 0:
        return f"{size // 1_000_000}M"
    if size >= 1000 and size % 1000 == 0:
        return f"{size // 1000}k"
    return str(size)


def _rate_cell(result: dict, ours: float | None) -> str:
    if "error" in result:
        return "error: " + _short(result["error"])
    return report.num(result["per_second"]) + report.ratio(result["per_second"], ours)


def _median_run(runs: list[dict]) -> dict:
    """The run with the median rate (the lower middle of an even count); an error if none worked."""
    good = sorted(
        (r for r in runs if "error" not in r and r.get("per_second")), key=lambda r: r["per_second"]
    )
    if not good:
        return runs[-1] if runs else {"error": "no run"}
    return good[(len(good) - 1) // 2]


def _throughput_cell(result: dict, ours: float | None, runs: list[dict] | None = None) -> str:
    if "error" in result:
        return "error: " + _short(result["error"])
    text = report.num(result.get("per_second")) + report.ratio(result.get("per_second"), ours)
    rates = [r["per_second"] for r in (runs or []) if "error" not in r and r.get("per_second")]
    if len(rates) > 1:
        text += f" [{min(rates):,.0f}-{max(rates):,.0f}]"
    failed = [r for r in (runs or []) if "error" in r or not r.get("verified")]
    if failed and result.get("verified"):
        text += f" ({len(failed)} of {len(runs)} runs failed)"
    if not result.get("verified"):
        text += (
            f" UNVERIFIED: {result['completed']}/{result['n']} completed, "
            f"exits {result['exit_codes']}"
        )
    return text


def _meets(result: dict, target: float) -> bool | None:
    if "error" in result:
        return None
    return bool(result.get("verified")) and (result.get("per_second") or 0) >= target


def _latency_ok(result: dict, target_ms: float) -> bool | None:
    if "error" in result or result.get("p99_ms") is None:
        return None
    return bool(result.get("verified")) and result["p99_ms"] <= target_ms


def _cpu_cell(result: dict | None) -> str:
    if not result or not result.get("completed"):
        return "n/a"
    worker = f"{1000 * result['worker_cpu_seconds'] / result['completed']:.2f}"
    server = result.get("server_cpu_seconds")
    return worker + (
        f" / {1000 * server / result['completed']:.2f}" if server is not None else " / n/a"
    )


def _latency_cell(result: dict) -> str:
    if "unsupported" in result:
        return "n/a: " + result["unsupported"]
    if "error" in result:
        return "error: " + _short(result["error"])
    if result.get("p50_ms") is None:
        return "n/a"
    text = f"{result['p50_ms']:.1f} / {result['p99_ms']:.1f}"
    if not result.get("verified"):
        text += f" UNVERIFIED: {result['completed']}/{result['m']} ran"
    return text
