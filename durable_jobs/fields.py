"""Model fields the schema needs that Django only ships in ``django.contrib.postgres``.

``ArrayField`` would make every project that installs durable_jobs add
``django.contrib.postgres`` to ``INSTALLED_APPS``: from Django 6.1 its system check
(postgres.E005) refuses the field otherwise, and a worker's start-up check with it. The
one array column the job row has needs none of that app's machinery: the store writes
it with hand-written SQL (psycopg adapts a list to an array) and psycopg reads an array
back as a list.
"""

from __future__ import annotations

from typing import Any

from django.db import models


class StatusArrayField(models.Field):
    """A ``varchar(16)[]`` column of job statuses, read and written as a list of strings."""

    description = "A list of job statuses (a PostgreSQL varchar(16)[])"

    def db_type(self, connection: Any) -> str:
        return "varchar(16)[]"

    def get_prep_value(self, value: Any) -> Any:
        return None if value is None else [str(status) for status in value]

    def to_python(self, value: Any) -> Any:
        return None if value is None else list(value)
