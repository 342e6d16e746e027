"""``python -m benchmarks``: the one entry point.

``python -m benchmarks [options]``            the scenarios (``benchmarks/run.py``)
``python -m benchmarks console [options]``    the operator console on a million rows
                                              (``benchmarks/admin_bench.py``)
``python -m benchmarks ten-million [options]`` 10M finished rows, retention under load,
                                              PgBouncer (``benchmarks/scale_bench.py``)
"""

import sys

COMMANDS = {"console": "benchmarks.admin_bench", "ten-million": "benchmarks.scale_bench"}


def _main(argv: list[str]) -> int:
    if argv and argv[0] in COMMANDS:
        import importlib

        return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
    from benchmarks.run import main

    return main(argv)


sys.exit(_main(sys.argv[1:]))
