"""The front page and the documentation site agree with the repository: every relative link of ``README.md`` names a
file or folder that exists (the site's own pages are checked by ``mkdocs build --strict`` in ``make test``), and
every page under ``docs/`` is in the site's navigation and reachable from the front page."""

from __future__ import annotations

import re

import yaml

from tests.conftest import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_every_relative_link_of_the_readme_resolves() -> None:
    links = _relative_links((ROOT / "README.md").read_text())
    assert links, "the README links to the documentation"
    missing = [t for t in links if not (ROOT / t.split("#", 1)[0]).exists()]
    assert missing == []


def test_every_page_is_in_the_navigation_and_linked_from_the_readme() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = {page for entry in config["nav"] for page in entry.values()}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == in_nav
    linked = {t.split("#", 1)[0].removeprefix("docs/") for t in _relative_links((ROOT / "README.md").read_text()) if t.startswith("docs/")}
    assert pages - {"index.md"} <= linked
