# Wait conditions (issue 11): the hold capacity counter, the one-hold-per-target index,
# and partial indexes for held jobs and recently cleared wait keys.

import django.db.models.functions.comparison
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_jobs", "0002_leader_and_parked_mirror"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="wait_denials",
            field=models.IntegerField(db_default=0),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("next_run_at"),
                condition=models.Q(
                    ("held_since__isnull", False),
                    ("status", "pending"),
                    ("wait_satisfied_at__isnull", True),
                ),
                name="durable_jobs_held",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("tenant_id"),
                models.F("wait_key"),
                models.F("wait_satisfied_at"),
                condition=models.Q(
                    ("wait_key__isnull", False), ("wait_satisfied_at__isnull", False)
                ),
                name="durable_jobs_wait_cleared",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                models.F("tenant_id"),
                django.db.models.functions.comparison.Coalesce("organization_id", models.Value("")),
                models.F("wait_key"),
                condition=models.Q(
                    ("status__in", ("pending", "running")), ("wait_key__isnull", False)
                ),
                name="durable_jobs_wait_key_live",
            ),
        ),
    ]
