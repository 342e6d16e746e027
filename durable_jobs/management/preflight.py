"""Before a command touches the job table: can it reach the database, and is it migrated?

A worker, the reconciler, ``durable_jobs stats`` or the demo run against a database that
is unreachable or was never migrated used to answer with a traceback from deep inside
the first statement. These checks answer in one line that names what to do.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, connections
from django.db.migrations.executor import MigrationExecutor

from durable_jobs import validation

APP = "durable_jobs"


def unreachable(using: str = DEFAULT_DB_ALIAS) -> str | None:
    """Return one line saying why ``using`` cannot be reached, or None when it answers."""
    try:
        connections[using].ensure_connection()
    except (DatabaseError, InterfaceError) as error:
        return _cannot_reach(using, error)
    return None


def database_problem(using: str = DEFAULT_DB_ALIAS) -> str | None:
    """Return one line saying why durable_jobs cannot use ``using``, or None when it can."""
    return unreachable(using) or unmigrated(using)


def unmigrated(using: str = DEFAULT_DB_ALIAS) -> str | None:
    """Return one line saying durable_jobs' migrations are not all applied on ``using``, or
    None when they are, or when the database cannot be asked (that is ``unreachable``'s
    answer: a standing worker waits an outage out instead of refusing to start)."""
    connection = connections[using]
    try:
        connection.ensure_connection()
        executor = MigrationExecutor(connection)
        targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP]
        missing = [
            f"{migration.app_label}.{migration.name}"
            for migration, backwards in executor.migration_plan(targets)
            if not backwards and migration.app_label == APP
        ]
    except (DatabaseError, InterfaceError):
        return None
    if missing:
        return (
            f"database {using!r} lacks durable_jobs' tables or their latest changes "
            f"({len(missing)} migration(s) not applied, first {missing[0]}): "
            "run python manage.py migrate"
        )
    return None


def _cannot_reach(using: str, error: DatabaseError | InterfaceError) -> str:
    # The driver's message spans lines ("connection refused\n\tIs the server running"):
    # the first one says it.
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    settings = connections[using].settings_dict
    where = f"{settings.get('HOST') or 'local socket'}:{settings.get('PORT') or 'default port'}"
    return validation.printable(
        f"cannot reach database {using!r} ({settings.get('NAME')} at {where}): {first}; "
        "check DATABASES (or DATABASE_URL) and that the server is running",
        limit=400,
    )
