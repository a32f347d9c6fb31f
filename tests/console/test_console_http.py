"""The console over plain HTTP against a real broker: login, cookie, CSRF, read-only mode,
limits, and its figures against the gRPC API's answers."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from urllib.parse import quote, urlencode

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronomq.client import message
from tests.conftest import RunningServer
from tests.console.conftest import TOKEN, Browser, console_server


def test_pages_need_the_token_and_the_cookie_is_httponly_and_strict(
        browser: Browser) -> None:
    status, headers, _ = browser.get("/")
    assert status == 303 and headers["location"] == "/login"
    assert browser.get("/api/overview")[0] == 401
    assert browser.get("/part/topics")[0] == 401
    status, _, text = browser.post("/login", {"token": "wrong"})
    assert status == 403 and "not the broker" in text and browser.cookie == ""
    status, headers, _ = browser.post("/login", {"token": TOKEN})
    assert status == 303
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    status, headers, text = browser.get("/")
    assert status == 200 and "Overview" in text
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    # logging out ends the session: the old cookie no longer opens a page
    old = browser.cookie
    assert browser.post("/logout", {"csrf": browser.csrf})[0] == 303
    browser.cookie = old
    assert browser.get("/")[0] == 303


def test_an_action_needs_the_sessions_csrf_token(console: RunningServer,
                                                 browser: Browser) -> None:
    browser.login()
    with console.client(token=TOKEN) as c:
        c.create_topic("orders", 1)
        mid = c.send_one("orders", b"later", delay_ms=3_600_000)
    for form in ({"message_id": mid}, {"message_id": mid, "csrf": "x" * 43}):
        status, _, text = browser.post("/messages/cancel", form)
        assert status == 403 and "CSRF" in text
    assert console.server.broker.timer.pending_due(mid) is not None  # nothing was done
    status, _, text = browser.post("/messages/cancel", {"message_id": mid,
                                                        "csrf": browser.csrf})
    assert status == 200 and f"Cancel {mid}: CANCELLED" in text
    assert console.server.broker.timer.pending_due(mid) is None


def test_read_only_console_refuses_actions_and_shows_no_buttons(tmp_path: Path) -> None:
    server = console_server(tmp_path / "d", actions=False)
    try:
        b = Browser(server.server.console_port)
        b.login()
        with server.client(token=TOKEN) as c:
            c.create_topic("orders", 1)
            mid = c.send_one("orders", b"later", delay_ms=3_600_000)
        status, _, text = b.get(f"/messages?id={mid}")
        assert status == 200 and "pending, due" in text and 'id="cancel"' not in text
        status, _, text = b.post("/messages/cancel", {"message_id": mid, "csrf": b.csrf})
        assert status == 403 and "console.actions = false" in text
        assert server.server.broker.timer.pending_due(mid) is not None
    finally:
        server.stop()


def test_figures_match_the_api(console: RunningServer, browser: Browser) -> None:
    with console.client(token=TOKEN) as c:
        for n in range(3):
            c.create_topic(f"t{n}", 2)
        c.send([message("t0", b"now") for _ in range(5)] +
               [message("t1", b"later", delay_ms=120_000) for _ in range(4)])
        got = c.pop("t0", "g", max_messages=5)
        assert c.ack("g", [m.receipt_handle for m in got[:2]]) == ["", ""]
        stats = c.stats()
        topics = {t.name: t for t in c.list_topics()}
    assert console.server.broker.store.wait_visible(10)  # the timer has them (dispatched)
    browser.login()  # the first page computes the schedule: cached for 5 s
    overview = json.loads(browser.get("/api/overview")[2])
    assert overview["topics"] == len(topics) == 3
    assert overview["counters"]["sent"] == stats["rpc.sent"] == 9
    assert overview["counters"]["acked"] == stats["pop.acked"] == 2
    page = json.loads(browser.get("/api/topics")[2])
    assert [r["name"] for r in page["rows"]] == sorted(topics)
    assert {r["name"]: r["queues"] for r in page["rows"]} == {
        n: t.queue_count for n, t in topics.items()}
    groups = json.loads(browser.get("/api/groups")[2])
    (row,) = groups["rows"]
    assert (row["group"], row["topic"]) == ("g", "t0")
    for figure in ("lag", "in_flight", "backlog"):
        assert row[figure] == stats[f"group.g.t0.{figure}"]
    assert row["in_flight"] == 3
    schedule = json.loads(browser.get("/api/schedule")[2])
    assert schedule["total"] == 4 and sum(schedule["minutes"]) == 4


def test_hostile_requests_are_refused_without_touching_anything(
        console: RunningServer, browser: Browser, tmp_path: Path) -> None:
    browser.login()
    for path in ("/static/../../etc/passwd", "/static/%2e%2e/pop-secret", "/nope",
                 "/part/nope", "/api/../api/overview/x"):
        assert browser.get(path)[0] == 404, path
    for path in ("/topics?page=-1", "/topics?page=99999999999", "/groups?q=%00",
                 "/messages?id=%00%01", "/messages?topic=../x&key=k",
                 "/dead-letters?group=a%25b&topic=t", "/messages?topic=t&key=" + "k" * 2000):
        status, _, text = browser.get(path)
        assert 400 <= status < 500, (path, status)
        assert "Traceback" not in text
    status, _, _ = browser.request("POST", "/messages/cancel", body=b"x" * (65 << 10),
                                   headers={"Content-Length": str(65 << 10)})
    assert status == 413
    many = "&".join(f"f{n}=1" for n in range(200))
    assert browser.get("/topics?" + many)[0] == 400
    assert browser.get("/api/overview")[0] == 200  # still serving
    outside = {p.name for p in tmp_path.iterdir()}
    assert outside == {"data", "chronomq-tier"} or outside == {"data"}


PATHS = ["/", "/schedule", "/recurring", "/part/recurring", "/api/recurring",
         "/topics", "/groups", "/messages", "/dead-letters", "/part/topics",
         "/part/groups", "/part/dead-letters", "/part/overview", "/api/topics", "/api/groups",
         "/api/messages", "/api/dead-letters", "/api/schedule", "/messages/cancel",
         "/messages/reschedule", "/messages/replace", "/dead-letters/redrive", "/login",
         "/logout", "/static/"]
FIELDS = ["page", "q", "id", "topic", "key", "group", "message_id", "delay_s", "deliver_at",
          "offset", "csrf", "token", "body"]


@settings(max_examples=int(os.environ.get("CHRONOMQ_CONSOLE_FUZZ", "150")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "POST", "HEAD"]),
       path=st.one_of(st.sampled_from(PATHS), st.text(max_size=40).map(lambda t: "/" + t)),
       fields=st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=10)),
                              st.one_of(st.text(max_size=300), st.integers().map(str),
                                        st.sampled_from(["orders", "%DLQ%g%orders", "../..",
                                                         "0", "-1", "1e9"])),
                              max_size=6),
       with_csrf=st.booleans())
def test_hostile_requests_never_break_the_console(
        console: RunningServer, browser: Browser, tmp_path: Path, method: str, path: str,
        fields: dict[str, str], with_csrf: bool) -> None:
    """Oracle: never a 5xx, the console keeps serving, nothing appears outside the data
    dir, and a topic of another user is untouched (its message still pending)."""
    if not browser.cookie:
        browser.login()
        with console.client(token=TOKEN) as c:
            c.create_topic("orders", 1)
            browser.keep = c.send_one("orders", b"keep", delay_ms=3_600_000)  # type: ignore[attr-defined]
    form = dict(fields)
    if with_csrf and method == "POST":
        form["csrf"] = browser.csrf
    query = "?" + urlencode(form) if method != "POST" and form else ""
    status, _, text = browser.request(method, quote(path, safe="/?&=%") + query,
                                      form=form if method == "POST" else None)
    assert status < 500, (method, path, form, status)
    assert "Traceback" not in text
    if path == "/logout" and status == 303:
        browser.cookie = ""  # logged out: log in again next time
    assert browser.get("/api/overview")[0] in (200, 401)
    assert {p.name for p in tmp_path.iterdir()} <= {"data", "chronomq-tier"}
    keep = getattr(browser, "keep", None)
    if keep and not (path == "/messages/cancel" and with_csrf and form.get("message_id") == keep):
        assert console.server.broker.timer.pending_due(keep) is not None


def test_a_pending_message_is_found_by_its_key(console: RunningServer, browser: Browser) -> None:
    """The common case of a delayed-message service: an order's time-out, found by the
    order's key while it is still pending, then cancelled; a longer key that starts with
    the same bytes and another topic's message of that key stay out of the answer."""
    with console.client(token=TOKEN) as c:
        c.create_topic("orders", 2)
        c.create_topic("other", 1)
        timeout = c.send_one("orders", b"time out order 42", key="order-42",
                             delay_ms=1_800_000)
        out = c.send([message("orders", b"now", key="order-42"),  # delivered at once
                      message("orders", b"not this one", key="order-42\0x",
                              delay_ms=600_000),
                      message("other", b"nor this", key="order-42", delay_ms=600_000)])
        assert all(o.ok for o in out)
    assert console.server.broker.store.wait_visible(10)
    browser.login()
    found = json.loads(browser.get("/api/messages?topic=orders&key=order-42")[2])["messages"]
    assert sorted((m["body_preview"], m["pending_due_ms"] is not None) for m in found) == [
        ("now", False), ("time out order 42", True)]
    (pending,) = [m for m in found if m["pending_due_ms"] is not None]
    assert pending["message_id"] == timeout and pending["key"] == "order-42"
    assert pending["pending_due_ms"] == console.server.broker.timer.pending_due(timeout)
    page = browser.get("/messages?topic=orders&key=order-42")[2]
    assert 'id="cancel"' in page and "time out order 42" in page
    status, _, answer = browser.post("/messages/cancel", {"csrf": browser.csrf,
                                                           "message_id": timeout})
    assert f"Cancel {timeout}: CANCELLED" in answer
    assert status in (200, 303) and console.server.broker.timer.pending_due(timeout) is None
    found = json.loads(browser.get("/api/messages?topic=orders&key=order-42")[2])["messages"]
    assert [m["body_preview"] for m in found] == ["now"]  # cancelled: no longer listed


