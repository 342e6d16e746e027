"""A transaction left open elsewhere pins the horizon: no job row version that dies after it
began can be vacuumed, and every claim steps over them (docs/performance.rst, "A pinned
horizon"). The operator's figures name it: ``durable_jobs stats``, its JSON and the scrape."""

from __future__ import annotations

import io
import json
import time

from django.contrib.auth.models import Permission, User
from django.core.management import call_command

from durable_jobs.console import stats
from tests.integration.support import connect_to_test_database


def test_the_oldest_open_transaction_is_named_by_stats_its_json_and_the_scrape(
    transactional_db, client, monkeypatch
):
    pin = connect_to_test_database(application_name="analyst-psql")
    try:
        pin.execute("SELECT txid_current()")  # an XID, as any write takes; then left idle
        time.sleep(1.2)

        found = stats.collect()["oldest_transaction"]
        monkeypatch.setattr(stats, "PINNED_AFTER_SECONDS", 1.0)
        text = io.StringIO()
        call_command("durable_jobs", "stats", "--all-tenants", stdout=text)
        as_json = io.StringIO()
        call_command("durable_jobs", "stats", "--all-tenants", "--json", stdout=as_json)
        user = User.objects.create_user("scraper", password="pw")
        user.user_permissions.add(Permission.objects.get(codename="view_job"))
        client.force_login(user)
        scraped = client.get("/metrics/durable-jobs").content.decode()
        pid = pin.info.backend_pid
    finally:
        pin.rollback()
        pin.close()

    assert found["pid"] == pid and found["application_name"] == "analyst-psql"
    assert found["state"] == "idle in transaction" and found["holds_xid"] is True
    assert 1.0 <= found["age_seconds"] < 60
    [line] = [line for line in text.getvalue().splitlines() if "oldest open transaction" in line]
    assert f"pid {pid}, analyst-psql, idle in transaction" in line
    assert "it pins the horizon" in line
    assert json.loads(as_json.getvalue())["oldest_transaction"]["pid"] == pid
    [gauge] = [
        line
        for line in scraped.splitlines()
        if line.startswith("durable_jobs_oldest_transaction_seconds ")
    ]
    assert float(gauge.split()[1]) >= 1.0

    after = stats.collect()["oldest_transaction"]
    assert after is None or after["pid"] != pid  # gone with its rollback


def test_a_short_transaction_is_named_without_the_warning():
    found = {"pid": 7, "application_name": "web", "state": "active", "age_seconds": 0.4}
    assert stats.describe_oldest_transaction(found) == (
        "oldest open transaction: 0.4s (pid 7, web, active)"
    )
    assert stats.describe_oldest_transaction(None) == "oldest open transaction: none"
    pinned = {**found, "age_seconds": stats.PINNED_AFTER_SECONDS + 1}
    assert "it pins the horizon" in stats.describe_oldest_transaction(pinned)
