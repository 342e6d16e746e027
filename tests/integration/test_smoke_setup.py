import pytest

from durable_jobs import db
from tests.factories import JobFactory, running


@pytest.mark.django_db
def test_factory_builds_rows_on_the_database_clock():
    job = running(lease_expires_at=-30)
    assert job.status == "running"
    assert job.lease_expires_at < db.database_now()
    assert JobFactory().status == "pending"
