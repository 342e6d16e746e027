"""The attempt history of jobs started through Django's Tasks framework (durable_jobs.tasks)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_jobs", "0003_waits"),
    ]

    operations = [
        migrations.CreateModel(
            name="TaskAttempt",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job_id", models.UUIDField()),
                ("epoch", models.BigIntegerField()),
                ("worker_id", models.CharField(max_length=200)),
                ("started_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("exception_class_path", models.CharField(blank=True, max_length=300, null=True)),
                ("traceback", models.TextField(blank=True, null=True)),
            ],
            options={
                "db_table": "durable_jobs_task_attempt",
                "ordering": ["job_id", "epoch"],
                "default_permissions": (),
                "base_manager_name": "objects",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("job_id", "epoch"), name="durable_jobs_task_attempt_epoch"
                    )
                ],
            },
        ),
        # A database-level cascade: retention deletes job rows with one SQL statement, and
        # their attempts must go with them (Django's on_delete=CASCADE is emulated in Python).
        migrations.RunSQL(
            sql=(
                "ALTER TABLE durable_jobs_task_attempt ADD CONSTRAINT durable_jobs_task_attempt_job "
                "FOREIGN KEY (job_id) REFERENCES durable_jobs_job (id) ON DELETE CASCADE"
            ),
            reverse_sql="ALTER TABLE durable_jobs_task_attempt DROP CONSTRAINT durable_jobs_task_attempt_job",
        ),
    ]
