"""Live workers: each worker process registers itself, beats, and leaves (operators' view)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_jobs", "0008_attempt_history"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkerProcess",
            fields=[
                ("identity", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("host", models.CharField(max_length=200)),
                ("pid", models.IntegerField()),
                ("version", models.CharField(max_length=50)),
                ("queues", models.JSONField()),
                ("kinds", models.JSONField()),
                ("slots", models.IntegerField()),
                ("execution", models.CharField(max_length=20)),
                ("started_at", models.DateTimeField()),
                ("beat_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "worker",
                "db_table": "durable_jobs_worker",
                "ordering": ["host", "pid"],
                "default_permissions": ("view",),
                "base_manager_name": "objects",
            },
        ),
    ]
