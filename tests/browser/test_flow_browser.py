"""The admin explains a job held back by flow control, in a real browser (invariant 28),
and shows the key's occupancy on the flow keys page."""

from __future__ import annotations

import pytest

import durable_jobs as durable
from durable_jobs import store
from durable_jobs.limits import claims
from tests.browser.test_console_browser import (  # noqa: F401  (fixtures)
    blocking_orm_calls_between_browser_steps,
    browser,
    log_in,
    make_operator,
    page,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_job_page_says_which_job_holds_its_full_flow_key(page, live_server, kinds):  # noqa: F811
    kinds.add("browser.limited", flow=durable.FlowControl(key="kind", concurrency=1))
    holder = durable.start("browser.limited")
    store.dequeue(["default"], "w", 60_000, kinds=None, limit=5, flow=claims.claim_settings())
    blocked = durable.start("browser.limited")
    operator = make_operator("flow-watcher")
    from django.contrib.auth.models import Permission

    operator.user_permissions.add(Permission.objects.get(codename="view_flowkey"))
    log_in(page, live_server, "flow-watcher")

    page.goto(f"{live_server.url}/admin/durable_jobs/job/{blocked.id}/change/")
    why = page.locator("ul.dj-why").inner_text()
    assert "Flow key 'kind:browser.limited' is full: 1 of 1 permits held by" in why
    assert str(holder.id) in why

    page.goto(f"{live_server.url}/admin/durable_jobs/flowkey/")
    row = page.locator("#result_list tbody tr").first.inner_text()
    assert "kind:browser.limited" in row and "1 / 1" in row
