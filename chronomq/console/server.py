"""The console's HTTP server: routes, login, CSRF, limits, static files.

Served by the broker process on ``console.port`` (0: off), bound to ``server.host``, with
the standard library's threading HTTP server (one thread per connection; the console is
for a few operators, not for traffic).

* Pages (``GET /``, ``/schedule``, ``/topics``, ``/groups``, ``/messages``,
  ``/dead-letters``), their refreshable parts (``/part/...``) and their data as JSON
  (``/api/...``) need a session (``chronomq.console.session``): while the broker
  requires credentials, a login first (a user's token or ``server.auth_token``);
  otherwise a session is opened on the first visit.  The session's principal is
  resolved again at every request, and each page shows what it may see
  (``chronomq.console.views``); a page or action it may not is answered 403 naming
  user, action and resource, counted and audited with the API's refusals
  (``Guard.denied``; the peer is ``console:<address>``).
* Actions (``POST /messages/cancel``, ``/messages/reschedule``,
  ``/dead-letters/redrive``) need the session's CSRF token and ``console.actions =
  true``; otherwise 403 and nothing is done.  Their answer is the page with the broker's
  definite result (the outcome, or the refusal's status code and message).
* Limits: request bodies of at most 64 KiB, at most 50 form or query fields, static
  files from a fixed table (no path from the request ever reaches the file system), and
  every response carries a Content-Security-Policy that allows only the console's own
  scripts and styles, ``X-Frame-Options: DENY`` and ``nosniff``.
* Errors: a refusal is a 4xx page with its reason; an unexpected error is logged and
  answered 500 without a traceback.  The server never stops for a request.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from datetime import datetime
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from access.errors import AccessDenied
from access.model import Action
from access.principals import ANONYMOUS, Principal
from chronomq.api.errors import status_of
from chronomq.api.guard import Guard
from chronomq.console import pages
from chronomq.console.actions import ConsoleActions, Refused
from chronomq.console.session import COOKIE, Session, Sessions
from chronomq.console.views import ConsoleViews, name_prefix, page_number
from store.errors import ChronomqError, InvalidArgument

log = logging.getLogger(__name__)

MAX_BODY = 64 << 10
MAX_FIELDS = 50
_STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")
STATIC = {  # URL name -> (file under static/, content type)
    "console.js": ("console.js", "text/javascript; charset=utf-8"),
    "console.css": ("console.css", "text/css; charset=utf-8"),
    "uplot/uPlot.iife.min.js": ("uplot/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "uplot/uPlot.min.css": ("uplot/uPlot.min.css", "text/css; charset=utf-8"),
    "uplot/LICENSE": ("uplot/LICENSE", "text/plain; charset=utf-8"),
}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
_HTTP_OF = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "FAILED_PRECONDITION": 409,
            "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403, "RESOURCE_EXHAUSTED": 429,
            "UNAVAILABLE": 503}


class Console:
    """What the handler threads share: views, actions, sessions, the API's guard (its
    count and audit of refusals) and the settings."""

    def __init__(self, views: ConsoleViews, actions: ConsoleActions, sessions: Sessions,
                 guard: Guard, actions_on: bool, refresh_s: float = 5.0) -> None:
        self.views = views
        self.actions = actions
        self.sessions = sessions
        self.guard = guard
        self.actions_on = actions_on
        self.refresh_ms = round(refresh_s * 1000)
        self.static = {}
        for name, (path, ctype) in STATIC.items():
            with open(os.path.join(_STATIC_DIR, path), "rb") as f:
                self.static[name] = (f.read(), ctype)


class _Answer(Exception):
    """Stop handling and answer with this page (``status``, HTML)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


