"""The benchmark's handlers (a Django app so ``durable.py`` is discovered like any app's).

``ready()`` also switches off the mechanism ``BENCH_OFF`` names, from the benchmark's
side (nothing in ``durable_jobs/`` is edited), in every process that sets Django up: the
worker and its handler processes. ``prefetch`` and ``zygote`` are plain settings
(``settings_bench.py``); the others are patched here:

``cloader``     ``durable_jobs.db.C_TIMESTAMPTZ_LOADER = None``: Django's own timestamp loader.
``srvbind``     ``durable_jobs.db.ServerBindingCursor = None``: client-side binding even where
                the connection prepares statements.
``sendahead``   a batch's runs are sent to the handler process one at a time, each after the
                one before has finished, never queued ahead there (the product has no setting
                for it: ``worker._goes_straight_to_its_handler`` is patched to say no).
"""

import os
import sys

from django.apps import AppConfig

MECHANISMS = ("prefetch", "sendahead", "zygote", "cloader", "srvbind")


class BenchConfig(AppConfig):
    name = "benchmarks.bench_app"
    label = "durable_bench"
    verbose_name = "durable_jobs benchmarks"

    def ready(self) -> None:
        off = os.environ.get("BENCH_OFF", "").strip()
        if not off:
            return
        if off not in MECHANISMS:
            raise RuntimeError(f"BENCH_OFF={off!r}: not one of {', '.join(MECHANISMS)}")
        from durable_jobs import db
        from durable_jobs.runtime import worker

        if off == "cloader":
            db.C_TIMESTAMPTZ_LOADER = None
        elif off == "srvbind":
            db.ServerBindingCursor = None
        elif off == "sendahead":
            worker._goes_straight_to_its_handler = lambda job, ttl_ms: False
        print(f"benchmarks: mechanism {off!r} switched off (pid {os.getpid()})", file=sys.stderr)
