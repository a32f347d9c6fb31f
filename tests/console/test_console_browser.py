"""The console in a real browser: Debian's chromium driven by Selenium through Debian's
chromedriver (``scripts/test`` installs both with apt-get).  Logs in, checks each page's
figures against the API's answers, cancels and reschedules a message, redrives a dead
letter, and is refused without the token and with actions off; a user with its own token
sees only its topics.

Set ``CHRONOMQ_SCREENSHOTS=<dir>`` to save a screenshot of each page (the README's).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from chronomq.client import message
from tests.conftest import RunningServer
from tests.console.conftest import TOKEN, console_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
REQUIRED = os.environ.get("CHRONOMQ_REQUIRE_BROWSER") == "1"

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    if REQUIRED:
        raise RuntimeError("chromium and chromedriver are needed (apt-get install chromium "
                           "chromium-driver; scripts/test does it)")
    pytest.skip("no chromium/chromedriver here (scripts/test installs them)",
                allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def driver() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    d.set_page_load_timeout(30)
    yield d
    d.quit()


def shot(d: webdriver.Chrome, name: str) -> None:
    where = os.environ.get("CHRONOMQ_SCREENSHOTS")
    if where:
        os.makedirs(where, exist_ok=True)
        d.save_screenshot(os.path.join(where, f"console-{name}.png"))


WAIT_S = 30  # generous: CI runs the browser beside the whole suite on two cores
RETRIED = (StaleElementReferenceException, NoSuchElementException)


def wait(d: webdriver.Chrome) -> WebDriverWait[webdriver.Chrome]:
    """A wait that retries while a live part, swapped in every 5 s, replaces what it read."""
    return WebDriverWait(d, WAIT_S, ignored_exceptions=RETRIED)


def text(d: webdriver.Chrome, css: str) -> str:
    """The text of the element ``css`` matches, read again if a refresh replaced it."""
    return str(wait(d).until(lambda drv: drv.find_element(By.CSS_SELECTOR, css).text))


def shows(d: webdriver.Chrome, css: str, needle: str) -> str:
    """Wait until the element ``css`` matches shows ``needle`` (the answer to a click has
    replaced the page that was there: the previous answer may still be showing)."""
    def showing(drv: webdriver.Chrome) -> str | None:
        found = str(drv.find_element(By.CSS_SELECTOR, css).text)
        return found if needle in found else None
    try:
        return str(wait(d).until(showing))
    except TimeoutException:
        raise AssertionError(f"{css} never showed {needle!r}: {text(d, css)!r}") from None


def at(d: webdriver.Chrome, url: str) -> None:
    """Wait until the browser has navigated to ``url``."""
    try:
        wait(d).until(lambda drv: drv.current_url == url)
    except TimeoutException:
        raise AssertionError(f"at {d.current_url}, not {url}") from None


def drawn(d: webdriver.Chrome, chart: str) -> None:
    wait(d).until(lambda drv: drv.find_element(By.ID, chart).get_attribute("data-drawn") == "1")


def rows(d: webdriver.Chrome, css: str) -> list[list[str]]:
    """The cells' text of the table rows ``css`` matches, read in one script: a live part
    swapped in meanwhile cannot leave a stale element behind."""
    found = d.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map("
        "tr => Array.from(tr.cells).map(td => td.innerText.trim()))", css)
    return [list(map(str, r)) for r in found]


def click(d: webdriver.Chrome, css: str) -> None:
    """Click the element ``css`` matches, again if a refresh replaced it meanwhile."""
    def clicked(drv: webdriver.Chrome) -> bool:
        drv.find_element(By.CSS_SELECTOR, css).click()
        return True
    wait(d).until(clicked)


def type_in(d: webdriver.Chrome, css: str, keys: str) -> None:
    """Type into the field ``css`` matches; the focus keeps its part from being refreshed."""
    def typed(drv: webdriver.Chrome) -> bool:
        drv.find_element(By.CSS_SELECTOR, css).send_keys(keys)
        return True
    wait(d).until(typed)


def login(d: webdriver.Chrome, base: str, token: str) -> None:
    d.delete_all_cookies()
    d.get(base + "/")
    assert d.current_url == base + "/login"
    type_in(d, "#token", token)
    click(d, "#login")
    # the answer has arrived: the overview, or the form again with its error
    wait(d).until(lambda drv: drv.current_url != base + "/login"
                  or drv.find_elements(By.ID, "login-error"))


def test_an_operator_session(driver: webdriver.Chrome, tmp_path: Path) -> None:
    """With the live parts refreshed every 0.15 s, so that refreshes meet the clicks (under
    load, a box ticked while a refresh was out was swapped away before Redrive)."""
    server = console_server(tmp_path / "data", refresh_s=0.15)
    base = f"http://127.0.0.1:{server.server.console_port}"
    try:
        _operator_session(driver, server, base)
    finally:
        server.stop()


def _operator_session(d: webdriver.Chrome, server: RunningServer, base: str) -> None:
    with server.client(token=TOKEN) as c:
        c.create_topic("orders", 2)
        c.create_topic("reminders", 1)
        c.send([message("orders", f"order {n}".encode(), key=f"k{n}") for n in range(6)])
        later = c.send_one("reminders", b"call back", key="call", delay_ms=1_800_000)
        c.send([message("reminders", b"tomorrow", delay_ms=26 * 3_600_000)])
        got = c.pop("orders", "billing", max_messages=6, invisible_time_s=60)
        assert c.ack("billing", [m.receipt_handle for m in got[:3]]) == ["", "", ""]
        assert c.dead_letter("billing", [got[3].receipt_handle], reason="bad total") == [""]
        dead_id = got[3].message_id
        stats = c.stats()
        topics = sorted(t.name for t in c.list_topics())  # with the DLQ topic
    assert server.server.broker.store.wait_visible(10)  # the timer has them (dispatched)

    # refused without the token
    login(d, base, "not-the-token")
    shows(d, "#login-error", "not the broker")
    # logged in: the cookie cannot be read by scripts and is not sent cross-site
    login(d, base, TOKEN)
    assert shows(d, "h1", "Overview") == "Overview"
    (cookie,) = d.get_cookies()
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert text(d, "#fig-topics") == str(len(topics)) == "3"
    assert int(text(d, "#fig-sent").replace(",", "")) == stats["rpc.sent"] == 8
    assert int(text(d, "#fig-acked").replace(",", "")) == stats["pop.acked"]
    drawn(d, "chart-lateness")
    shot(d, "overview")

    d.get(base + "/schedule")
    assert text(d, "#sched-total") == "2"
    drawn(d, "chart-minutes")
    assert sum(int(r[1]) for r in rows(d, "#sched-days tbody tr")) == 2
    shot(d, "schedule")

    d.get(base + "/topics")
    table = rows(d, "#topics-table tbody tr")
    assert [r[0] for r in table] == topics
    assert table[topics.index("orders")][1] == "2"
    shot(d, "topics")

    d.get(base + "/groups")
    (cells,) = rows(d, "#groups-table tbody tr")
    assert cells[:2] == ["billing", "orders"]
    assert int(cells[2]) == stats["group.billing.orders.lag"]
    assert int(cells[4]) == stats["group.billing.orders.in_flight"] == 2
    assert cells[6] == "1"  # dead-lettered
    shot(d, "groups")

    # a pending message: look it up, reschedule it, then cancel it
    d.get(base + "/messages")
    type_in(d, "#q-id", later)
    click(d, "#lookup")
    shows(d, ".message .state", "pending, due")
    shot(d, "messages")
    type_in(d, "#delay-s", "7200")
    click(d, "#reschedule")
    shows(d, "#result", f"Reschedule {later}: RESCHEDULED")
    due = server.server.broker.timer.pending_due(later)
    assert due is not None and due > server.server.broker.clock.now_ms() + 7_000_000
    click(d, "#cancel")
    assert shows(d, "#result", f"Cancel {later}: CANCELLED") == \
        f"Cancel {later}: CANCELLED (1 message)"
    assert server.server.broker.timer.pending_due(later) is None
    d.get(base + f"/messages?id={later}")
    assert d.find_elements(By.ID, "cancel") == []  # no longer pending: nothing to cancel

    # the dead letter: browse the group's DLQ, send it back, and not twice
    d.get(base + "/groups")
    click(d, "#groups-table a")
    wait(d).until(lambda drv: drv.find_elements(By.CSS_SELECTOR, "#dlq-table tbody tr"))
    (row,) = rows(d, "#dlq-table tbody tr")
    assert dead_id in row and "bad total" in row
    shot(d, "dead-letters")
    click(d, "#dlq-table input[type=checkbox]")
    click(d, "#redrive")
    shows(d, "#result", "offset 0: sent")
    with server.client(token=TOKEN) as c:
        back = c.pop("orders", "billing", max_messages=8, invisible_time_s=60)
        redriven = [m for m in back if m.properties.get("chronomq.redriven_from") == dead_id]
        assert len(redriven) == 1 and redriven[0].body == got[3].body
    click(d, "#dlq-table input[type=checkbox]")
    click(d, "#redrive")
    shows(d, "#result", "offset 0: duplicate")

    # logged out: back to the login form
    click(d, "header form button")
    at(d, base + "/login")


def test_read_only_console_in_the_browser(driver: webdriver.Chrome, tmp_path: Path) -> None:
    server = console_server(tmp_path / "data", actions=False)
    base = f"http://127.0.0.1:{server.server.console_port}"
    try:
        with server.client(token=TOKEN) as c:
            c.create_topic("orders", 1)
            mid = c.send_one("orders", b"later", delay_ms=3_600_000)
        login(driver, base, TOKEN)
        assert "read-only" in text(driver, "header .mode")
        driver.get(base + f"/messages?id={mid}")
        shows(driver, ".message .state", "pending, due")
        assert driver.find_elements(By.ID, "cancel") == []
        assert driver.find_elements(By.ID, "reschedule") == []
    finally:
        server.stop()


def test_a_user_sees_its_own_topics_in_the_browser(driver: webdriver.Chrome,
                                                   tmp_path: Path) -> None:
    """A user with its own token: its name in the header, no Schedule, the overview's
    counts of what it may see, only its topics (a revoke shows at the next refresh), and
    the login form once it is removed."""
    server = console_server(tmp_path / "data", refresh_s=0.5)
    base = f"http://127.0.0.1:{server.server.console_port}"
    try:
        with server.client(token=TOKEN) as c:
            for topic in ("orders", "billing-eu", "secret"):
                c.create_topic(topic, 1)
            token = c.users.add("shop").token
            c.users.grant("shop", "send", "orders")
            c.users.grant("shop", "consume", "billing-*")
        login(driver, base, token)
        assert "shop" in text(driver, "header #who")
        assert driver.find_elements(By.CSS_SELECTOR, 'nav a[href="/schedule"]') == []
        shows(driver, "#scope", "need admin on *")
        assert text(driver, "#fig-topics") == "2"
        assert driver.find_elements(By.ID, "chart-rates") == []
        driver.get(base + "/topics")
        assert [r[0] for r in rows(driver, "#topics-table tbody tr")] == ["billing-eu", "orders"]
        with server.client(token=TOKEN) as c:
            c.users.revoke("shop", "consume", "billing-*")
        wait(driver).until(lambda drv: [r[0] for r in rows(drv, "#topics-table tbody tr")]
                           == ["orders"])
        with server.client(token=TOKEN) as c:
            c.users.remove("shop")
        driver.get(base + "/groups")
        at(driver, base + "/login")
    finally:
        server.stop()
