"""Drop durable_jobs_deliverable: durable_jobs_open_deliverable (rows without a flow key)
and durable_jobs_flow_deliverable (rows with one) hold each deliverable row once between
them, and every claim reads one of those two. The old index held every row a second time,
an index insert on every start and an entry for every transition to vacuum, and only the
statistics read it (they now read the two partial ones)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("durable_jobs", "0014_flow_control"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="job", name="durable_jobs_deliverable"),
    ]
