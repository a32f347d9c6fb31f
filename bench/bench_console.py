"""The web console's page load times with many topics and groups, and its screenshots.

Starts ``chronomq serve`` (a real subprocess, API token set, console actions on),
creates ``--topics`` topics and ``--groups`` consumer groups (each pops and acks on one
topic), schedules ``--pending`` delayed messages spread over the next ``--days`` days
(with a hot minute and a hot hour), then measures:

* server time: each page, its refreshable part and its JSON fetched over HTTP with the
  session cookie (``--runs`` times, median and max; the schedule's cache is 5 s, so its
  first fetch scans and the rest are served from the cache: both are shown);
* browser time: each page loaded in Debian's chromium (Selenium), from navigation start
  to the load event and to the charts drawn (median of ``--browser-runs``).

``--screenshots DIR`` saves one PNG per page after ``--traffic-s`` seconds of sends and
consumption (the README's pictures)::

    .venv/bin/python bench/bench_console.py --topics 10000 --groups 1000 --pending 200000
    .venv/bin/python bench/bench_console.py --topics 40 --groups 6 --pending 20000 \\
        --screenshots bench/console --traffic-s 40
"""

from __future__ import annotations

import argparse
import http.client
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chronomq.client import ChronomqClient, message
from testkit.process import ServerProcess

TOKEN = "bench-token"
SHOWN: dict[str, str] = {}  # the pending message the Messages picture shows
PAGES = ["/", "/schedule", "/topics", "/topics?page=100", "/topics?q=topic-09",
         "/groups", "/groups?page=10", "/messages"]
