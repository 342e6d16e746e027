"""The operator console in a real browser: Playwright driving Debian's Chromium, headless.

Against pytest-django's ``live_server`` (a real HTTP server on a thread, so the database
access is transactional). Slices run on a thread of the test through the same executor a
worker uses, so progress and cancellation arrive the way they do in production: through
the job row, seen by the page's live refresh without a reload.

``DURABLE_JOBS_SCREENSHOTS=docs/_static`` also saves the README's screenshots.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connections

import durable_jobs as durable
from durable_jobs import testing
from tests.factories import JobFactory, reload, running

pytestmark = pytest.mark.django_db(transaction=True)

CHROMIUM = os.environ.get("DURABLE_JOBS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHANGELIST = "/admin/durable_jobs/job/"


@pytest.fixture(scope="module")
def blocking_orm_calls_between_browser_steps():
    """Playwright's sync API keeps an event loop on this thread while the module's browser
    lives; the ORM calls made meanwhile (the tests' own, the database fixtures' set-up and
    flush) are ordinary blocking calls, which Django would otherwise refuse. This module
    only: the setting is put back when its browser closes."""
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if before is None:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture(scope="module")
def browser(blocking_orm_calls_between_browser_steps):
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail(
            f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium)"
        )
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(15_000)
    yield context.new_page()
    context.close()


def make_operator(name: str, *perms: str) -> User:
    user = User.objects.create_user(name, password="pw-" + name, is_staff=True)
    for codename in ("view_job", *perms):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def log_in(page, live_server, name: str) -> None:
    page.goto(f"{live_server.url}/admin/login/?next={CHANGELIST}")
    page.fill("#id_username", name)
    page.fill("#id_password", "pw-" + name)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{CHANGELIST}")


def id_link(job) -> str:
    """The change list's link to ``job``: its short id, the full one as the title."""
    return f"a.dj-id[title='{job.id}']"


