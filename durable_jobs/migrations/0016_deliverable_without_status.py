"""Rebuild the two deliverable indexes without the status in their predicates.

Every statement that ends a job clears ``next_run_at``, so ``lease_owner IS NULL AND
next_run_at IS NOT NULL`` already leaves finished rows out, and the claim now tests the
status in a form no index predicate follows from (``store._deliverable``). With the status
in these predicates the claim's own plain status test also proved
durable_jobs_live_kind's, and under a pinned horizon, with statistics that counted few
live rows, the planner searched for a queue's priority levels on that index, stepping
over every row version that was ever live (issue #27, the horizon benchmark).

The rebuild reads the table once per index and blocks job writes meanwhile: on a large
table, apply it at a quiet moment (docs/operations.rst, "Upgrading").
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_jobs", "0015_one_deliverable_index"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="job",
            name="durable_jobs_open_deliverable",
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="durable_jobs_flow_deliverable",
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("queue_name"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("next_run_at"),
                condition=models.Q(
                    ("flow_key__isnull", True),
                    ("lease_owner__isnull", True),
                    ("next_run_at__isnull", False),
                ),
                name="durable_jobs_open_deliverable",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("queue_name"),
                models.F("flow_key"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("next_run_at"),
                condition=models.Q(
                    ("flow_key__isnull", False),
                    ("lease_owner__isnull", True),
                    ("next_run_at__isnull", False),
                ),
                name="durable_jobs_flow_deliverable",
            ),
        ),
    ]
