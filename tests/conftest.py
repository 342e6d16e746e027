"""Shared fixtures. The database is a real PostgreSQL: a throwaway embedded server
started by ``testproject.settings_test`` unless ``DATABASE_URL`` names one."""

from __future__ import annotations

from urllib.parse import quote

import psycopg
import pytest
from django.db import connection

from durable_jobs import registry


def database_url() -> str:
    """A psycopg URL of the database the tests run against (the test database)."""
    s = connection.settings_dict
    user = quote(s.get("USER") or "postgres")
    password = quote(s.get("PASSWORD") or "")
    host = s.get("HOST") or ""
    port = s.get("PORT") or ""
    if host.startswith("/"):
        query = f"?host={quote(host)}" + (f"&port={port}" if port else "")
        return f"postgresql://{user}:{password}@/{s['NAME']}{query}"
    return f"postgresql://{user}:{password}@{host}{':' + str(port) if port else ''}/{s['NAME']}"


@pytest.fixture
def db_url(transactional_db) -> str:
    return database_url()


@pytest.fixture
def other_connection(transactional_db):
    """A second, independent connection: for races and for seeing only committed rows."""
    conn = psycopg.connect(database_url(), autocommit=True)
    yield conn
    conn.close()


@pytest.fixture
def kinds():
    """Register handlers for a test and forget them afterwards:
    ``kinds.add(kind, func, **policy)``."""

    class Kinds:
        def __init__(self) -> None:
            self.added: list[str] = []

        def add(self, kind: str, func=None, **policy):
            registry.handler(kind, **policy)(func or (lambda job: "done"))
            self.added.append(kind)
            return registry.get(kind)

    bag = Kinds()
    yield bag
    for kind in bag.added:
        registry.unregister(kind)
