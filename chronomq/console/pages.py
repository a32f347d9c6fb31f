"""The console's HTML: plain server-rendered pages, every value escaped.

A page is the shared layout (navigation, the CSRF token in a ``<meta>``) around its
body.  Parts that change (the tables, the figures) are rendered by ``*_part`` functions
and served alone at ``/part/<page>`` too: ``static/console.js`` fetches them every few
seconds and swaps them in, and draws the charts (uPlot) from ``/api/<page>`` JSON, so
pages update without a reload and no row is rendered twice in two languages.  No inline
script or style: the Content-Security-Policy allows only the console's own files.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

TITLES = {"overview": "Overview", "schedule": "Schedule", "recurring": "Recurring schedules",
          "topics": "Topics", "groups": "Groups", "messages": "Messages",
          "dead-letters": "Dead letters"}
NAV = (("/", "Overview"), ("/schedule", "Schedule"), ("/recurring", "Recurring"),
       ("/topics", "Topics"), ("/groups", "Groups"), ("/messages", "Messages"))


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who looks: the name shown in the header ("" on a broker that needs no login), and
    whether it sees the broker-wide pages (``admin`` on ``*``)."""

    name: str = ""
    broker_wide: bool = True


OPEN = Viewer()  # a broker that needs no login


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


def when(ms: int | None) -> str:
    if not ms or ms <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def layout(title: str, active: str, body: str, csrf: str, actions: bool,
           refresh_ms: int = 5000, viewer: Viewer = OPEN) -> str:
    nav = "".join(f'<a href="{href}"{" class=on" if href == active else ""}>{e(name)}</a>'
                  for href, name in NAV if viewer.broker_wide or href != "/schedule")
    mode = "actions on" if actions else "read-only"
    if viewer.name:
        mode = f'<span id="who">{e(viewer.name)}</span> · {mode}'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf-token" content="{e(csrf)}">
<title>{e(title)} · chronomq</title>
<link rel="stylesheet" href="/static/uplot/uPlot.min.css">
<link rel="stylesheet" href="/static/console.css">
<script src="/static/uplot/uPlot.iife.min.js" defer></script>
<script src="/static/console.js" defer></script>
</head><body data-refresh-ms="{int(refresh_ms)}">
<header><strong>chronomq</strong><nav>{nav}</nav><span class="mode">{mode}</span>
<form method="post" action="/logout"><input type="hidden" name="csrf" value="{e(csrf)}">
<button>Log out</button></form></header>
<main><h1>{e(title)}</h1>
{body}
</main></body></html>"""


def login_page(error: str = "") -> str:
    msg = f'<p class="error" id="login-error">{e(error)}</p>' if error else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Log in · chronomq</title>
<link rel="stylesheet" href="/static/console.css"></head><body>
<main class="login"><h1>chronomq console</h1>{msg}
<form method="post" action="/login">
<label>Token (a user's, from chronomq user add, or server.auth_token)
<input type="password" name="token" id="token" autocomplete="current-password" autofocus>
</label><button id="login">Log in</button></form></main></body></html>"""


def banner(result: dict[str, Any] | None) -> str:
    if not result:
        return ""
    cls = "ok" if result.get("ok") else "error"
    return f'<p class="result {cls}" id="result">{e(result["text"])}</p>'


