"""One real browser (headless Chromium) through the operator's 3 a.m. path:
dashboard → dead messages of a queue → requeue one → it is ready.

Saves screenshots of the dashboard and the stuck view under ``test-output/browser/``
(the ones in docs/img/ come from here). Needs Debian's ``chromium`` and ``chromium-driver``
(``.ci/setup`` installs them) and selenium (the ``test`` extra).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from django_mysqlq import broker
from django_mysqlq.models import Attempt, Message
from tests.conftest import OUTPUT, wait_for
from tests.operator_support import OPERATOR, RUNNER, claim_in_peer, claim_only, make_dead, user
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SHOTS = OUTPUT / "browser"


@pytest.fixture
def browser() -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver: run .ci/setup")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,760"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    try:
        yield driver
    finally:
        driver.quit()


def log_in(driver: Any, base: str) -> None:
    """Reuse a test-client session: the login form is Django's, not ours to test."""
    client = Client()
    client.force_login(user("operator", superuser=True))
    driver.get(base + "/admin/login/")
    driver.add_cookie({"name": settings.SESSION_COOKIE_NAME,
                       "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
                       "path": "/"})


def some_history() -> None:
    for label in ("a", "b", "c", "d"):
        handle = tasks.record.enqueue(label)
        message = claim_only(handle.id)
        broker.ack(message, RUNNER, broker.AttemptResult(started_at=broker.database_now()))
    broker.register_worker("web-1:4242:1a2b3c4d", "web-1", 4242, ["default", "other"], 4)


def test_dashboard_filter_dead_requeue_one_see_it_ready(live_server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    SHOTS.mkdir(parents=True, exist_ok=True)
    some_history()
    first = make_dead(label="payment-1")
    second = make_dead(label="payment-2")
    orphan = tasks.slow.enqueue("stuck", 30)
    claim_in_peer(orphan.id)
    wait_for(broker.stuck_messages, timeout=5, message="the peer to vanish")
    tasks.record.enqueue_many([["waiting-1"], ["waiting-2"]])
    tasks.on_other_queue.enqueue("other")
    broker.set_paused("other", True, OPERATOR)

    log_in(browser, live_server.url)
    browser.get(live_server.url + "/admin/")
    assert browser.find_element(By.ID, "index-dead").text == "Dead: 2"
    browser.find_element(By.ID, "index-dashboard").click()
    browser.find_element(By.ID, "toggle-nav-sidebar").click()  # room for the tables
    row = browser.find_element(By.ID, "queue-default")
    assert browser.find_element(By.ID, "stuck-count").text == "1"
    browser.save_screenshot(str(SHOTS / "dashboard.png"))

    row.find_element(By.CSS_SELECTOR, "a.dead-link").click()
    listed = {int(box.get_attribute("value"))
              for box in browser.find_elements(By.NAME, "_selected_action")}
    assert listed == {first, second}

    browser.find_element(By.CSS_SELECTOR, f"input[name=_selected_action][value='{first}']") \
        .click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("requeue")
    browser.find_element(By.NAME, "index").click()
    assert "Requeued 1 message(s)" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    remaining = {int(box.get_attribute("value"))
                 for box in browser.find_elements(By.NAME, "_selected_action")}
    assert remaining == {second}

    browser.find_element(By.LINK_TEXT, "Ready").click()
    ready_row = browser.find_element(By.CSS_SELECTOR,
                                     f"input[name=_selected_action][value='{first}']")
    assert "ready" in ready_row.find_element(By.XPATH, "./ancestor::tr").text
    assert Message.objects.get(pk=first).status == "ready"
    assert Attempt.objects.get(message_id=first, outcome="requeued").actor == "admin:operator"

    ready_row.find_element(By.XPATH, "./ancestor::tr//th/a").click()  # the message's page
    trace = browser.find_element(By.ID, "trace").text
    assert "failed" in trace and "requeued" in trace and "admin:operator" in trace
    browser.save_screenshot(str(SHOTS / "message.png"))

    browser.get(live_server.url + "/admin/django_mysqlq/stuckmessage/")
    assert "owner connection" in browser.find_element(By.ID, "result_list").text
    browser.save_screenshot(str(SHOTS / "stuck.png"))
    assert (SHOTS / "dashboard.png").stat().st_size > 10_000


def test_a_worker_s_troubles_show_on_the_dashboard_and_lead_to_its_page(live_server,
                                                                        browser):
    """What keeps failing in a live worker is in red above the dashboard's table, and its
    link opens the worker's page with every line."""
    from selenium.webdriver.common.by import By

    broker.register_worker("web-2:77:feedbeef", "web-2", 77, ["default"], 4)
    lines = ["upkeep step 'gate repair' failing since 2026-11-26 21:04:13 UTC: (1264, "
             "\"Out of range value for column 'x' at row 1\")",
             "the broadcast read of topic 'config' failing since 2026-11-26 21:05:00 UTC: "
             "(1205, 'Lock wait timeout exceeded')"]
    broker.heartbeat_worker("web-2:77:feedbeef", 3, 0, False, "\n".join(lines))
    log_in(browser, live_server.url)
    browser.get(live_server.url + "/admin/django_mysqlq/queuestate/")
    block = browser.find_element(By.ID, "worker-troubles")
    assert block.is_displayed()
    assert "errornote" in block.get_attribute("class")
    shown = block.text
    assert "Worker web-2:77:feedbeef:" in shown
    assert all(line in shown for line in lines), shown
    block.find_element(By.LINK_TEXT, "web-2:77:feedbeef").click()
    page = browser.find_element(By.ID, "content").text
    assert "Out of range value for column 'x'" in page and "topic 'config'" in page
    browser.get(live_server.url + "/admin/django_mysqlq/worker/")
    assert ("upkeep step 'gate repair' failing since 2026-11-26 21:04:13 UTC" in
            browser.find_element(By.ID, "result_list").text)
    broker.heartbeat_worker("web-2:77:feedbeef", 3, 0, False, "")  # it works again
    browser.get(live_server.url + "/admin/django_mysqlq/queuestate/")
    assert not browser.find_elements(By.ID, "worker-troubles")
