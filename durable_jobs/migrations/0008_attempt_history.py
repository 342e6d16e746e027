"""Attempt history: one row per slice that ended in a failure, a time limit, an
interruption or a lease loss (invariant 32), written by the store statement of that
transition."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_jobs", "0007_ops"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobAttempt",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job_id", models.UUIDField()),
                ("attempt", models.IntegerField()),
                ("epoch", models.BigIntegerField()),
                ("worker", models.CharField(blank=True, max_length=200, null=True)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("heartbeat_at", models.DateTimeField(blank=True, null=True)),
                ("ended_at", models.DateTimeField()),
                (
                    "outcome",
                    models.CharField(
                        choices=[
                            ("failed", "failed"),
                            ("time_limit", "time_limit"),
                            ("interrupted", "interrupted"),
                            ("lease_lost", "lease_lost"),
                        ],
                        max_length=16,
                    ),
                ),
                ("error_class", models.CharField(blank=True, max_length=16, null=True)),
                ("error_code", models.CharField(blank=True, max_length=100, null=True)),
                ("error_message", models.TextField(blank=True, null=True)),
                ("traceback", models.TextField(blank=True, null=True)),
            ],
            options={
                "db_table": "durable_jobs_attempt",
                "ordering": ["job_id", "-attempt"],
                "default_permissions": (),
                "base_manager_name": "objects",
                "indexes": [
                    models.Index(fields=["job_id", "attempt"], name="durable_jobs_attempt_job")
                ],
            },
        ),
        # A database-level cascade: retention deletes job rows with one SQL statement, and
        # their attempts must go with them (Django's on_delete=CASCADE is emulated in Python).
        migrations.RunSQL(
            sql=(
                "ALTER TABLE durable_jobs_attempt ADD CONSTRAINT durable_jobs_attempt_of_job "
                "FOREIGN KEY (job_id) REFERENCES durable_jobs_job (id) ON DELETE CASCADE"
            ),
            reverse_sql="ALTER TABLE durable_jobs_attempt DROP CONSTRAINT durable_jobs_attempt_of_job",
        ),
    ]
