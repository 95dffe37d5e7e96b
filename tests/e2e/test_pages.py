"""End to end, in a real browser: a run's own page and the leaderboard, as Debian's Chromium draws them (headless,
driven by Playwright through its executable path: no browser is downloaded; `make install` installs Debian's).

A run does a little work first (a dataset, a two-item validation evaluation, a graded submission), so every plot has
marks. Each page must load with no console error and no request leaving the gateway, draw every plot's data marks
(``gateway.plots``: groups whose ids start ``mk-``), and fit a 390 px wide screen without sideways scrolling. Each
page's screenshots go to the test's tmp dir (and to ``$CRUCIBLE_SCREENSHOTS`` when set).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from crucible.sdk import CrucibleClient
from tests.e2e.test_flows import _test_questions

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("CRUCIBLE_CHROMIUM", "/usr/bin/chromium")
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
PAGE_PLOTS = ("Validation score over time", "Spend over time", "Time by activity")

# Every plot of the page: its aria-label and how many of its data-mark groups drew something (a box of some size).
PLOTS_JS = """() => [...document.querySelectorAll('svg[role="img"]')].map(svg => ({
  label: svg.getAttribute('aria-label') || '',
  marks: [...svg.querySelectorAll('g[id^="mk-"]')].filter(g => { const b = g.getBBox(); return b.width > 0 || b.height > 0; }).length,
  width: svg.getBoundingClientRect().width,
}))"""


@pytest.fixture(scope="module")
def worked_run(stack, admin, benchmark) -> Iterator[dict]:  # noqa: ANN001
    """A run that uploaded a dataset, evaluated the base model on two validation items and had a submission graded."""
    run = admin.create_run(benchmark["name"], "pages-e2e")
    client = CrucibleClient(stack.gateway_url, run["api_key"])
    client.upload_dataset(b'{"prompt": "1 + 2 =", "completion": "3"}\n', "pages.jsonl")
    evaluation = client.wait_evaluation(client.create_evaluation("smollm2-135m-instruct", limit=2)["id"], poll_s=0.5)
    assert evaluation["status"] == "succeeded", evaluation
    submission = client.wait_submission(client.submit("smollm2-135m-instruct")["id"], poll_s=0.5)
    assert submission["status"] == "graded", submission
    client.close()
    yield {**run, "evaluation": evaluation, "submission": submission}


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM}: `make install` installs Debian's chromium package"
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--disable-dev-shm-usage"])
        yield chromium
        chromium.close()


class Watched:
    """A page at a viewport, recording console errors, uncaught exceptions and every URL it requested."""

    def __init__(self, browser, viewport: dict) -> None:  # noqa: ANN001
        self.context = browser.new_context(viewport=viewport)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))

    def check(self, origin: str) -> list[dict]:
        """The page's plots; no console error, nothing fetched from elsewhere, no sideways scroll at its width."""
        assert self.errors == []
        assert [u for u in self.requests if not u.startswith(origin)] == []
        width = self.page.viewport_size["width"]
        assert self.page.evaluate("document.documentElement.scrollWidth") <= width
        return self.page.evaluate(PLOTS_JS)

    def screenshot(self, folder: Path, name: str) -> Path:
        path = folder / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        if os.environ.get("CRUCIBLE_SCREENSHOTS"):
            Path(os.environ["CRUCIBLE_SCREENSHOTS"]).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(os.environ["CRUCIBLE_SCREENSHOTS"]) / path.name)
        return path

    def close(self) -> None:
        self.context.close()


