from __future__ import annotations

import pytest

from durable_jobs.transports import publishing as transports
from tests.brokers.support import TRANSPORTS, broker_settings, delete_names, unique_prefix


@pytest.fixture(params=TRANSPORTS)
def brokered(request, settings, transactional_db):
    """The queue ``brokered`` on a real broker (each transport in turn), named for this test
    alone; deleted after."""
    transport = request.param
    prefix = unique_prefix()
    settings.DURABLE_JOBS = broker_settings(settings.DURABLE_JOBS, transport, prefix)
    yield transport
    transports.close_all()
    delete_names(transport, prefix)
