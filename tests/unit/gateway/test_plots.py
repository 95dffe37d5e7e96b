"""The pages' plots (``gateway.plots``): each is one well-formed, self-contained ``<svg>`` that scales to its box, says
what it shows (role, aria-label, title), draws its data marks, and with no data says "no data yet"."""

from __future__ import annotations

import datetime as dt
import re
import xml.etree.ElementTree as ET

import pytest

from gateway import plots
from gateway.schemas import ActivityTime, LeaderboardRow, SpendPoint, ValidationPoint

SVG = "{http://www.w3.org/2000/svg}"
T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def point(n: int, s: float, score: float, checkpoint: bool = False) -> ValidationPoint:
    return ValidationPoint(eval_id=f"eval_{n}", at=at(s), task="main", model="ckpt_1" if checkpoint else "smollm2-135m-instruct",
                           checkpoint=checkpoint, score=score, ci_low=max(0.0, score - 0.2), ci_high=min(1.0, score + 0.2), items=16)


def row(agent: str, final: float | None, spent: float) -> LeaderboardRow:
    return LeaderboardRow(rank=None, run_id="run_x", benchmark="chain-sum", agent_name=agent, status="graded" if final is not None else "queued",
                          tasks=[], submission_id=None, initial_score=0.2, final_score=final, reference_score=1.0, gap_closed=None, n=24,
                          final_ci=(final - 0.1, final + 0.1) if final is not None else None, validation_evaluations=2, spent_usd=spent,
                          elapsed_hours=1.0)


TIMES = [ActivityTime(activity=a, wall_s=s, busy_s=s, exclusive_s=s, count=1)
         for a, s in (("training", 300.0), ("evaluating", 120.0), ("final_grading", 30.0), ("queued", 0.0), ("agent", 500.0))]
SPEND = [SpendPoint(at=at(60), spent_usd_micros=150, by_kind={"prefill_tokens": 150}),
         SpendPoint(at=at(600), spent_usd_micros=900, by_kind={"prefill_tokens": 400, "training_tokens": 500})]

DRAWN = {
    "validation": lambda: plots.validation_svg([point(1, 30, 0.25), point(2, 700, 0.5, checkpoint=True)], T0, at(900)),
    "spend": lambda: plots.spend_svg(SPEND, 1_000_000, T0, at(900)),
    "spend near the budget": lambda: plots.spend_svg(SPEND, 1_200, T0, at(900)),
    "time": lambda: plots.activity_svg(TIMES),
    "score against spend": lambda: plots.score_spend_svg([row("a", 0.6, 0.12), row("b", 0.4, 0.05), row("c", None, 0.01)], "chain-sum"),
}
EMPTY = {
    "validation": lambda: plots.validation_svg([], T0, T0),
    "spend": lambda: plots.spend_svg([], 1_000_000, T0, T0),
    "time": lambda: plots.activity_svg([]),
    "score against spend": lambda: plots.score_spend_svg([row("c", None, 0.0)], "chain-sum"),
}


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def marks(root: ET.Element) -> list[ET.Element]:
    """The data marks' groups, each holding something drawn (a path, or a marker ``use``d)."""
    groups = [g for g in root.iter(f"{SVG}g") if g.get("id", "").startswith("mk-")]
    return [g for g in groups if g.find(f".//{SVG}path") is not None or g.find(f".//{SVG}use") is not None]


@pytest.mark.parametrize("name", list(DRAWN))
def test_each_plot_is_one_self_contained_svg_that_scales_says_what_it_shows_and_draws_marks(name: str) -> None:
    svg = DRAWN[name]()
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    root = parse(svg)
    assert root.get("role") == "img" and root.get("aria-label") and root.find(f"{SVG}title").text == root.get("aria-label")
    assert root.get("width") is None and root.get("height") is None and root.get("viewBox")  # sized by the page's CSS
    assert marks(root), "no data marks drawn"
    assert "no data yet" not in root.get("aria-label")
    assert not re.search(r"""(href|src)=["']https?:|url\(["']?https?:|@import|<script|<text\b""", svg)  # nothing fetched, no script, text as paths
    assert "<metadata" not in svg and "<?xml" not in svg


@pytest.mark.parametrize("name", list(EMPTY))
def test_a_plot_with_no_data_yet_says_so(name: str) -> None:
    svg = EMPTY[name]()
    root = parse(svg)
    assert root.get("role") == "img" and "no data yet" in root.get("aria-label")
    assert marks(root) == []
    assert "<!-- no data yet -->" in svg  # the figure's own words (drawn as paths; matplotlib keeps the text as a comment)


def test_validation_marks_checkpoints_apart_from_base_models_and_labels_the_best_score() -> None:
    both = parse(DRAWN["validation"]())
    base_only = parse(plots.validation_svg([point(1, 30, 0.25), point(2, 60, 0.3)], T0, at(900)))
    assert "2 evaluations, best 50.0%" in both.get("aria-label")
    assert len(marks(both)) == len(marks(base_only)) + 4  # the checkpoints' own points, interval bars and their two caps
    legend = DRAWN["validation"]()
    assert "<!-- checkpoint -->" in legend and "<!-- base model -->" in legend


def test_spend_is_read_against_the_budget_line_on_a_log_axis_when_far_below_it() -> None:
    far, near = DRAWN["spend"](), DRAWN["spend near the budget"]()
    assert "$0.0009 of a $1.00 budget (0.1%)" in parse(far).get("aria-label")
    assert "log scale" in far and "log scale" not in near
    assert "<!-- budget $1.00 -->" in far


def test_time_by_activity_labels_each_bar_with_its_duration_and_share() -> None:
    svg = DRAWN["time"]()
    assert "training 5m 00s" in parse(svg).get("aria-label")
    assert "<!-- 8m 20s (53%) -->" in svg and len(marks(parse(svg))) == 5


def test_two_plots_on_one_page_share_no_element_id_and_hostile_names_stay_text() -> None:
    hostile = 'agent $x^2$ <script>alert("x")</script> --> &'
    a = plots.score_spend_svg([row(hostile, 0.6, 0.1)], "bench-a")
    b = plots.score_spend_svg([row("other", 0.6, 0.1)], "bench-b")
    ids = [{e.get("id") for e in parse(svg).iter() if e.get("id")} for svg in (a, b)]
    assert ids[0] and ids[1] and not ids[0] & ids[1]
    assert "<script" not in a and "-->" not in a.replace(" -->", "")  # escaped in the comment matplotlib writes
    assert "$x^2$" in a  # printed as typed, not as mathtext


def test_the_public_leaderboard_draws_a_plot_again_only_when_what_it_shows_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page is public: a crowd of readers must not make the gateway draw the same figure over and over."""
    from gateway import pages

    drawn: list[str] = []
    monkeypatch.setattr(plots, "score_spend_svg", lambda rows, name: drawn.append(name) or f"<svg>{len(drawn)}</svg>")
    monkeypatch.setattr(pages, "_BOARD_PLOTS", type(pages._BOARD_PLOTS)())
    rows = [row("a", 0.5, 0.01), row("b", None, 0.02)]
    assert pages._board_plots(rows) == pages._board_plots(rows) and drawn == ["chain-sum"]
    pages._board_plots([row("a", 0.5, 0.01), row("b", None, 0.03)])  # b is not drawn: not graded
    assert drawn == ["chain-sum"]
    pages._board_plots([row("a", 0.5, 0.01), row("b", 0.25, 0.03)])
    assert drawn == ["chain-sum", "chain-sum"]
