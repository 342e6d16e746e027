"""Domain rows the demo and the tests write through fenced() slices."""

from django.db import models
from django.db.models import Func


class Report(models.Model):
    """A domain row whose status a mirror keeps in step with its job."""

    name = models.CharField(max_length=100)
    status = models.CharField(max_length=20, default="queued")
    rows_written = models.IntegerField(default=0)


class Effect(models.Model):
    """One domain effect per processed item. No unique constraint on purpose: a
    duplicated write shows up as two rows instead of being refused."""

    job_id = models.UUIDField(db_index=True)
    item = models.IntegerField()
    epoch = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    # The writing transaction, so the fault-injection checker can find the job-row
    # change the same transaction made and compare epochs.
    txid = models.BigIntegerField(
        db_default=Func(function="txid_current", output_field=models.BigIntegerField())
    )
