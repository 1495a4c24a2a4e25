"""Topics in a real browser (headless Chromium): the topic messages' lookup form and a
group page's reset and replay forms, submitted as an operator submits them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_admin_browser import browser, log_in  # noqa: F401 (the fixture)
from tests.test_topic_ops_admin import orders  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = "/admin/django_mysqlq/topicmessage/"


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
    form.find_element(By.CSS_SELECTOR, "input[type=submit]").click()


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
