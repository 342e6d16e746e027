"""Rebuild the five newest-first indexes without running rows.

A claim and a completion each change ``status``, so neither is a HOT update: every version
of a row enters every index whose predicate it meets. These five had no predicate, so the
claim's version (status ``running``) cost five index entries a job, about a fifth of the
server's CPU per no-op job (issue #27). Readers that page newest first get the running
rows back through ``models.newest_first``: two index walks merged by the server.

The rebuild runs in one transaction (no moment without the indexes), reads the table once
per index and blocks job writes meanwhile: on a large table, apply it at a quiet moment
(docs/operations.rst, "Upgrading").
"""

from django.db import migrations, models

NOT_RUNNING = ~models.Q(status="running")
NEWEST = (
    models.OrderBy(models.F("created_at"), descending=True),
    models.OrderBy(models.F("id"), descending=True),
)


def _rebuilt(name, index):
    return [
        migrations.RemoveIndex(model_name="job", name=name),
        migrations.AddIndex(model_name="job", index=index),
    ]


class Migration(migrations.Migration):
    dependencies = [
        ("durable_jobs", "0016_deliverable_without_status"),
    ]

    operations = [
        *_rebuilt(
            "durable_jobs_recent",
            models.Index(*NEWEST, condition=NOT_RUNNING, name="durable_jobs_recent"),
        ),
        *_rebuilt(
            "durable_jobs_status_recent",
            models.Index(
                models.F("status"),
                *NEWEST,
                condition=NOT_RUNNING,
                name="durable_jobs_status_recent",
            ),
        ),
        *_rebuilt(
            "durable_jobs_kind_recent",
            models.Index(
                models.F("kind"), *NEWEST, condition=NOT_RUNNING, name="durable_jobs_kind_recent"
            ),
        ),
        *_rebuilt(
            "durable_jobs_queue_recent",
            models.Index(
                models.F("queue_name"),
                *NEWEST,
                condition=NOT_RUNNING,
                name="durable_jobs_queue_recent",
            ),
        ),
        *_rebuilt(
            "durable_jobs_tenant_recent",
            models.Index(
                fields=["tenant_id", "-created_at", "-id"],
                condition=NOT_RUNNING,
                name="durable_jobs_tenant_recent",
            ),
        ),
    ]