def run_slices_in_background() -> threading.Thread:
    """Run due slices on another thread (its own connection), as a worker slot would."""

    def work():
        try:
            testing.run_jobs(queues=["default"])
        finally:
            connections.close_all()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def screenshot(page, name: str) -> None:
    folder = os.environ.get("DURABLE_JOBS_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / name), full_page=False)


def test_log_in_filter_open_a_job_and_watch_its_progress_move(page, live_server):
    make_operator("watcher")
    for n in range(3):
        JobFactory(
            kind="demo.flaky",
            status="completed",
            finished_at=-n,
            pending_since=None,
            next_run_at=None,
            total_count=10,
            processed_count=10,
        )
    JobFactory(
        kind="demo.always_fails",
        status="failed",
        parked_at=-30,
        finished_at=-30,
        error_code="poison",
        pending_since=None,
        next_run_at=None,
    )
    held = JobFactory(
        kind="demo.noop",
        held_since=-600,
        wait_for=[{"profile": "inventory-ready"}],
        wait_label="inventory-ready",
        next_run_at=240,
        subject_type="demo.report",
        subject_id="42",
        tenant_id="acme",
        organization_id="eu",
    )
    JobFactory(kind="demo.sleep", cancel_requested_at=-2, next_run_at=-1, cancelled_by="admin:ops")
    job = durable.start(
        "demo.import",
        input={"rows": 8, "batch": 1, "delay": 0.6},
        subject=("demo.report", "7"),
        idempotency_key="import-7",
    )
    log_in(page, live_server, "watcher")
    worker = run_slices_in_background()

    page.click("#changelist-filter a[href*='status=running']")
    page.wait_for_url("**status=running**")
    page.wait_for_selector(id_link(job))
    assert page.locator("#result_list tbody tr").count() == 1, (
        "the filter shows only the running job"
    )
    screenshot_changelist = page.url
    page.click(id_link(job))
    page.wait_for_url(re.compile(f"{job.id}/change/"))
    count = page.locator(f"[data-dj-count='{job.id}']")
    first = count.inner_text()
    # No reload: the page's script polls the live view and rewrites the count and the bar.
    page.wait_for_function(
        "([sel, before]) => { const el = document.querySelector(sel);"
        " return el && el.textContent !== before; }",
        arg=[f"[data-dj-count='{job.id}']", first],
    )
    assert count.inner_text() != first
    assert page.locator(f"progress[data-dj-progress='{job.id}']").get_attribute("value") is not None
    worker.join(timeout=30)
    assert reload(job).status == "completed"
    if os.environ.get("DURABLE_JOBS_SCREENSHOTS"):
        page.set_viewport_size({"width": 1800, "height": 1000})
        page.goto(screenshot_changelist.replace("status=running", ""))
        page.click("#toggle-nav-sidebar")
        page.evaluate("window.scrollTo(0, 0)")
        screenshot(page, "console-changelist.png")
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.goto(f"{live_server.url}{CHANGELIST}{held.id}/change/")
        screenshot(page, "console-detail.png")


def test_cancel_a_running_job_and_see_it_end_cancelled(page, live_server):
    make_operator("canceller", "cancel_job")
    job = durable.start("demo.import", input={"rows": 400, "batch": 1, "delay": 0.1})
    worker = run_slices_in_background()
    log_in(page, live_server, "canceller")
    page.goto(f"{live_server.url}{CHANGELIST}?status=running")
    page.wait_for_selector(id_link(job))
    page.check(f"input[name=_selected_action][value='{job.id}']")
    page.select_option("select[name=action]", "cancel_jobs")
    page.click("button[name=index]")
    page.wait_for_selector("text=Request cancellation: 1 job")
    page.click("input[type=submit][value^='Yes']")
    page.wait_for_selector("text=Cancellation requested for 1 job(s).")
    # The badge turns "cancelled" by itself once the slice sees the request at its next write.
    page.goto(f"{live_server.url}{CHANGELIST}?kind=demo.import")
    page.wait_for_selector(f"[data-dj-status='{job.id}']:has-text('cancelled')", timeout=30_000)
    worker.join(timeout=30)
    assert reload(job).status == "cancelled"
    assert reload(job).processed_count < 400


def test_redrive_a_parked_job(page, live_server):
    make_operator("rescuer", "redrive_job")
    parked = JobFactory(
        kind="demo.flaky",
        status="failed",
        parked_at=-60,
        finished_at=-60,
        error_code="poison",
        error_class="transient",
        pending_since=None,
        next_run_at=None,
    )
    log_in(page, live_server, "rescuer")
    page.goto(f"{live_server.url}{CHANGELIST}?parked=yes")
    page.check(f"input[name=_selected_action][value='{parked.id}']")
    page.select_option("select[name=action]", "redrive_jobs")
    page.click("button[name=index]")
    page.wait_for_selector("text=Re-drive failed jobs: 1 job")
    page.click("input[type=submit][value^='Yes']")
    page.wait_for_selector("text=Re-drove 1 job(s).")
    assert reload(parked).status == "pending" and reload(parked).redrives == 1


def test_without_the_redrive_permission_the_action_is_neither_shown_nor_accepted(page, live_server):
    make_operator("viewer", "cancel_job")
    parked = JobFactory(
        kind="demo.flaky",
        status="failed",
        parked_at=-60,
        finished_at=-60,
        error_code="poison",
        pending_since=None,
        next_run_at=None,
    )
    log_in(page, live_server, "viewer")
    page.goto(f"{live_server.url}{CHANGELIST}?parked=yes")
    options = page.locator("select[name=action] option").evaluate_all(
        "els => els.map(e => e.value)"
    )
    assert "cancel_jobs" in options
    assert "redrive_jobs" not in options and "force_redrive_jobs" not in options
    # Posting it anyway, with a valid session and CSRF token, changes nothing.
    token = page.locator("input[name=csrfmiddlewaretoken]").first.get_attribute("value")
    response = page.request.post(
        f"{live_server.url}{CHANGELIST}?parked=yes",
        form={
            "csrfmiddlewaretoken": token,
            "action": "redrive_jobs",
            "index": "0",
            "confirm": "yes",
            "_selected_action": str(parked.id),
        },
        headers={"Referer": f"{live_server.url}{CHANGELIST}"},
    )
    assert response.status in (200, 302)
    assert reload(parked).status == "failed" and reload(parked).redrives == 0


def test_at_1366_px_the_change_list_fits_and_ids_are_short_with_a_copy(browser, live_server):
    make_operator("laptop")
    long_kind = "reports.quarterly_reconciliation_rebuild"
    for n in range(4):
        JobFactory(
            kind=long_kind,
            status="failed",
            parked_at=-30,
            finished_at=-30,
            error_code="mirror_failed",
            pending_since=None,
            next_run_at=None,
            subject_type="billing.customer_invoice",
            subject_id=f"inv-2024-{n:06d}-eu-west",
            tenant_id="acme-industries-international",
            organization_id="europe-west-finance-department",
            total_count=1_000_000,
            processed_count=123_456,
        )
    JobFactory(
        kind="demo.noop",
        held_since=-600,
        wait_for=[{"profile": "inventory-ready"}],
        wait_label="inventory-ready",
        next_run_at=240,
    )
    running(lease_expires_at=-60, heartbeat_at=-90, consecutive_failures=3, redrives=12)
    newest = running(lease_owner=None, next_run_at=30, consecutive_failures=1)
    context = browser.new_context(viewport={"width": 1366, "height": 768})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        log_in(page, live_server, "laptop")
        fit = page.evaluate(
            """() => {
              const table = document.querySelector('#result_list');
              const box = table.parentElement;
              const clipped = [...table.querySelectorAll('th, td')]
                .filter(cell => cell.scrollWidth > cell.clientWidth + 1)
                .map(cell => cell.className + ': ' + cell.textContent.trim());
              return {table: table.scrollWidth, box: box.clientWidth, clipped,
                      page: document.documentElement.scrollWidth, viewport: window.innerWidth};
            }"""
        )
        assert fit["table"] <= fit["box"], f"the table scrolls sideways: {fit}"
        assert fit["clipped"] == [], f"cut off: {fit['clipped']}"
        assert fit["page"] <= fit["viewport"], f"the page scrolls sideways: {fit}"
        screenshot(page, "console-changelist-1366.png")

        link = page.locator(id_link(newest))
        assert link.inner_text() == str(newest.id)[:8]
        page.click(f"button[data-dj-copy='{newest.id}']")
        page.wait_for_selector(f"button[data-dj-copy='{newest.id}'].dj-copied")
        assert page.evaluate("() => navigator.clipboard.readText()") == str(newest.id)
        assert page.locator(f"[data-dj-status='{newest.id}']").inner_text() == "waiting"
    finally:
        context.close()


def test_cancel_from_the_job_page_after_the_confirmation(page, live_server):
    make_operator("pager", "cancel_job")
    job = JobFactory(kind="demo.noop", next_run_at=3600)
    log_in(page, live_server, "pager")
    page.goto(f"{live_server.url}{CHANGELIST}{job.id}/change/")
    page.click("button[name=dj_job_action][value=cancel_jobs]")
    page.wait_for_selector("text=Request cancellation: 1 job")
    assert reload(job).cancel_requested_at is None, "nothing happens before the confirmation"
    page.click("input[type=submit][value^='Yes']")
    page.wait_for_url(re.compile(f"{job.id}/change/"))
    page.wait_for_selector("text=Cancellation requested for 1 job(s).")
    assert reload(job).cancel_requested_at is not None
    assert page.locator("button[name=dj_job_action]").count() == 0, "requested: no button"