class Handler(BaseHTTPRequestHandler):
    console: Console  # set on the subclass made by ``start_console``
    server_version = "chronomq-console"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("console %s " + format, self.address_string(), *args)

    # ------------------------------------------------------------------ plumbing

    def _send(self, status: int, body: bytes, ctype: str,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _html(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
        self._send(status, text.encode(), "text/html; charset=utf-8", headers)

    def _json(self, data: Any) -> None:
        self._send(200, json.dumps(data).encode(), "application/json")

    def _redirect(self, to: str, headers: dict[str, str] | None = None) -> None:
        self._send(303, b"", "text/plain", {"Location": to, **(headers or {})})

    def _query(self) -> tuple[str, dict[str, str]]:
        parts = urlsplit(self.path)
        return parts.path, _fields(parts.query)

    def _form(self) -> dict[str, str]:
        raw_length = self.headers.get("Content-Length", "0")
        if not raw_length.isdigit() or int(raw_length) > MAX_BODY:
            self.close_connection = True
            raise _Answer(413, "request body too large (at most 64 KiB)")
        return _fields(self.rfile.read(int(raw_length)).decode("utf-8", "replace"))

    def _session(self) -> tuple[Session, Principal] | None:
        """The request's live session and who it is now; None: none (or it ended)."""
        try:
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            return None
        morsel = cookie.get(COOKIE)
        sessions = self.console.sessions
        session = sessions.get(morsel.value if morsel else None)
        who = sessions.principal(session) if session is not None else None
        return None if session is None or who is None else (session, who)

    @property
    def _peer(self) -> str:
        host, port = self.client_address[:2]
        return f"console:{host}:{port}"

    def _page(self, title: str, path: str, body: str, session: Session, who: Principal,
              status: int = 200, headers: dict[str, str] | None = None) -> None:
        viewer = pages.Viewer(who.name if self.console.sessions.needs_login else "",
                              who.unrestricted(Action.ADMIN))
        self._html(status, pages.layout(title, path, body, session.csrf,
                                        self.console.actions_on, self.console.refresh_ms,
                                        viewer), headers)

    # ------------------------------------------------------------------ entry points

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        self._handle(self._get)

    def do_POST(self) -> None:
        self._handle(self._post)

    def _handle(self, route: Callable[[], None]) -> None:
        try:
            route()
        except _Answer as a:
            self._html(a.status, f"<!doctype html><title>{a.status}</title><p>"
                                 f"{pages.e(a.body)}</p>")
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception:  # the console answers, and keeps serving, whatever happens
            log.exception("console: %s %s failed", self.command, self.path[:200])
            try:
                self._html(500, "<!doctype html><title>500</title><p>internal error (logged)"
                                "</p>")
            except OSError:
                self.close_connection = True

    def _get(self) -> None:
        path, q = self._query()
        if path.startswith("/static/"):
            found = self.console.static.get(path[len("/static/"):])
            if found is None:
                raise _Answer(404, "no such file")
            body, ctype = found
            self._send(200, body, ctype, {"Cache-Control": "max-age=3600"})
            return
        if path == "/login":
            self._html(200, pages.login_page())
            return
        current = self._session()
        headers: dict[str, str] = {}
        if current is None:
            session = self.console.sessions.open_anonymous()
            if session is None:  # credentials required
                if path.startswith(("/api/", "/part/")):
                    raise _Answer(401, "log in first")
                self._redirect("/login")
                return
            headers["Set-Cookie"] = self.console.sessions.cookie(session)
            current = session, ANONYMOUS
        self._view(path, q, *current, headers)

    def _view(self, path: str, q: dict[str, str], session: Session, who: Principal,
              headers: dict[str, str], result: dict[str, Any] | None = None,
              status: int = 200) -> None:
        kind, _, rest = path.lstrip("/").partition("/")
        page = (rest if kind in ("api", "part") else kind) or "overview"
        if page not in pages.TITLES:
            raise _Answer(404, "no such page")
        data: dict[str, Any] | None = None
        try:
            data = self._data(page, q, who)
        except ChronomqError as exc:
            if isinstance(exc, AccessDenied):
                self.console.guard.denied(exc, f"console.{page}", self._peer)
            code = status_of(exc).name
            status = _HTTP_OF.get(code, 400)
            if kind == "api":
                self._send(status, json.dumps({"error": code, "message": str(exc)}).encode(),
                           "application/json", headers)
                return
            result = {"ok": False, "text": f"{code}: {exc}"}
        if kind == "api":
            self._send(status, json.dumps(data).encode(), "application/json", headers)
            return
        title, part, body = pages.render(page, q, data, session.csrf, self.console.actions_on,
                                         result)
        if kind == "part":
            self._html(status, part, headers)
        else:
            self._page(title, "/" + page if page != "overview" else "/", body, session, who,
                       status, headers)

    def _data(self, page: str, q: dict[str, str], who: Principal) -> dict[str, Any] | None:
        v = self.console.views
        if page == "overview":
            return v.overview(who)
        if page == "schedule":
            return v.schedule(who)
        if page in ("recurring", "topics", "groups"):
            listed = {"recurring": v.recurring, "topics": v.topics, "groups": v.groups}[page]
            return listed(page_number(q.get("page", "")), name_prefix(q.get("q", "")), who)
        if page == "dead-letters":
            return v.dead_letters(q.get("group", ""), q.get("topic", ""),
                                  page_number(q.get("page", "")), who)
        if page == "messages":
            if q.get("id"):
                return v.message(q["id"], who)
            if q.get("key") or q.get("topic"):
                return v.by_key(q.get("topic", ""), q.get("key", ""), who)
            return None
        raise _Answer(404, "no such page")

    def _post(self) -> None:
        path, _ = self._query()
        form = self._form()
        sessions = self.console.sessions
        if path == "/login":
            s = sessions.login(form.get("token", ""))
            if s is None:
                self._html(403, pages.login_page("That is not the broker's token, nor a "
                                                 "user's."))
                return
            self._redirect("/", {"Set-Cookie": sessions.cookie(s)})
            return
        current = self._session()
        if current is None:
            raise _Answer(401, "log in first")
        session, who = current
        given = form.get("csrf") or self.headers.get("X-CSRF-Token") or ""
        if not sessions.csrf_ok(session, given):
            raise _Answer(403, "missing or wrong CSRF token: reload the page and try again")
        if path == "/logout":
            sessions.close(session.sid)
            self._redirect("/login" if sessions.needs_login else "/",
                           {"Set-Cookie": sessions.expired_cookie()})
            return
        if path not in ("/messages/cancel", "/messages/reschedule", "/messages/replace",
                        "/dead-letters/redrive"):
            raise _Answer(404, "no such action")
        if not self.console.actions_on:
            raise _Answer(403, "actions are off on this broker (console.actions = false)")
        self._act(path, form, session, who)

    def _act(self, path: str, form: dict[str, str], session: Session, who: Principal) -> None:
        acts, peer = self.console.actions, self._peer
        status = 200
        try:
            if path == "/dead-letters/redrive":
                q = {"group": form.get("group", ""), "topic": form.get("topic", "")}
                offsets = [_int(o, "offset") for o in form.get("offset", "").split(",") if o]
                result = pages.redrive_banner(acts.redrive(q["group"], q["topic"], offsets,
                                                           who, peer))
                self._view("/dead-letters", q, session, who, {}, result,
                           200 if result["ok"] else 409)
                return
            mid, topic = form.get("message_id", ""), form.get("topic", "")
            if path == "/messages/cancel":
                r = acts.cancel(mid, topic, who, peer)
                text = f"Cancel {mid}: {r['outcome']} ({_count(r['changed'])})"
            elif path == "/messages/replace":
                at, delay = _when(form.get("deliver_at", ""), form.get("delay_s", ""), True)
                done = acts.replace(mid, topic, form.get("body", ""), at, delay, who, peer)
                r = {"outcome": "REPLACED" if done["replaced"] else "STORED"}
                text = (f"Replace {mid}: replaced {_count(done['replaced'])}, due "
                        f"{pages.when(done['deliver_at_ms'])}")
            else:
                at, delay = _when(form.get("deliver_at", ""), form.get("delay_s", ""))
                r = acts.reschedule(mid, topic, at, delay, who, peer)
                text = (f"Reschedule {mid}: {r['outcome']} ({_count(r['changed'])}), due "
                        f"{pages.when(r['deliver_at_ms'])}")
            result = {"ok": r["outcome"] in ("CANCELLED", "RESCHEDULED", "REPLACED"),
                      "text": text}
        except Refused as exc:
            result, status = {"ok": False, "text": str(exc)}, _HTTP_OF.get(exc.code, 400)
        except ChronomqError as exc:
            code = status_of(exc).name
            result, status = {"ok": False, "text": f"{code}: {exc}"}, _HTTP_OF.get(code, 400)
        self._view("/messages", {"id": form.get("message_id", "")}, session, who, {}, result,
                   status)


def _count(changed: int) -> str:
    return f"{changed} message" + ("" if changed == 1 else "s")


def _fields(raw: str) -> dict[str, str]:
    """Query or form fields; a repeated field's values joined by commas."""
    try:
        parsed = parse_qs(raw, keep_blank_values=True, max_num_fields=MAX_FIELDS)
    except ValueError as exc:
        raise _Answer(400, "too many fields") from exc
    return {k: ",".join(v) for k, v in parsed.items()}


def _int(raw: str, what: str) -> int:
    raw = raw.strip()
    if not raw.lstrip("-").isdigit() or len(raw) > 19:
        raise InvalidArgument(f"{what} must be a whole number")
    return int(raw)


def _when(deliver_at: str, delay_s: str, optional: bool = False
          ) -> tuple[int | None, int | None]:
    """``(deliver_at_ms, delay_ms)`` from the reschedule or replace form: an ISO time or
    seconds (``optional``: neither, then ``(None, None)``)."""
    if deliver_at.strip():
        try:
            moment = datetime.fromisoformat(deliver_at.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise InvalidArgument("the time must look like 2026-12-24T18:00:00Z") from exc
        if moment.tzinfo is None:
            raise InvalidArgument("give the time zone of the time (Z for UTC)")
        return int(moment.timestamp() * 1000), None
    if delay_s.strip():
        try:
            seconds = float(delay_s)
        except ValueError as exc:
            raise InvalidArgument("the delay must be a number of seconds") from exc
        if not 0 <= seconds <= 10 * 366 * 86400:
            raise InvalidArgument("the delay must be between 0 and ten years")
        return None, int(seconds * 1000)
    if optional:
        return None, None
    raise InvalidArgument("give a delay in seconds or a time")


def start_console(host: str, port: int, console: Console) -> tuple[int, Callable[[], None]]:
    """Serve the console on ``host:port``; the bound port and a function that stops it."""
    handler = type("ConsoleHandler", (Handler,), {"console": console})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="console", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return int(server.server_address[1]), stop
