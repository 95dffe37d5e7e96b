"""The pages' plots (``gateway.pages``): pure functions from a run report's or the leaderboard's figures to an inline SVG.

Drawn on the server by matplotlib (its Agg canvas, no pyplot and so no global figure state) and written as SVG with
text as paths: a page shows them with nothing fetched, no font and no script. Each answer is one ``<svg>`` element,
without the XML prologue or a fixed size (it scales to its container: the pages' CSS sets ``width: 100%``), with
``role="img"``, an ``aria-label`` and a ``<title>`` saying what it shows. The data marks (lines, points, bars) are in
groups whose ids start ``mk-`` (the tests look for them); a plot with nothing to show draws its empty axes with
"no data yet". Two plots on one page never share an element id (each figure's ids are salted with its label).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import io
import math
import re
import threading
from collections.abc import Sequence

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from gateway.schemas import ActivityTime, LeaderboardRow, SpendPoint, ValidationPoint

WIDTH_IN, HEIGHT_IN = 6.4, 3.1  # the figures' aspect; the page scales them
MODEL, CHECKPOINT, BUDGET = "#4c72b0", "#dd8452", "#c44e52"
ACTIVITY_COLORS = {"training": "#4c72b0", "evaluating": "#dd8452", "final_grading": "#8172b3", "queued": "#937860", "agent": "#55a868"}
NO_DATA = "no data yet"
LABEL_POINTS = 12  # a score-against-spend plot names its runs' agents when it has at most this many points

_SAVE = threading.Lock()  # the SVG salt is an rcParam (process-wide): one figure is written at a time


def validation_svg(points: Sequence[ValidationPoint], started_at: dt.datetime, ended_at: dt.datetime) -> str:
    """Validation score over the run's time (``started_at`` to ``ended_at``, as the spend's): one point per evaluation
    (base models circles, the run's checkpoints diamonds) with its 95% interval, and the best score so far as steps."""
    label = f"Validation score over time: {len(points)} evaluation{'s' * (len(points) != 1)}"
    if points:
        label += f", best {max(p.score for p in points):.1%}"
    fig, ax = _figure()
    if not points:
        return _empty(fig, ax, label, "validation score", "time since the run started")
    span_s = max((ended_at - started_at).total_seconds(), *((p.at - started_at).total_seconds() for p in points), 1.0)
    scale, unit = _time_unit(span_s)
    xs = [(p.at - started_at).total_seconds() / scale for p in points]
    best, so_far = [], 0.0
    for p in points:
        so_far = max(so_far, p.score)
        best.append(so_far)
    n = _marks()
    ax.step(xs, best, where="post", color="#999999", linewidth=1, linestyle="--", label="best so far", gid=next(n))
    for checkpoint, marker, color, name in ((False, "o", MODEL, "base model"), (True, "D", CHECKPOINT, "checkpoint")):
        chosen = [(x, p) for x, p in zip(xs, points, strict=True) if p.checkpoint == checkpoint]
        if not chosen:
            continue
        px = [x for x, _ in chosen]
        py = [p.score for _, p in chosen]
        low = [p.score - p.ci_low if p.ci_low is not None else 0.0 for _, p in chosen]
        high = [p.ci_high - p.score if p.ci_high is not None else 0.0 for _, p in chosen]
        bars = ax.errorbar(px, py, yerr=[low, high], fmt="none", ecolor=color, alpha=0.45, linewidth=1.2, capsize=2)
        for artist in (*bars.lines[1], *bars.lines[2]):
            artist.set_gid(next(n))
        ax.scatter(px, py, marker=marker, s=36, color=color, edgecolor="white", linewidth=0.6, zorder=3, label=name, gid=next(n))
    ax.set_ylim(-0.03, 1.03)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}"))
    ax.set_ylabel("validation score")
    ax.set_xlabel(f"{unit} since the run started")
    ax.set_xlim(0, span_s / scale * 1.02)
    ax.legend(loc="best", fontsize=8, frameon=False)
    return _svg(fig, label)