def test_a_pending_message_is_replaced_from_its_page(console: RunningServer,
                                                     browser: Browser) -> None:
    """Debounce from the console: the Replace form on a pending message's card sends it
    again with ``replace``: a new body and due time, the same id, key, tag and
    properties."""
    with console.client(token=TOKEN) as c:
        c.create_topic("orders", 1)
        (out,) = c.send([message("orders", b"remind at 9", key="user-7", tag="mail",
                                 properties={"lang": "de"}, delay_ms=3_600_000,
                                 message_id="reminder-7")])
        assert out.ok
    broker = console.server.broker
    assert broker.store.wait_visible(10)
    browser.login()
    page = browser.get("/messages?id=reminder-7")[2]
    assert 'id="replace"' in page
    before = broker.timer.pending_due("reminder-7")
    status, _, answer = browser.post("/messages/replace", {
        "csrf": browser.csrf, "message_id": "reminder-7", "topic": "orders",
        "body": "remind at 10", "delay_s": "7200"})
    assert status == 200 and "Replace reminder-7: replaced 1 message, due" in answer
    after = broker.timer.pending_due("reminder-7")
    assert before is not None and after is not None and after > before + 3_000_000
    listed = json.loads(browser.get("/api/messages?id=reminder-7")[2])
    assert len(listed["messages"]) == 1, listed
    (m,) = listed["messages"]
    assert (m["body_preview"], m["key"], m["tag"], m["properties"]) == (
        "remind at 10", "user-7", "mail", {"lang": "de"})
    # no due time given keeps the current one; a topic without it is refused, not changed
    status, _, answer = browser.post("/messages/replace", {
        "csrf": browser.csrf, "message_id": "reminder-7", "topic": "orders",
        "body": "remind at 11"})
    assert status == 200 and broker.timer.pending_due("reminder-7") == after
    status, _, answer = browser.post("/messages/replace", {
        "csrf": browser.csrf, "message_id": "reminder-7", "topic": "other", "body": "x"})
    assert status == 400 and "no message" in answer and "is pending in" in answer
    assert broker.timer.pending_due("reminder-7") == after


