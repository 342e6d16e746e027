"""Workflows (invariants 29 and 30): a child's parent and spawn key, the parent's child
counters and last wait, a job's dependents and dependency counters, and the event table.

Nullable columns and columns with a database default, so adding them rewrites nothing; a
job outside a workflow keeps them NULL/0 and no partial index below holds its row. The
child-key index is built as the table is locked by the migration; on a large table, build
it ``CONCURRENTLY`` first by hand under the same name.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_jobs", "0012_schedules"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobEvent",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job_id", models.UUIDField()),
                ("name", models.CharField(max_length=100)),
                ("payload", models.JSONField(blank=True, null=True)),
                ("sent_at", models.DateTimeField()),
                ("consumed_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": "durable_jobs_event",
                "default_permissions": ("view",),
            },
        ),
        migrations.AddField(
            model_name="job",
            name="children_ended",
            field=models.IntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="job",
            name="children_failed",
            field=models.IntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="job",
            name="children_total",
            field=models.IntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="job",
            name="dependents",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="deps_ended",
            field=models.IntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="job",
            name="deps_failed",
            field=models.IntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="job",
            name="deps_total",
            field=models.IntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="job",
            name="flow_wait",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="parent_id",
            field=models.UUIDField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="spawn_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(("parent_id__isnull", False)),
                fields=("parent_id", "spawn_key"),
                name="durable_jobs_child_key",
            ),
        ),
        migrations.AddIndex(
            model_name="jobevent",
            index=models.Index(
                condition=models.Q(("consumed_at__isnull", True)),
                fields=["job_id", "name", "id"],
                name="durable_jobs_event_unread",
            ),
        ),
        migrations.AddIndex(
            model_name="jobevent",
            index=models.Index(fields=["job_id", "id"], name="durable_jobs_event_job"),
        ),
    ]