def spend_svg(points: Sequence[SpendPoint], budget_usd_micros: int, started_at: dt.datetime, ended_at: dt.datetime) -> str:
    """Spend so far (USD, charges less refunds) over the run's time, as steps, against the budget line. Below a tenth
    of the budget the axis is logarithmic, so both the spend and the budget show."""
    budget = budget_usd_micros / 1e6
    spent = points[-1].spent_usd_micros / 1e6 if points else 0.0
    label = f"Spend over time: {_usd(spent)} of a {_usd(budget)} budget ({spent / budget:.1%})" if budget else f"Spend over time: {_usd(spent)}"
    fig, ax = _figure()
    if not points:
        return _empty(fig, ax, label, "spent (USD)", "time since the run started")
    span_s = max((ended_at - started_at).total_seconds(), (points[-1].at - started_at).total_seconds(), 1.0)
    scale, unit = _time_unit(span_s)
    xs = [0.0] + [(p.at - started_at).total_seconds() / scale for p in points] + [span_s / scale]
    ys = [0.0] + [p.spent_usd_micros / 1e6 for p in points]
    ys.append(ys[-1])
    n = _marks()
    log = budget > 0 and max(ys) < budget / 10
    if log:
        floor = min([y for y in ys if y > 0] or [budget / 1e4]) / 3
        ys = [max(y, floor) for y in ys]
        ax.set_yscale("log")
        ax.set_ylim(floor, budget * 2)
    else:
        ax.set_ylim(0, max(max(ys), budget) * 1.08)
    ax.step(xs, ys, where="post", color=MODEL, linewidth=1.8, label="spent", gid=next(n))
    ax.scatter(xs[1:-1], ys[1:-1], s=10, color=MODEL, zorder=3, gid=next(n))
    if budget > 0:
        ax.axhline(budget, color=BUDGET, linestyle="--", linewidth=1.2, label=f"budget ${budget:,.2f}", gid=next(n))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _usd(v)))
    ax.set_ylabel("spent (USD" + (", log scale)" if log else ")"))
    ax.set_xlabel(f"{unit} since the run started")
    ax.set_xlim(0, xs[-1] or 1)
    ax.legend(loc="best", fontsize=8, frameon=False)
    return _svg(fig, label)


def activity_svg(times: Sequence[ActivityTime]) -> str:
    """Time by activity: each activity's part of the run's span (``exclusive_s``: the parts sum to the span) as a bar,
    its duration written beside it."""
    total = sum(t.exclusive_s for t in times)
    label = "Time by activity: " + (", ".join(f"{t.activity.replace('_', ' ')} {_duration(t.exclusive_s)}" for t in times) if total else NO_DATA)
    fig, ax = _figure(height=2.5)
    if not times or total <= 0:
        return _empty(fig, ax, label, "", "share of the run's time")
    names = [t.activity.replace("_", " ") for t in times][::-1]
    values = [t.exclusive_s for t in times][::-1]
    colors = [ACTIVITY_COLORS.get(t.activity, MODEL) for t in times][::-1]
    scale, unit = _time_unit(max(values))
    bars = ax.barh(names, [v / scale for v in values], color=colors, height=0.6)
    n = _marks()
    for bar, value in zip(bars, values, strict=True):
        bar.set_gid(next(n))
        ax.annotate(f"{_duration(value)} ({value / total:.0%})", (bar.get_width(), bar.get_y() + bar.get_height() / 2), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_xlim(0, max(values) / scale * 1.3)
    ax.set_xlabel(f"{unit} (each instant counted once)")
    return _svg(fig, label)


def score_spend_svg(rows: Sequence[LeaderboardRow], benchmark: str) -> str:
    """A benchmark's final score (Avg over its tasks) against what each run spent: one point per graded run, its
    95% interval where the leaderboard gives one, its agent named while there are few."""
    graded = [r for r in rows if r.final_score is not None]
    label = f"Final score against spend on {benchmark}: {len(graded)} graded run{'s' * (len(graded) != 1)}"
    fig, ax = _figure()
    if not graded:
        return _empty(fig, ax, label, "final score", "spent (USD)")
    n = _marks()
    xs = [r.spent_usd for r in graded]
    ys = [r.final_score for r in graded]
    with_ci = [(r.spent_usd, r.final_score, r.final_ci) for r in graded if r.final_ci]
    if with_ci:
        bars = ax.errorbar([x for x, _, _ in with_ci], [y for _, y, _ in with_ci],
                           yerr=[[y - ci[0] for _, y, ci in with_ci], [ci[1] - y for _, y, ci in with_ci]],  # type: ignore[operator,index]
                           fmt="none", ecolor=MODEL, alpha=0.4, linewidth=1.2, capsize=2)
        for artist in (*bars.lines[1], *bars.lines[2]):
            artist.set_gid(next(n))
    ax.scatter(xs, ys, s=40, color=MODEL, edgecolor="white", linewidth=0.6, zorder=3, gid=next(n))
    if len(graded) <= LABEL_POINTS:
        for r in graded:
            ax.annotate(_plain(_short(r.agent_name)), (r.spent_usd, r.final_score), xytext=(5, 4), textcoords="offset points", fontsize=8)  # type: ignore[arg-type]
    ax.set_ylim(-0.03, 1.03)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}"))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _usd(v)))
    ax.set_xlim(0, max(xs) * 1.25 or 1)
    ax.set_ylabel("final score (hidden test)")
    ax.set_xlabel("spent (USD)")
    return _svg(fig, label)


