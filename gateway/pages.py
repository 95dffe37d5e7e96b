"""The HTML pages: a run's own page (``GET /runs/{run_id}``, never public) and the leaderboard grouped by benchmark.

Pages are plain HTML and CSS with their plots inline (``gateway.plots``: SVG drawn on the server): they need no
script, load nothing from elsewhere (their Content-Security-Policy allows nothing but the page and its own styles),
and fit a 390 px wide screen (plots scale to the width, tables scroll inside their box).

**Who may read a run's page.** The run's own key or the admin key, sent in one of two ways:

- ``Authorization: Bearer <key>``, as on the API (scripts, ``curl``);
- from a browser, which cannot put a header on a link: the page's sign-in form posts the key once
  (``POST /runs/login``, form body, never the URL) and gets a cookie ``crucible_key`` that is *not* the key but a
  token (:func:`session_token`): who it names (``admin`` or the run's id), when it expires (:data:`SESSION_TTL_S`
  after sign-in) and an HMAC-SHA256 of both under a secret derived from the admin key, bound to the run's key hash.
  The cookie is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's link or form sends it),
  ``Path=/runs`` (no API call carries it) and ``Secure`` over HTTPS. Revoking the run's key (or changing the admin
  key) voids its tokens at once; a token is checked on every page load.

A missing, wrong, revoked or expired credential answers 401: the sign-in form (HTML) to a browser, problem+json to
anyone else. Another run's key answers 404 (``run … not found``), as the API answers a run asking for another run's
objects, so a key tells nothing of which runs exist. A run key's page loads count against that key's rate limits;
they are not agent calls, so the episode log does not record them (a refused one goes to the audit log, as every 401).

**The leaderboard page** shows what ``GET /v1/leaderboard`` answers and nothing else (no test item, no per-item
result): a table per benchmark, ranked within it (never across benchmarks), and its final scores against spend.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool

from gateway import leaderboard, plots, reports, repository
from gateway.schemas import LeaderboardRow, RunReport
from gateway.service import Caller, Gateway, authenticate, bearer_key, run_caller
from services.common.errors import Forbidden, NotFound, Unauthorized

COOKIE = "crucible_key"
COOKIE_PATH = "/runs"
SESSION_TTL_S = 3600  # a browser's sign-in lasts an hour
ADMIN = "admin"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "Referrer-Policy": "same-origin",  # not no-referrer: with it a browser posts the sign-in form with `Origin: null`
    "X-Content-Type-Options": "nosniff",
}
PRIVATE_HEADERS = {**SECURITY_HEADERS, "Cache-Control": "no-store", "Vary": "Authorization, Cookie"}

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")


# --------------------------------------------------------------------------- who reads a run's page


@dataclass(frozen=True)
class Viewer:
    """Who signed in to a run's page: the operator (``admin``) or one run (``run_id``)."""

    admin: bool
    run_id: str | None = None


def page_caller(gw: Gateway, run_id: str, authorization: str | None, cookie: str | None) -> tuple[Caller, Viewer]:
    """Run ``run_id`` for whoever sent ``authorization`` (a bearer key) or else ``cookie`` (a session token); see the
    module's docstring. ``Unauthorized`` without a valid credential, ``NotFound`` for another run's (blocking: reads
    the database)."""
    key = bearer_key(authorization)
    if key is not None:
        viewer = viewer_of_key(gw, key)
    elif cookie:
        viewer = viewer_of_token(gw, cookie)
    else:
        raise Unauthorized("sign in with the run's API key, or send it as `Authorization: Bearer <key>`")
    return caller_for(gw, viewer, run_id), viewer


def sign_in(gw: Gateway, run_id: str, key: str) -> str:
    """The session token for the page of ``run_id`` signed in with ``key`` (the page's rules: ``Unauthorized``,
    ``NotFound``) (blocking)."""
    viewer = viewer_of_key(gw, key)
    caller = caller_for(gw, viewer, run_id)
    return session_token(gw, viewer, caller.run.key_hash, int(time.time()) + SESSION_TTL_S)


