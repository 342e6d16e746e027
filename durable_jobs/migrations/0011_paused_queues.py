"""Paused queues (invariant 27): the table the dequeue statement reads to skip a queue."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_jobs", "0010_unique_jobs"),
    ]

    operations = [
        migrations.CreateModel(
            name="PausedQueue",
            fields=[
                ("queue_name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("paused_at", models.DateTimeField()),
                ("paused_by", models.CharField(blank=True, max_length=200, null=True)),
                ("reason", models.CharField(blank=True, max_length=500, null=True)),
            ],
            options={
                "verbose_name": "paused queue",
                "db_table": "durable_jobs_paused_queue",
                "ordering": ["queue_name"],
                "permissions": [("pause_queue", "Can pause and resume a queue")],
                "default_permissions": ("view",),
                "base_manager_name": "objects",
            },
        ),
    ]
