"""Topics in a real browser (headless Chromium): the topic messages' lookup form and a
group page's reset and replay forms, submitted as an operator submits them."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from django_mysqlq.models import TopicDelivery, TopicGroup
from tests.test_admin_browser import browser, log_in  # noqa: F401 (the fixture)
from tests.test_topic_ops_admin import orders  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = "/admin/django_mysqlq/topicmessage/"


def submit(driver: Any, form: Any) -> None:
    """Submit ``form`` and wait for the next page: read before it, the list was the old
    page's (a stale element on a fast machine). A form asked about while the page goes
    away can also answer Chromium's "Node with given id does not belong to the document"
    (seen in CI): gone as well."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def gone(_: Any) -> bool:
        try:
            form.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            if "does not belong to the document" in str(exc):
                return True
            raise
        return False

    form.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(driver, 20).until(gone)


def listed_offsets(driver: Any) -> list[int]:
    from selenium.webdriver.common.by import By

    cells = driver.find_elements(By.CSS_SELECTOR, "#result_list td.field-offset")
    return [int(cell.text) for cell in cells]


def look_up(driver: Any, **fields: str) -> None:
    """Fill the lookup form's fields (the others stay blank, as a user leaves them)."""
    from selenium.webdriver.common.by import By

    form = driver.find_element(By.ID, "topic-lookup")
    for name in ("offset", "key", "published_at__gte", "published_at__lt"):
        box = form.find_element(By.NAME, name)
        box.clear()
        if fields.get(name):
            box.send_keys(fields[name])
    submit(driver, form)


def test_the_lookup_form_finds_by_offset_key_or_time(live_server, browser, orders):  # noqa: F811
    """The form sends its blank fields too: each lookup failed (``?e=1``)."""
    log_in(browser, live_server.url)
    browser.get(live_server.url + MESSAGES + "?topic=orders")
    assert listed_offsets(browser) == [6, 5, 4, 3, 2, 1]
    look_up(browser, offset="3")
    assert "e=1" not in browser.current_url and "offset=3" in browser.current_url
    assert listed_offsets(browser) == [3]
    look_up(browser, key="alice")
    assert listed_offsets(browser) == [4, 3, 2, 1]
    look_up(browser, published_at__gte="2000-01-01 00:00+00:00")
    assert listed_offsets(browser) == [1, 2, 3, 4, 5, 6]
    look_up(browser)
    assert listed_offsets(browser) == [6, 5, 4, 3, 2, 1]


def test_reset_and_replay_from_the_group_page(live_server, browser, orders):  # noqa: F811
    """The forms were nested in the page's change form: the browser dropped them and
    Reset posted the read-only change view (403)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    row = TopicGroup.objects.get(group_name="billing")
    log_in(browser, live_server.url)
    browser.get(live_server.url + reverse("admin:django_mysqlq_topicgroup_change",
                                          args=[row.pk]))
    reset = browser.find_element(By.ID, "reset-form")
    Select(reset.find_element(By.NAME, "to")).select_by_value("offset")
    reset.find_element(By.NAME, "value").send_keys("5")
    submit(browser, reset)
    said = browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert "position 6 -> 4" in said, said
    row.refresh_from_db()
    assert row.position == 4 and row.changed_by == "admin:operator"

    replay = browser.find_element(By.ID, "replay-form")
    replay.find_element(By.NAME, "first").send_keys("1")
    replay.find_element(By.NAME, "last").send_keys("2")
    submit(browser, replay)
    said = browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert "Replayed offsets 1..2 into group billing: 2 new deliveries." in said, said
    assert TopicDelivery.objects.filter(group_name="billing", offset=1).count() == 2
