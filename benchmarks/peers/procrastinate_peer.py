"""The Procrastinate peer: a no-op task, its worker, and the clients that start jobs.

Runs inside ``benchmarks/.venvs/procrastinate`` (created by ``python -m benchmarks``),
against ``PEER_DATABASE_URL``. It only produces load; every figure is computed by the
runner in SQL from Procrastinate's own tables (``procrastinate_jobs`` and the
``procrastinate_events`` its triggers write with the database clock).

    procrastinate_peer.py schema
    procrastinate_peer.py fill --n 5000                  # pre-fill (batched defers)
    procrastinate_peer.py start-rate --n 1000            # one defer per transaction, 1 client
    procrastinate_peer.py latency --n 200 --gap 0.03     # spaced single defers
    procrastinate_peer.py worker --concurrency 4 [--one-shot] [--no-listen] [--poll-interval 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time

import procrastinate

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ["PEER_DATABASE_URL"])
)


@app.task(name="noop", queue="default")
async def noop() -> None:
    """The cheapest task Procrastinate runs: a coroutine, no thread hop."""
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("schema")
    fill = sub.add_parser("fill")
    fill.add_argument("--n", type=int, required=True)
    rate = sub.add_parser("start-rate")
    rate.add_argument("--n", type=int, required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--n", type=int, required=True)
    lat.add_argument("--gap", type=float, required=True)
    lat.add_argument("--seed", type=int, default=6)
    worker = sub.add_parser("worker")
    worker.add_argument("--concurrency", type=int, default=1)
    worker.add_argument("--one-shot", action="store_true")
    worker.add_argument("--no-listen", action="store_true")
    worker.add_argument("--poll-interval", type=float, default=1.0)
    args = parser.parse_args(argv)

    if args.command == "worker":
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        app.run_worker(
            concurrency=args.concurrency,
            wait=not args.one_shot,
            listen_notify=not args.no_listen,
            fetch_job_polling_interval=args.poll_interval,
            install_signal_handlers=True,
        )
        return 0

    with app.open():
        if args.command == "schema":
            app.schema_manager.apply_schema()
        elif args.command == "fill":
            done = 0
            while done < args.n:
                chunk = min(1000, args.n - done)
                noop.batch_defer(*[{} for _ in range(chunk)])
                done += chunk
        elif args.command == "start-rate":
            noop.defer()  # warm the pool
            began = time.perf_counter()
            for _ in range(args.n):
                noop.defer()
            print(json.dumps({"n": args.n, "seconds": time.perf_counter() - began}))
        elif args.command == "latency":
            rng = random.Random(args.seed)
            for _ in range(args.n):
                noop.defer()
                time.sleep(rng.uniform(args.gap / 2, args.gap * 1.5))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
