"""The evaluator track's grade: how well an evaluator's scores of the candidate systems agree with a target benchmark's.

Every function takes scores as ``{candidate: score}`` over the same candidates (scores in [0, 1], or any scale for the
rank statistics) and returns plain floats, so a grade is a function of the scores alone:

- :func:`pairwise_agreement`: the share of candidate pairs the evaluator orders as the target does (EvalResearchBench's
  headline figure). A pair the target ties has no order to agree with and is left out; a pair the evaluator ties
  while the target orders it counts one half, as a coin flip would, so an evaluator that scores at random, or gives
  every candidate the same score, expects 0.5.
- :func:`kendall_tau`: Kendall's τ-b (SciPy), the rank correlation with ties corrected; ``None`` where it is undefined
  (one side constant).
- :func:`concordance`: Lin's concordance correlation coefficient (Lin 1989, "A concordance correlation coefficient to
  evaluate reproducibility", Biometrics 45:255), ``2·cov(x, y) / (var x + var y + (mean x − mean y)²)``: 1 only for
  equal scores, not just the same order.
- :func:`ceiling`: the agreement the targets reach among themselves, which bounds what any evaluator can be expected
  to reach against one of them.
- :func:`agreement_interval`: a 95 % percentile-bootstrap interval of the agreement over candidate pairs.
- :func:`top_items_share`: the share of a score its few most influential items carry (one of the seed's failure
  modes: a few questions dominating a domain score).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

TOP_ITEMS = 3
"""Items whose share of a score :func:`top_items_share` reports."""


def _pairs(evaluator: Mapping[str, float], target: Mapping[str, float]) -> list[float]:
    """Per candidate pair the target orders: 1.0 when the evaluator orders it alike, 0.5 when it ties it, 0.0
    otherwise. Raises ``ValueError`` unless both score the same candidates."""
    if set(evaluator) != set(target):
        raise ValueError(f"the evaluator scored {sorted(evaluator)}, the target {sorted(target)}: both must score the same candidates")
    out = []
    for a, b in itertools.combinations(sorted(target), 2):
        t = _sign(target[a] - target[b])
        if t == 0:
            continue
        e = _sign(evaluator[a] - evaluator[b])
        out.append(0.5 if e == 0 else float(e == t))
    return out


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def pairwise_agreement(evaluator: Mapping[str, float], target: Mapping[str, float]) -> float | None:
    """The share of the candidate pairs that ``target`` orders which ``evaluator`` orders the same way (ties of the
    evaluator count 1/2), in [0, 1]; ``None`` when the target ties every pair. Raises ``ValueError`` unless both
    score the same candidates."""
    pairs = _pairs(evaluator, target)
    return sum(pairs) / len(pairs) if pairs else None


def kendall_tau(evaluator: Mapping[str, float], target: Mapping[str, float]) -> float | None:
    """Kendall's τ-b between the two rankings (``scipy.stats.kendalltau``), in [−1, 1]; ``None`` with fewer than two
    candidates or when either side gives every candidate the same score."""
    names = sorted(target)
    if len(names) < 2 or len({evaluator[n] for n in names}) < 2 or len({target[n] for n in names}) < 2:
        return None
    from scipy.stats import kendalltau

    tau = kendalltau([evaluator[n] for n in names], [target[n] for n in names]).statistic
    return None if math.isnan(tau) else float(tau)


def concordance(evaluator: Mapping[str, float], target: Mapping[str, float]) -> float | None:
    """Lin's concordance correlation coefficient of the scores (population moments), in [−1, 1]: 1 only where the
    evaluator gives each candidate the target's score. ``None`` with fewer than two candidates, or when both sides are
    one same constant (nothing to agree on)."""
    names = sorted(target)
    if len(names) < 2:
        return None
    x, y = [evaluator[n] for n in names], [target[n] for n in names]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    vx = sum((v - mx) ** 2 for v in x) / len(x)
    vy = sum((v - my) ** 2 for v in y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / len(x)
    denominator = vx + vy + (mx - my) ** 2
    return None if denominator == 0 else 2 * cov / denominator


def ceiling(targets: Mapping[str, Mapping[str, float]], against: str) -> float | None:
    """The mean pairwise agreement of every other target with target ``against``: how far benchmarks that mean to
    measure the same thing agree with it. ``None`` without another target, or when none orders a pair."""
    values = [a for name, scores in targets.items() if name != against
              if (a := pairwise_agreement(scores, targets[against])) is not None]
    return sum(values) / len(values) if values else None


def agreement_interval(evaluator: Mapping[str, float], target: Mapping[str, float], seed: int = 0) -> tuple[float | None, float | None]:
    """``(low, high)``: the 95 % percentile-bootstrap interval of :func:`pairwise_agreement` over the candidate pairs
    the target orders (2,000 resamples from a fixed seed: equal scores give equal intervals;
    :func:`grader.scoring.bootstrap_ci`). ``(None, None)`` when the target orders no pair."""
    from grader.scoring import bootstrap_ci

    return bootstrap_ci(_pairs(evaluator, target), seed=seed)


def top_items_share(items: Sequence[tuple[float, float]], top: int = TOP_ITEMS) -> float | None:
    """The share of a weighted score ``Σ wᵢ·sᵢ / Σ wᵢ`` that its ``top`` largest contributions ``wᵢ·sᵢ`` carry, in
    [0, 1]; ``items`` are ``(score, weight)`` pairs with scores and weights ≥ 0. ``None`` when the score is 0 (no
    item carries anything). A mean over many items gives about ``top/n``; 1.0 means the score rests on ``top`` items
    or fewer."""
    contributions = sorted((max(score, 0.0) * max(weight, 0.0) for score, weight in items), reverse=True)
    total = sum(contributions)
    return None if total <= 0 else sum(contributions[:top]) / total