PARTS = ["/part/overview", "/part/topics?page=100", "/part/groups?page=10",
         "/api/overview", "/api/topics?page=100", "/api/groups?page=10"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fetch(port: int, path: str, cookie: str = "", method: str = "GET",
          body: str = "") -> tuple[int, str, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Cookie": cookie} if cookie else {}
    if body:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    conn.request(method, path, body=body or None, headers=headers)
    r = conn.getresponse()
    r.read()
    took = (time.perf_counter() - started) * 1000
    set_cookie = r.getheader("Set-Cookie", "")
    conn.close()
    return r.status, set_cookie.split(";", 1)[0], took


def populate(c: ChronomqClient, topics: int, groups: int, pending: int, days: int) -> None:
    started = time.monotonic()
    for n in range(topics):
        c.create_topic(f"topic-{n:05d}", 2)
        if n and n % 2000 == 0:
            print(f"  {n:,} topics ({time.monotonic() - started:.0f} s)", flush=True)
    c.send([message("topic-00000", b"x") for _ in range(min(groups, 1000))])
    for g in range(groups):
        got = c.pop(f"topic-{g % topics:05d}", f"group-{g:04d}", max_messages=1)
        if got:
            c.ack(f"group-{g:04d}", [got[0].receipt_handle])
    print(f"  {topics:,} topics and {groups:,} groups in {time.monotonic() - started:.0f} s",
          flush=True)
    now = int(time.time() * 1000)
    horizon = days * 86_400_000
    batch = []
    for n in range(pending):
        if n % 10 == 0:  # a hot minute 20 minutes out
            due = now + 20 * 60_000 + n % 60_000
        elif n % 10 == 1:  # a hot hour tomorrow
            due = now + 30 * 3_600_000 + (n * 7919) % 3_600_000
        else:
            due = now + 120_000 + (n * 2_654_435_761) % horizon
        batch.append(message(f"topic-{n % topics:05d}", b"later", deliver_at_ms=due))
        if len(batch) == 1000:
            c.send(batch)
            batch = []
    if batch:
        c.send(batch)
    print(f"  {pending:,} delayed messages over {days} days", flush=True)
    # for the Messages and Dead letters pictures: a keyed reminder, two dead letters
    (reminder,) = c.send([message("topic-00001", b"call the customer back", key="reminder-1",
                                  delay_ms=2 * 3_600_000, properties={"order": "42"})])
    SHOWN["message_id"] = reminder.message_id
    c.send([message("topic-00000", f"order {n}: total does not add up".encode(),
                    key=f"order-{n}") for n in (17, 18)])
    got = c.pop("topic-00000", "group-0000", max_messages=32)
    c.dead_letter("group-0000", [m.receipt_handle for m in got if b"add up" in m.body],
                  reason="total does not add up")


def traffic(target: str, topics: int, seconds: float) -> None:
    """Sends (some due in seconds), pops and acks, so the rate and lateness charts move."""
    deadline = time.monotonic() + seconds
    with ChronomqClient(target, token=TOKEN) as c:
        n = 0
        while time.monotonic() < deadline:
            c.send([message(f"topic-{(n + i) % topics:05d}", b"now",
                            delay_ms=(i % 5) * 1000) for i in range(200)])
            for g in range(3):
                got = c.pop("topic-00000", f"group-{g:04d}", max_messages=32)
                if got:
                    c.ack(f"group-{g:04d}", [m.receipt_handle for m in got])
            n += 200
            time.sleep(0.05)


def server_times(port: int, cookie: str, runs: int) -> None:
    print("server time per request (ms): median / max of", runs)
    for path in PAGES + PARTS:
        times = []
        for _ in range(runs):
            status, _, took = fetch(port, path, cookie)
            assert status == 200, (path, status)
            times.append(took)
        print(f"  {path:32s} {statistics.median(times):8.1f} {max(times):8.1f}")
    time.sleep(5.1)  # past the schedule's cache
    _, _, cold = fetch(port, "/api/schedule", cookie)
    _, _, warm = fetch(port, "/api/schedule", cookie)
    print(f"  {'/api/schedule (scan, cached)':32s} {cold:8.1f} {warm:8.1f}")


def browser_times(port: int, runs: int, shots: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    base = f"http://127.0.0.1:{port}"
    try:
        d.get(base + "/login")
        d.find_element(By.ID, "token").send_keys(TOKEN)
        d.find_element(By.ID, "login").click()
        print(f"browser load (ms, median of {runs}): load event / charts drawn")
        for path in PAGES:
            loads, drawn = [], []
            for _ in range(runs):
                started = time.perf_counter()
                d.get(base + path)
                load = d.execute_script(
                    "const t = performance.getEntriesByType('navigation')[0];"
                    "return t.loadEventEnd - t.startTime;")
                charts = d.find_elements(By.CSS_SELECTOR, "[data-chart]")
                if charts:
                    WebDriverWait(d, 30, poll_frequency=0.01).until(lambda drv: all(
                        c.get_attribute("data-drawn") == "1"
                        for c in drv.find_elements(By.CSS_SELECTOR, "[data-chart]")))
                    drawn.append((time.perf_counter() - started) * 1000)
                loads.append(float(load))
            shown = f"{statistics.median(drawn):8.1f}" if drawn else "       -"
            print(f"  {path:32s} {statistics.median(loads):8.1f} {shown}")
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            for name, path in (("overview", "/"), ("schedule", "/schedule"),
                               ("topics", "/topics"), ("groups", "/groups"),
                               ("messages", "/messages?" + urlencode(
                                   {"id": SHOWN.get("message_id", "")})),
                               ("dead-letters", "/dead-letters?" + urlencode(
                                   {"group": "group-0000", "topic": "topic-00000"}))):
                d.get(base + path)
                time.sleep(1.0)
                d.save_screenshot(str(Path(shots) / f"console-{name}.png"))
            print(f"screenshots in {shots}")
    finally:
        d.quit()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topics", type=int, default=10_000)
    p.add_argument("--groups", type=int, default=1_000)
    p.add_argument("--pending", type=int, default=200_000)
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--browser-runs", type=int, default=5)
    p.add_argument("--traffic-s", type=float, default=0)
    p.add_argument("--screenshots", default="")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = ServerProcess(Path(tmp) / "data", f"server.auth_token={TOKEN}",
                               f"console.port={port}", "console.actions=true",
                               "tier.upload=true")
        try:
            with ChronomqClient(server.target, token=TOKEN) as c:
                populate(c, args.topics, args.groups, args.pending, args.days)
            if args.traffic_s:
                mover = threading.Thread(target=traffic, args=(
                    server.target, args.topics, args.traffic_s))
                mover.start()
                mover.join()
            status, cookie, _ = fetch(port, "/login", method="POST",
                                      body=urlencode({"token": TOKEN}))
            assert status == 303 and cookie, status
            server_times(port, cookie, args.runs)
            browser_times(port, args.browser_runs, args.screenshots)
        finally:
            server.terminate()


if __name__ == "__main__":
    main()
