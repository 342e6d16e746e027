"""Benchmarks of durable_jobs (and, side by side, of Procrastinate and django-tasks-db).

Run from the repository root with the project's virtual environment::

    .venv/bin/python -m benchmarks            # default run, about 10 minutes on 2 cores
    .venv/bin/python -m benchmarks --quick    # smoke run, about 4 minutes

See ``benchmarks/run.py`` (``--help``) for the scenarios and options.
"""