def _table(head: list[str], rows: list[list[str]], table_id: str) -> str:
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table id="{table_id}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _pager(path: str, page: int, page_size: int, total: int, extra: dict[str, str]) -> str:
    last = max(0, (total - 1) // page_size)
    links = []
    if page > 0:
        links.append(f'<a href="{path}?{e(urlencode({**extra, "page": page - 1}))}" '
                     'rel="prev">&lsaquo; previous</a>')
    links.append(f"<span>page {page + 1} of {last + 1} ({total:,} in all)</span>")
    if page < last:
        links.append(f'<a href="{path}?{e(urlencode({**extra, "page": page + 1}))}" '
                     'rel="next">next &rsaquo;</a>')
    return '<p class="pager">' + " ".join(links) + "</p>"


def live(src: str, inner: str, element_id: str) -> str:
    """A part that ``console.js`` refreshes from ``src``."""
    return f'<div class="live" id="{element_id}" data-src="{e(src)}">{inner}</div>'


# ---------------------------------------------------------------------- overview

def _own_overview(d: dict[str, Any]) -> str:
    """A user without ``admin`` on ``*``: the counts of what it may see."""
    figures = [["topics you may use", f'<span id="fig-topics">{d["topics"]:,}</span>'],
               ["groups of topics you may consume",
                f'<span id="fig-groups">{d["groups"]:,}</span>']]
    return (_table(["figure", "value"], figures, "figures") +
            '<p id="scope">The broker-wide figures (rates, lateness, the timer, the tier, '
            "the disk, the schedule) need admin on *.</p>")


def overview_part(d: dict[str, Any]) -> str:
    if d.get("scope") == "user":
        return _own_overview(d)
    t, tier, disk, c = d["timer"], d["tier"], d["disk"], d["counters"]
    if tier["enabled"]:
        tier_rows = [["health", f'<span class="{e(tier["health"])}" id="tier-health">'
                      f'{e(tier["health"])}</span>'],
                     ["upload lag", f'<span id="tier-lag-bytes">{size(tier["upload_lag_bytes"])}'
                      f'</span> · {tier["upload_lag_s"]:.1f} s'],
                     ["uploaded", f'{tier["uploaded_records"]:,} records · '
                      f'{size(tier["uploaded_bytes"])}'],
                     ["failed uploads", f'{tier["failed_uploads"]:,} (in a row: '
                      f'{tier["consecutive_failures"]})'],
                     ["last upload", when(tier["last_upload_ms"])]]
    else:
        tier_rows = [["health", '<span id="tier-health">off (tier.upload = false)</span>']]
    figures = [
        ["topics", f'<span id="fig-topics">{d["topics"]:,}</span>'],
        ["groups", f'<span id="fig-groups">{d["groups"]:,}</span>'],
        ["messages sent", f'<span id="fig-sent">{int(c["sent"]):,}</span>'],
        ["delivered by the timer", f'<span id="fig-due">{t["delivered"]:,}</span>'],
        ["popped", f'<span id="fig-popped">{int(c["popped"]):,}</span>'],
        ["acked", f'<span id="fig-acked">{int(c["acked"]):,}</span>'],
        ["pending delayed messages",
         f'<span id="fig-pending">{t["pending"]:,}</span> (as of '
         f'{when(t["pending_as_of_ms"])[11:19]}; overdue {t["overdue"]:,})'],
        ["in the wheel (next minute)", f'{t["pending_wheel"]:,}'],
        ["TimerFlatFile buckets", f'{t["flat_buckets"]:,} ({t["flat_objects"]:,} objects)'],
    ]
    disk_rows = [["used", f'<span id="disk-used">{disk["used_ratio"] * 100:.1f} %</span> of '
                  f'{size(disk["total_bytes"])}'],
                 ["free", size(disk["free_bytes"])],
                 ["refusing sends", "yes" if disk["refusing_sends"] else "no"]]
    return (_table(["figure", "value"], figures, "figures") +
            "<h2>Tier</h2>" + _table(["", ""], tier_rows, "tier") +
            "<h2>Disk</h2>" + _table(["", ""], disk_rows, "disk"))


def overview_body(d: dict[str, Any]) -> str:
    if d.get("scope") == "user":
        return live("/part/overview", overview_part(d), "overview")
    return ('<div class="charts"><div class="chart" id="chart-rates" data-chart="rates">'
            '<h2>Messages per second</h2></div>'
            '<div class="chart" id="chart-lateness" data-chart="lateness">'
            '<h2>Lateness of timer deliveries</h2></div></div>' +
            live("/part/overview", overview_part(d), "overview"))


# ---------------------------------------------------------------------- schedule

def schedule_part(s: dict[str, Any]) -> str:
    partial = (f'<p class="error">The scan stopped at {s["scanned"]:,} entries: the counts '
               "cover only those.</p>") if s["partial"] else ""
    days = [[when(day)[:10], f"{n:,}"] for day, n in s["days"][:400]]
    return (f'{partial}<p>Pending: <strong id="sched-total">{s["total"]:,}</strong> · overdue '
            f'(due, not yet delivered): <span id="sched-overdue">{s["overdue"]:,}</span> · '
            f'as of {when(s["now_ms"])} (scan {s["took_ms"]:.1f} ms)</p>'
            "<h2>Per day</h2>" + _table(["day (UTC)", "due"], days, "sched-days"))


def schedule_body(s: dict[str, Any]) -> str:
    return ('<div class="charts">'
            '<div class="chart" id="chart-minutes" data-chart="minutes">'
            "<h2>Due per minute, next hour</h2></div>"
            '<div class="chart" id="chart-hours" data-chart="hours">'
            "<h2>Due per hour, next 3 days</h2></div>"
            '<div class="chart" id="chart-days" data-chart="days">'
            "<h2>Due per day</h2></div></div>" +
            live("/part/schedule", schedule_part(s), "schedule"))


# ---------------------------------------------------------------------- recurring

def recurring_part(d: dict[str, Any], prefix: str) -> str:
    rows = [[e(r["name"]), e(r["topic"]),
             e(r["cron"] or f'every {r["every_s"]:,} s') + f' <small>{e(r["time_zone"])}</small>',
             "paused" if r["paused"] else ("ended" if not r["next_fires"] else "active"),
             "<br>".join(when(ms) for ms in r["next_fires"]) or "-", f'{r["fired"]:,}',
             "<br>".join(f"{when(ms)} <small>{e(mid)}</small>" for ms, mid in r["recent"])
             or "-", e(r["misfire"]), e(r["last_error"]) or "-"] for r in d["rows"]]
    return (_table(["name", "topic", "when", "state", "next fires (UTC)", "sent",
                    "recent ticks (UTC)", "misfire", "last error"], rows,
                    "recurring-table") +
            _pager("/recurring", d["page"], d["page_size"], d["total"], {"q": prefix}))


# ---------------------------------------------------------------------- topics, groups

def _filter(path: str, prefix: str, label: str) -> str:
    return (f'<form method="get" action="{path}" class="filter"><input name="q" '
            f'value="{e(prefix)}" placeholder="{e(label)} starts with"><button>Filter'
            "</button></form>")


def topics_part(d: dict[str, Any], prefix: str) -> str:
    rows = [[e(r["name"]) + (f' <em>(mounted from {e(r["mounted_from"])})</em>'
                             if r["mounted_from"] else "")
             + (f' <em>(taken over from {e(r["taken_over_from"])})</em>'
                if r.get("taken_over_from") else ""),
             str(r["queues"]), f'{r["stored"]:,}', size(r["tier_bytes"]),
             f'{r["retention_ms"] / 3_600_000:g} h', f'{r["tier_retention_ms"] / 3_600_000:g} h']
            for r in d["rows"]]
    return (_table(["topic", "queues", "stored messages", "tier bytes", "retention",
                    "tier retention"], rows, "topics-table") +
            _pager("/topics", d["page"], d["page_size"], d["total"], {"q": prefix}))


def groups_part(d: dict[str, Any], prefix: str) -> str:
    rows = []
    for r in d["rows"]:
        dlq = urlencode({"group": r["group"], "topic": r["topic"]})
        rows.append([e(r["group"]), e(r["topic"]), f'{r["lag"]:,}', f'{r["backlog"]:,}',
                     f'{r["in_flight"]:,}', f'{r["redelivered"]:,}',
                     f'<a href="/dead-letters?{e(dlq)}">{r["dead_lettered"]:,}</a>',
                     f'{r["max_attempts"]} attempts, back-off '
                     f'{e(", ".join(f"{b / 1000:g}s" for b in r["backoff_ms"][:6]))}'
                     f'{" …" if len(r["backoff_ms"]) > 6 else ""}', _per_key(r)])
    return (_table(["group", "topic", "lag", "backlog", "in flight", "redelivered",
                    "dead-lettered", "retry policy", "per key"], rows, "groups-table") +
            _pager("/groups", d["page"], d["page_size"], d["total"], {"q": prefix}))


def _per_key(r: dict[str, Any]) -> str:
    """A group's per-key flow control: its limits and how many messages wait for them."""
    limits = ([f'{r["max_in_flight_per_key"]:,} in flight'] if r["max_in_flight_per_key"]
              else []) + ([f'{r["rate_per_key"]:g}/s'] if r["rate_per_key"] else [])
    if not limits:
        return "-"
    return ", ".join(limits) + f'; {r["held_by_key"]:,} held'


def list_body(path: str, part: str, prefix: str, page: int, label: str,
              element_id: str) -> str:
    src = f"/part{path}?" + urlencode({"q": prefix, "page": page})
    return _filter(path, prefix, label) + live(src, part, element_id)


# ---------------------------------------------------------------------- messages

def _hidden(csrf: str, **fields: str) -> str:
    return f'<input type="hidden" name="csrf" value="{e(csrf)}">' + "".join(
        f'<input type="hidden" name="{k}" value="{e(v)}">' for k, v in fields.items())


def message_card(m: dict[str, Any], csrf: str, actions: bool) -> str:
    props = "".join(f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>"
                    for k, v in m["properties"].items()) or "<tr><td>-</td><td></td></tr>"
    due = m.get("pending_due_ms")
    state = (f'<span class="pending">pending, due {when(due)}</span>' if due is not None
             else "not pending (delivered, or never delayed)")
    acts = ""
    if actions and due is not None and m.get("may_act", True):
        mid, topic = m["message_id"], m["topic"]
        acts = (f'<form method="post" action="/messages/cancel" class="act">'
                f'{_hidden(csrf, message_id=mid, topic=topic)}<button id="cancel">Cancel'
                '</button></form>'
                f'<form method="post" action="/messages/reschedule" class="act">'
                f'{_hidden(csrf, message_id=mid, topic=topic)}<input name="delay_s" '
                'id="delay-s" '
                'placeholder="delay, seconds from now" size="22"> or <input name="deliver_at" '
                'id="deliver-at" placeholder="YYYY-MM-DDTHH:MM:SSZ" size="22">'
                '<button id="reschedule">Reschedule</button></form>'
                f'<form method="post" action="/messages/replace" class="act">'
                f'{_hidden(csrf, message_id=mid, topic=topic)}<input name="body" '
                'id="replace-body" placeholder="new body (empty: keep)" size="30"> due '
                '<input name="delay_s" id="replace-delay-s" placeholder="seconds from now" '
                'size="14"> or <input name="deliver_at" id="replace-deliver-at" '
                'placeholder="YYYY-MM-DDTHH:MM:SSZ" size="22"> (neither: keep)'
                '<button id="replace">Replace</button></form>')
    return (f'<section class="message" data-id="{e(m["message_id"])}"><h2>{e(m["message_id"])}'
            f'</h2><p class="state">{state}</p>' + _table(["", ""], [
                ["topic", e(m["topic"])], ["queue / offset", f'{m["queue_id"]} / '
                                           f'{m["queue_offset"]}'],
                ["key", e(m["key"])], ["tag", e(m["tag"])],
                ["born", when(m["born_at_ms"])], ["stored", when(m["store_at_ms"])],
                ["due", f'<span class="due">{when(m["deliver_at_ms"])}</span>'],
                ["delivery attempt", str(m["delivery_attempt"])],
                ["body", f'{m["body_bytes"]:,} bytes' + (" (hex)" if m["body_binary"] else "")
                 + f'<pre>{e(m["body_preview"])}</pre>']], "message-table") +
            f"<h3>Properties</h3><table>{props}</table>{acts}</section>")


def messages_body(found: dict[str, Any] | None, q: dict[str, str], csrf: str,
                  actions: bool, result: dict[str, Any] | None) -> str:
    form = (f'<form method="get" action="/messages" class="filter"><input name="id" id="q-id" '
            f'value="{e(q.get("id", ""))}" placeholder="message id" size="36"> or '
            f'<input name="topic" id="q-topic" value="{e(q.get("topic", ""))}" '
            f'placeholder="topic"> <input name="key" id="q-key" value="{e(q.get("key", ""))}" '
            'placeholder="key"><button id="lookup">Look up</button></form>')
    out = banner(result) + form
    if found is not None:
        cards = [message_card(m, csrf, actions) for m in found["messages"]]
        out += "".join(cards) or '<p id="none">No message found.</p>'
    return out


def dead_letters_part(d: dict[str, Any], csrf: str, actions: bool) -> str:
    rows = []
    for r in d["rows"]:
        pick = (f'<input type="checkbox" name="offset" value="{r["queue_offset"]}">'
                if actions else "")
        rows.append([pick, str(r["queue_offset"]), e(r["message_id"]), e(r["key"]),
                     e(r["reason"]), e(r["attempts"]), when(r["store_at_ms"]),
                     when(r["redriven_at_ms"]) if r["redriven_at_ms"] else "-",
                     f'<pre>{e(r["body_preview"][:80])}</pre>'])
    table = _table(["", "offset", "id", "key", "reason", "attempts", "dead-lettered",
                    "redriven", "body"], rows, "dlq-table")
    pager = _pager("/dead-letters", d["page"], d["page_size"], d["total"],
                   {"group": d["group"], "topic": d["topic"]})
    if not actions or not rows:
        return table + pager
    return (f'<form method="post" action="/dead-letters/redrive">'
            f'{_hidden(csrf, group=d["group"], topic=d["topic"])}{table}'
            '<button id="redrive">Send the chosen back to their topic</button></form>' + pager)


def redrive_banner(results: dict[str, Any]) -> dict[str, Any]:
    parts = [f"offset {o}: {r['result']}" + (f" ({r.get('message_id') or r.get('message')})"
                                             if r.get("message_id") or r.get("message") else "")
             for o, r in results["results"].items()]
    ok = all(r["result"] in ("sent", "duplicate") for r in results["results"].values())
    return {"ok": ok, "text": "Redrive: " + "; ".join(parts)}


def render(page: str, q: dict[str, str], data: dict[str, Any] | None, csrf: str,
           actions: bool, result: dict[str, Any] | None) -> tuple[str, str, str]:
    """``(title, part, body)`` of ``page`` (a key of ``TITLES``) for ``data`` (None when
    the request was refused: ``result`` says why)."""
    title = TITLES[page]
    if page == "messages":
        body = messages_body(data, q, csrf, actions, result)
        return title, body, body
    if page == "dead-letters":
        title = f"Dead letters of group {q.get('group', '')} on {q.get('topic', '')}"
    if data is None:
        return title, banner(result), banner(result)
    prefix, number = q.get("q", ""), int(data.get("page", 0))
    if page == "overview":
        part = overview_part(data)
        return title, part, overview_body(data)
    if page == "schedule":
        part = schedule_part(data)
        return title, part, schedule_body(data)
    if page == "recurring":
        part = recurring_part(data, prefix)
        return title, part, list_body("/recurring", part, prefix, number, "schedule",
                                      "recurring-live")
    if page == "topics":
        part = topics_part(data, prefix)
        return title, part, list_body("/topics", part, prefix, number, "topic", "topics-live")
    if page == "groups":
        part = groups_part(data, prefix)
        return title, part, list_body("/groups", part, prefix, number, "group", "groups-live")
    part = dead_letters_part(data, csrf, actions)
    src = "/part/dead-letters?" + urlencode({"group": data["group"], "topic": data["topic"],
                                             "page": number})
    return title, part, banner(result) + live(src, part, "dlq-live")