def test_the_recurring_page_lists_schedules_with_their_next_fires_and_recent_ticks(
        console: RunningServer, browser: Browser) -> None:
    with console.client(token=TOKEN) as c:
        c.create_topic("orders", 1)
        c.create_schedule("nightly-report", "orders", b"run", cron="0 2 * * *",
                          time_zone="Europe/Berlin")
        # (starting in an hour: no tick of its own between its creation and the pause,
        # which a 30 s boundary in between gave once)
        c.create_schedule("heartbeat", "orders", b"beat", every_s=30,
                          start_ms=int(time.time() * 1000) + 3_600_000)
        c.pause_schedule("heartbeat")
        by_hand = c.trigger_schedule("heartbeat")
        expected = c.next_fires("nightly-report", 3)
    browser.login()
    rows = json.loads(browser.get("/api/recurring")[2])["rows"]
    assert [(r["name"], r["paused"]) for r in rows] == [("heartbeat", True),
                                                        ("nightly-report", False)]
    assert rows[1]["next_fires"] == expected and rows[0]["next_fires"] == []
    assert rows[0]["recent"] == [[by_hand.tick_ms, by_hand.message_id]]
    assert rows[1]["recent"] == []
    assert f"heartbeat!{by_hand.tick_ms}" in browser.get("/recurring?q=heart")[2]
    page = browser.get("/recurring?q=nightly")[2]
    assert "nightly-report" in page and "heartbeat" not in page and "Europe/Berlin" in page
