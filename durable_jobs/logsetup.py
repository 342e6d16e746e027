"""Console logging for the worker and reconciler commands when the project configured none.

A fresh Django project has no handler on the root logger nor on ``durable_jobs``, so
Python would drop every INFO line and print warnings bare. The commands call
``configure(verbosity)`` first thing: it sets the level from ``-v`` and, only when no
handler is configured, attaches one that writes to stderr with time, level and logger.

A project takes over by configuring any handler in ``LOGGING`` for the ``durable_jobs``
logger or the root logger; ``-v`` still sets the ``durable_jobs`` level.
"""

from __future__ import annotations

import logging

LOGGER = "durable_jobs"
FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

#: ``-v`` of the commands: 0 warnings only, 1 (the default) what the worker does, 2+ debug.
LEVELS = {0: logging.WARNING, 1: logging.INFO}


def level_for(verbosity: int | None) -> int:
    if verbosity is None:
        return logging.INFO
    return LEVELS.get(verbosity, logging.DEBUG if verbosity > 1 else logging.WARNING)


def configure(verbosity: int | None) -> None:
    """Set the ``durable_jobs`` level from ``-v``; add a stderr handler if none is configured."""
    logger = logging.getLogger(LOGGER)
    logger.setLevel(level_for(verbosity))
    if _configured(logger):
        return
    handler = logging.StreamHandler()  # stderr
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)


def _configured(logger: logging.Logger) -> bool:
    """True when the project already sends these lines somewhere (LOGGING or its own code)."""
    if logger.handlers or logging.getLogger().handlers:
        return True
    prefix = LOGGER + "."
    return any(
        isinstance(child, logging.Logger) and child.handlers
        for name, child in logging.Logger.manager.loggerDict.items()
        if name.startswith(prefix)
    )
