"""The pgqueuer peer: a no-op entrypoint, the factory its worker command runs, and the clients.

Runs inside ``benchmarks/.venvs/pgqueuer`` (created by ``python -m benchmarks``), against
``PEER_DATABASE_URL``, on asyncpg (pgqueuer's own default driver). It only produces load;
every figure is computed by the runner in SQL from pgqueuer's own log table
(``pgqueuer_log``: one row per job and status, ``created`` stamped by the database clock).

    pgqueuer_peer.py schema                              # pgq install
    pgqueuer_peer.py fill --n 5000                       # pre-fill (batched enqueues)
    pgqueuer_peer.py start-rate --n 1000                 # one enqueue per transaction, 1 client
    pgqueuer_peer.py latency --n 200 --gap 0.03          # spaced single enqueues
    pgq run pgqueuer_peer:create --batch-size 4 [--mode drain]   # its worker command
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.queries import Queries

ENTRYPOINT = "noop"


@contextlib.asynccontextmanager
async def create(args: list[str] | None = None) -> AsyncIterator[PgQueuer]:
    """The factory ``pgq run`` calls: one asyncpg connection, one no-op entrypoint.

    ``args[0]`` (after ``--`` on its command line, handed over as one list), if given, is
    the entrypoint's ``concurrency_limit`` (default 0: pgqueuer's default, no limit).
    """
    connection = await asyncpg.connect(os.environ["PEER_DATABASE_URL"])
    pgq = PgQueuer.from_asyncpg_connection(connection)

    @pgq.entrypoint(ENTRYPOINT, concurrency_limit=int(args[0]) if args else 0)
    async def noop(job) -> None:
        """The cheapest job pgqueuer runs: a coroutine on its event loop."""

    try:
        yield pgq
    finally:
        await connection.close()


async def _client(args) -> None:
    connection = await asyncpg.connect(os.environ["PEER_DATABASE_URL"])
    queries = Queries.from_asyncpg_connection(connection)
    try:
        if args.command == "fill":
            done = 0
            while done < args.n:
                chunk = min(1000, args.n - done)
                await queries.enqueue([ENTRYPOINT] * chunk, [None] * chunk, [0] * chunk)
                done += chunk
        elif args.command == "start-rate":
            await queries.enqueue(ENTRYPOINT, None)  # warm the connection and its statements
            began = time.perf_counter()
            for _ in range(args.n):
                await queries.enqueue(ENTRYPOINT, None)
            print(json.dumps({"n": args.n, "seconds": time.perf_counter() - began}))
        elif args.command == "latency":
            rng = random.Random(args.seed)
            for _ in range(args.n):
                await queries.enqueue(ENTRYPOINT, None)
                await asyncio.sleep(rng.uniform(args.gap / 2, args.gap * 1.5))
    finally:
        await connection.close()


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
    args = parser.parse_args(argv)
    if args.command == "schema":
        pgq = Path(sys.executable).with_name("pgq")
        return subprocess.run(
            [str(pgq), "--pg-dsn", os.environ["PEER_DATABASE_URL"], "install"], check=False
        ).returncode
    asyncio.run(_client(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