def viewer_of_key(gw: Gateway, key: str) -> Viewer:
    """The admin key's viewer or a run key's (``Unauthorized`` for an unknown or revoked key, as on the API)."""
    if hmac.compare_digest(key.strip().encode(), gw.settings.admin_key.encode()):
        return Viewer(admin=True)
    return Viewer(admin=False, run_id=authenticate(gw, f"Bearer {key}").run.id)


def caller_for(gw: Gateway, viewer: Viewer, run_id: str) -> Caller:
    """Run ``run_id`` if ``viewer`` may read it: the operator any run, a run itself only (``NotFound`` otherwise, the
    same answer as for a run that does not exist)."""
    if not viewer.admin and viewer.run_id != run_id:
        raise NotFound(f"run {run_id} not found", field="run_id")
    return run_caller(gw, run_id)


def session_token(gw: Gateway, viewer: Viewer, key_hash: str, expires: int) -> str:
    """``<who>.<expires>.<mac>``: ``who`` is ``admin`` or the run's id; the MAC binds the run's key hash too (a run's
    key hash is read back from the database when the token is checked; the admin key is in the MAC's secret)."""
    who = ADMIN if viewer.admin else str(viewer.run_id)
    return f"{who}.{expires}.{_mac(gw, who, expires, '' if viewer.admin else key_hash)}"


def viewer_of_token(gw: Gateway, token: str) -> Viewer:
    """The viewer a session token names, if it is genuine, unexpired and its run's key is not revoked (``Unauthorized``
    otherwise)."""
    who, _, rest = token.partition(".")
    expires_text, _, mac = rest.partition(".")
    # one spelling per token: a Unix time of at most 12 digits, no leading zero (int() of thousands of digits raises)
    if not (who and mac and re.fullmatch(r"[1-9][0-9]{0,11}", expires_text)) or int(expires_text) < time.time():
        raise Unauthorized("the page's sign-in has expired: sign in again")
    expires = int(expires_text)
    if who == ADMIN:
        if hmac.compare_digest(mac, _mac(gw, ADMIN, expires, "")):
            return Viewer(admin=True)
        raise Unauthorized("the page's sign-in is not valid: sign in again")
    with gw.db.session() as s:
        try:
            run = repository.run(s, who)
        except NotFound:
            run = None
        valid = run is not None and run.revoked_at is None and hmac.compare_digest(mac, _mac(gw, who, expires, run.key_hash))
    if not valid:
        raise Unauthorized("the page's sign-in is not valid (or the run's key was revoked): sign in again")
    return Viewer(admin=False, run_id=who)