def test_run_page_signed_in_by_its_form_draws_every_plot_and_fits_a_phone(stack, worked_run, browser, tmp_path) -> None:  # noqa: ANN001
    url = f"{stack.gateway_url}/runs/{worked_run['id']}"
    for viewport, name in ((PHONE, "run-page-390"), (DESKTOP, "run-page-1280")):
        w = Watched(browser, viewport)
        first = w.page.goto(url)
        assert first.status == 401 and w.page.locator("form.signin").is_visible()  # a browser gets the sign-in form
        w.errors.clear()  # Chromium logs the 401 itself
        w.page.fill("input[name=key]", worked_run["api_key"])
        with w.page.expect_navigation():
            w.page.click("button[type=submit]")
        assert w.page.url == url and w.page.title().startswith(f"Run {worked_run['id']}")
        (cookie,) = [c for c in w.context.cookies() if c["name"] == "crucible_key"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/runs"
        assert worked_run["api_key"] not in cookie["value"]  # a signed token, never the key

        figures = w.check(stack.gateway_url)
        assert [f["label"].split(":")[0] for f in figures] == list(PAGE_PLOTS)
        assert all(f["marks"] > 0 and f["width"] <= viewport["width"] for f in figures), figures
        assert "1 evaluation" in figures[0]["label"]
        text = w.page.inner_text("body")
        assert worked_run["submission"]["id"] in text and "smollm2-135m-instruct" in text and "pages-e2e" in text
        assert w.page.locator("#designs + .scroll table tbody tr").count() >= 2  # the harness and the base model evaluated
        w.screenshot(tmp_path, name)
        w.close()


def test_leaderboard_ranks_within_each_benchmark_draws_its_plots_and_fits_a_phone(stack, worked_run, benchmark, browser, tmp_path) -> None:  # noqa: ANN001
    for viewport, name in ((PHONE, "leaderboard-390"), (DESKTOP, "leaderboard-1280")):
        w = Watched(browser, viewport)
        assert w.page.goto(f"{stack.gateway_url}/leaderboard").status == 200
        figures = w.check(stack.gateway_url)
        sections = w.page.locator("section")
        names = [sections.nth(i).locator("h2").inner_text() for i in range(sections.count())]
        assert benchmark["name"] in names and names == sorted(names) and len(figures) == len(names)
        for i, section_name in enumerate(names):  # ranks count within a benchmark: 1, 2, … in each section
            ranks = [r for r in sections.nth(i).locator("tbody tr:not(.sub) td:first-child").all_inner_texts() if r != "–"]
            assert ranks == [str(n) for n in range(1, len(ranks) + 1)], section_name
            assert section_name in figures[i]["label"]
        ours = sections.nth(names.index(benchmark["name"]))
        assert "pages-e2e" in ours.inner_text()
        assert figures[names.index(benchmark["name"])]["marks"] > 0  # our graded run is a point
        w.screenshot(tmp_path, name)
        w.close()


def test_run_page_refuses_without_a_key_and_answers_404_to_another_runs_key(stack, worked_run, admin, new_run) -> None:  # noqa: ANN001
    from crucible.stack import admin_key

    url, run_id = f"{stack.gateway_url}/runs/{worked_run['id']}", worked_run["id"]
    other, _ = new_run("pages-other")
    with httpx.Client(base_url=stack.gateway_url, timeout=60) as http:
        def problem(response: httpx.Response, status: int) -> dict:
            assert response.status_code == status and response.headers["content-type"].startswith("application/problem+json"), response.text
            return response.json()

        problem(http.get(url), 401)
        problem(http.get(url, headers={"Authorization": "Bearer crk_not_a_key"}), 401)
        form = http.get(url, headers={"Accept": "text/html"})
        assert form.status_code == 401 and form.headers["content-type"].startswith("text/html") and 'action="login"' in form.text
        assert problem(http.get(url, headers={"Authorization": f"Bearer {other['api_key']}"}), 404)["code"] == "not_found"

        mine = http.get(url, headers={"Authorization": f"Bearer {worked_run['api_key']}"})
        assert mine.status_code == 200 and run_id in mine.text
        assert mine.headers["cache-control"] == "no-store" and "default-src 'none'" in mine.headers["content-security-policy"]
        assert http.get(url, headers={"Authorization": f"Bearer {admin_key(stack.data_dir)}"}).status_code == 200

        # the sign-in form: a wrong key gets the form again, another run's key 404, a post from another site 403
        login = f"{stack.gateway_url}/runs/login"
        wrong = http.post(login, data={"run_id": run_id, "key": "crk_not_a_key"})
        assert wrong.status_code == 401 and 'action="login"' in wrong.text and "set-cookie" not in wrong.headers
        problem(http.post(login, data={"run_id": run_id, "key": other["api_key"]}), 404)
        problem(http.post(login, data={"run_id": run_id, "key": worked_run["api_key"]}, headers={"Sec-Fetch-Site": "cross-site"}), 403)
        signed = http.post(login, data={"run_id": other["id"], "key": other["api_key"]})
        assert signed.status_code == 303 and signed.headers["location"] == other["id"]
        set_cookie = signed.headers["set-cookie"]
        assert all(part in set_cookie for part in ("crucible_key=", "HttpOnly", "SameSite=strict", "Path=/runs", "Max-Age=3600"))
        token = signed.cookies["crucible_key"]
        assert other["api_key"] not in token

    def page(run: str, cookie: str) -> httpx.Response:
        with httpx.Client(base_url=stack.gateway_url, cookies={"crucible_key": cookie}, timeout=60) as http:
            return http.get(f"/runs/{run}")

    assert page(other["id"], token).status_code == 200
    assert page(run_id, token).status_code == 404  # another run's sign-in: as its key
    forged = token.replace(other["id"], run_id)  # the same signature on another run's name
    assert page(run_id, forged).status_code == 401
    admin.revoke(other["id"])
    assert page(other["id"], token).status_code == 401  # revoking the key ends its sign-ins


def test_pages_hold_no_hidden_test_question(stack, worked_run, benchmark) -> None:  # noqa: ANN001
    questions = _test_questions(stack, benchmark["id"])
    assert len(questions) == 24
    with httpx.Client(base_url=stack.gateway_url, timeout=60) as http:
        board = http.get("/leaderboard").text
        run_page = http.get(f"/runs/{worked_run['id']}", headers={"Authorization": f"Bearer {worked_run['api_key']}"}).text
    assert "pages-e2e" in board and worked_run["submission"]["id"] in run_page  # sanity: the pages show the run
    assert [q for q in questions if q in board or q in run_page] == []
    assert "test-0" not in board and "test-0" not in run_page  # no test item id either