# --------------------------------------------------------------------------- drawing


def _figure(height: float = HEIGHT_IN) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(WIDTH_IN, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(True, color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)
    return fig, ax


def _empty(fig: Figure, ax: Axes, label: str, ylabel: str, xlabel: str) -> str:
    """The empty axes of a plot with nothing to show yet, saying so."""
    ax.text(0.5, 0.5, NO_DATA, transform=ax.transAxes, ha="center", va="center", fontsize=14, color="#777777")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    return _svg(fig, label if label.endswith(NO_DATA) else f"{label} ({NO_DATA})")


def _marks():  # noqa: ANN202
    """Group ids for a figure's data marks: ``mk-1``, ``mk-2``, … (:func:`_svg` suffixes a salt per figure)."""
    return (f"mk-{i}" for i in range(1, 1000))


def _svg(fig: Figure, label: str) -> str:
    """``fig`` as one ``<svg>`` element for a page: no prologue, no metadata, no fixed size, ``role="img"``,
    ``aria-label`` and a ``<title>``; every element id (the data marks' ``mk-…`` among them) ends with a salt from ``label``."""
    salt = hashlib.sha256(label.encode()).hexdigest()[:8]
    buf = io.StringIO()
    with _SAVE, matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text[text.index("<svg"):], flags=re.S)
    ids = set(re.findall(r'\bid="([^"]+)"', text))  # glyphs, markers, clip paths, marks: suffixed, so two plots share none
    text = re.sub(r'(\bid="|href="#|url\(#)([^")]+)', lambda m: f"{m[1]}{m[2]}-{salt}" if m[2] in ids else m[0], text)
    head_end = text.index(">")
    head = re.sub(r'\s(width|height)="[^"]*"', "", text[:head_end])
    escaped = html.escape(label, quote=True)
    return f'{head} role="img" aria-label="{escaped}" class="plot"><title>{escaped}</title>{text[head_end + 1:]}'.strip()


# --------------------------------------------------------------------------- formatting


def _time_unit(span_s: float) -> tuple[float, str]:
    """Seconds per unit and its name for an axis spanning ``span_s``."""
    if span_s < 120:
        return 1.0, "seconds"
    if span_s < 2 * 3600:
        return 60.0, "minutes"
    return 3600.0, "hours"


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{seconds:.0f}s" if seconds >= 1 or seconds == 0 else f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def _usd(v: float) -> str:
    """A tick's dollars: cents from a dollar up, two significant digits below (``$0.000015``, never ``1.5e-05``)."""
    if v <= 0:
        return "$0"
    if v >= 1:
        return f"${v:,.2f}"
    decimals = max(2, 1 - math.floor(math.log10(v)))
    return f"${v:.{decimals}f}".rstrip("0").rstrip(".")


def _short(name: str, limit: int = 24) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _plain(text: str) -> str:
    """``text`` as matplotlib should print it: a ``$`` literal, not the start of mathtext."""
    return text.replace("$", r"\$")