def _mac(gw: Gateway, who: str, expires: int, binding: str) -> str:
    secret = hmac.new(gw.settings.admin_key.encode(), b"crucible run page session v1", hashlib.sha256).digest()
    digest = hmac.new(secret, f"{who}.{expires}.{binding}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def check_same_site(request: Request, sec_fetch_site: str | None) -> None:
    """``Forbidden`` for a sign-in posted from another site: a browser that sends ``Sec-Fetch-Site`` says where the form
    was (only ``same-origin`` and ``none``, a typed address, pass); one that does not is judged by its ``Origin``, which
    must be the host the form was posted to (an opaque ``null`` does not pass). A client that sends neither is no
    browser, and no other site's page can make it post."""
    origin = request.headers.get("origin")
    if sec_fetch_site is not None:
        if sec_fetch_site not in ("same-origin", "none"):
            raise Forbidden("sign in from the run's own page")
    elif origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise Forbidden("sign in from the run's own page")


def wants_html(request: Request) -> bool:
    """A browser's request (it asks for ``text/html``), answered with a page rather than problem+json."""
    return "text/html" in request.headers.get("accept", "")


# --------------------------------------------------------------------------- the pages


async def run_page(request: Request, gw: Gateway, caller: Caller) -> HTMLResponse:
    """A run's page: what it is, its validation scores, spend and time over the run, the designs it tried and its
    submissions' aggregate scores (its report, ``gateway.reports``)."""
    report = await reports.run_report(gw, caller)
    figures = await run_in_threadpool(_run_plots, report)
    run = caller.run
    context = {
        "run": run, "benchmark": caller.benchmark, "tasks": list(caller.tasks), "report": report, "plots": figures,
        "time": sorted(report.time, key=lambda t: _ACTIVITIES.index(t.activity)), "now": dt.datetime.now(dt.UTC),
    }
    return templates.TemplateResponse(request, "run.html", context, headers=PRIVATE_HEADERS)


_ACTIVITIES = ("training", "evaluating", "final_grading", "queued", "agent")


def _run_plots(report: RunReport) -> dict[str, Markup]:
    return {
        "validation": Markup(plots.validation_svg(report.validation, report.started_at, report.ended_at)),  # our own SVG (gateway.plots escapes what it writes)
        "spend": Markup(plots.spend_svg(report.spend, report.budget_usd_micros, report.started_at, report.ended_at)),
        "time": Markup(plots.activity_svg(sorted(report.time, key=lambda t: _ACTIVITIES.index(t.activity)))),
    }


def login_page(request: Request, run_id: str, message: str, status_code: int = 401) -> HTMLResponse:
    """The sign-in form of run ``run_id``'s page (it posts to ``/runs/login``), saying why it is shown."""
    return templates.TemplateResponse(request, "run_login.html", {"run_id": run_id, "message": message}, status_code=status_code,
                                      headers=PRIVATE_HEADERS)


def signed_in(request: Request, run_id: str, token: str) -> RedirectResponse:
    """After a sign-in: the session cookie, and back to the run's page (303: a GET)."""
    response = RedirectResponse(run_id, status_code=303, headers=PRIVATE_HEADERS)  # relative to /runs/login: /runs/<run_id>
    response.set_cookie(COOKIE, token, max_age=SESSION_TTL_S, path=COOKIE_PATH, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return response


async def leaderboard_page(request: Request, gw: Gateway) -> HTMLResponse:
    """The leaderboard, one table and one plot per benchmark (``gateway.leaderboard``'s rows, nothing else; the template
    groups them, so it renders from ``rows`` alone)."""
    rows = await leaderboard.leaderboard(gw)
    figures = await run_in_threadpool(_board_plots, rows)
    return templates.TemplateResponse(request, "leaderboard.html", {"rows": rows, "plots": figures}, headers=SECURITY_HEADERS)


_BOARD_PLOTS: OrderedDict[str, str] = OrderedDict()  # the public page's plots by what they show: drawn once, not per request
_BOARD_PLOTS_KEPT = 64
_board_lock = threading.Lock()


def _board_plots(rows: list[LeaderboardRow]) -> dict[str, Markup]:
    """Each benchmark's final score against spend (our own SVG: ``gateway.plots`` escapes what it writes). A plot is drawn
    again only when what it shows changed: the page is public, and drawing costs about 0.1 s of CPU."""
    by_benchmark: dict[str, list[LeaderboardRow]] = {}
    for r in rows:
        by_benchmark.setdefault(r.benchmark, []).append(r)
    out = {}
    for name, group in by_benchmark.items():
        shown = json.dumps([name, [(r.agent_name, r.final_score, r.spent_usd, r.final_ci) for r in group if r.final_score is not None]])
        with _board_lock:
            svg = _BOARD_PLOTS.get(shown)
        if svg is None:
            svg = plots.score_spend_svg(group, name)
            with _board_lock:
                _BOARD_PLOTS[shown] = svg
                while len(_BOARD_PLOTS) > _BOARD_PLOTS_KEPT:
                    _BOARD_PLOTS.popitem(last=False)
        out[name] = Markup(svg)
    return out


# --------------------------------------------------------------------------- formatting, for the templates


def _pct(x: float | None) -> str:
    return "…" if x is None else f"{x * 100:.1f}%"


def _ci(x: Any) -> str:
    return f"{x[0] * 100:.1f}–{x[1] * 100:.1f}%" if x and x[0] is not None and x[1] is not None else "–"


def _usd(micros: int | float | None) -> str:
    """Micro-USD as dollars: cents from a dollar up, then four decimals, then six (a run's first charges are micro-dollars)."""
    if micros is None:
        return "–"
    v = micros / 1e6
    return "$0" if v == 0 else f"${v:,.2f}" if v >= 1 else f"${v:.4f}" if v >= 0.01 else f"${v:.6f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def _when(value: dt.datetime | str | None) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


templates.env.filters.update(pct=_pct, ci=_ci, usd=_usd, duration=_duration, when=_when)
