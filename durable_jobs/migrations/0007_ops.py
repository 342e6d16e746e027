"""Storage settings for a job table that churns: per-table autovacuum, fillfactor kept.

Measured in ``benchmarks/scale_bench.py`` (figures in the README's Performance section):

* ``fillfactor`` stays at 70 (set in 0001). A job row is written three to four times
  (start, claim, heartbeats, completion); the free third of each page lets the new
  version land on the same page, and keeps heartbeats HOT. Finished rows are deleted by
  retention and their space reused, so the third is not lost for good.
* Autovacuum is told to come far sooner than PostgreSQL's defaults (20 % of the table
  dead before a vacuum): at ten million rows that is two million dead rows, minutes of
  bloat at a few thousand jobs per second. A fixed threshold plus 1 % of the table, a
  short cost delay so one vacuum keeps up with retention's deletes, and insert-driven
  vacuums so index-only scans and the visibility map stay current.

These are storage parameters only: a server with autovacuum off (``autovacuum = off``)
ignores them, and its operator must run ``VACUUM`` on the table.
"""

from django.db import migrations

TABLE = "durable_jobs_job"
AUTOVACUUM = {
    "autovacuum_vacuum_threshold": "10000",
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_insert_threshold": "10000",
    "autovacuum_vacuum_insert_scale_factor": "0.02",
    "autovacuum_analyze_threshold": "10000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "1",
}


class Migration(migrations.Migration):
    dependencies = [
        ("durable_jobs", "0006_perf"),
    ]

    operations = [
        migrations.RunSQL(
            f"ALTER TABLE {TABLE} SET ({', '.join(f'{k} = {v}' for k, v in AUTOVACUUM.items())})",
            reverse_sql=f"ALTER TABLE {TABLE} RESET ({', '.join(AUTOVACUUM)})",
        ),
    ]
