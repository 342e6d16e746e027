"""Unique jobs by arguments (invariant 25): the key columns and their two unique indexes.

Three nullable columns, so adding them rewrites nothing; a start without ``unique``
leaves them NULL and no partial index below holds its row. The live index is declared on
the model. The window index is partial on ``status = ANY(unique_states)`` (the statuses a
row's key covers, chosen at its start), which a Django ``Q`` cannot spell, so it is
created here in SQL: an operator between two columns is immutable, as an index predicate
must be, and a job leaves the index by itself when it moves to a status its key does not
cover. Both indexes are built as the table is locked by the migration; on a large table,
build them ``CONCURRENTLY`` first by hand under the same names.
"""

from django.db import migrations, models

import durable_jobs.fields

TABLE = "durable_jobs_job"
WINDOW_INDEX = "durable_jobs_unique_window"


class Migration(migrations.Migration):
    dependencies = [
        ("durable_jobs", "0009_workers"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="unique_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="unique_states",
            field=durable_jobs.fields.StatusArrayField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="unique_window",
            field=models.CharField(blank=True, max_length=40, null=True),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                models.F("unique_key"),
                condition=models.Q(
                    ("status__in", ("pending", "running")), ("unique_key__isnull", False)
                ),
                name="durable_jobs_unique_live",
            ),
        ),
        migrations.RunSQL(
            f"CREATE UNIQUE INDEX IF NOT EXISTS {WINDOW_INDEX} ON {TABLE} (unique_key, unique_window)"
            " WHERE unique_window IS NOT NULL AND status = ANY(unique_states)",
            reverse_sql=f"DROP INDEX IF EXISTS {WINDOW_INDEX}",
        ),
    ]
