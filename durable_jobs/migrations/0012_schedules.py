"""Periodic jobs: the schedule table, and the partial index the leader reads its next tick by."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_jobs", "0011_paused_queues"),
    ]

    operations = [
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("kind", models.CharField(max_length=100)),
                ("expression", models.CharField(max_length=200)),
                ("zone", models.CharField(max_length=100)),
                ("input", models.JSONField(blank=True, null=True)),
                ("queue_name", models.CharField(blank=True, max_length=100, null=True)),
                ("priority", models.IntegerField(db_default=0)),
                ("catch_up", models.CharField(max_length=20)),
                ("next_tick_at", models.DateTimeField()),
                ("last_tick_at", models.DateTimeField(blank=True, null=True)),
                ("last_job_id", models.UUIDField(blank=True, null=True)),
                ("missed_ticks", models.BigIntegerField(db_default=0)),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                ("removed_at", models.DateTimeField(blank=True, null=True)),
                ("seen_at", models.DateTimeField()),
                ("created_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "db_table": "durable_jobs_schedule",
                "ordering": ["name"],
                "default_permissions": ("view",),
                "permissions": [
                    ("change_schedule_state", "Can pause, resume and run a schedule now")
                ],
                "base_manager_name": "objects",
                "indexes": [
                    models.Index(
                        models.F("next_tick_at"),
                        condition=models.Q(
                            ("paused_at__isnull", True), ("removed_at__isnull", True)
                        ),
                        name="durable_jobs_schedule_due",
                    )
                ],
            },
        ),
    ]
