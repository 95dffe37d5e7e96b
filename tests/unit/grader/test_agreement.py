"""The evaluator track's grade (grader/agreement.py): agreement of an evaluator's scores with a target's."""

from __future__ import annotations

import random

import pytest
from scipy.stats import kendalltau

from grader import agreement

TARGET = {"candidate-01": 0.9, "candidate-02": 0.7, "candidate-03": 0.55, "candidate-04": 0.3, "candidate-05": 0.1, "candidate-06": 0.0}


def test_an_evaluator_that_reproduces_the_target_agrees_fully() -> None:
    assert agreement.pairwise_agreement(dict(TARGET), TARGET) == 1.0
    assert agreement.kendall_tau(dict(TARGET), TARGET) == pytest.approx(1.0)
    assert agreement.concordance(dict(TARGET), TARGET) == pytest.approx(1.0)
    assert agreement.agreement_interval(dict(TARGET), TARGET) == (1.0, 1.0)


def test_the_same_order_on_another_scale_agrees_in_rank_not_in_concordance() -> None:
    halved = {name: score / 2 for name, score in TARGET.items()}
    assert agreement.pairwise_agreement(halved, TARGET) == 1.0
    assert agreement.kendall_tau(halved, TARGET) == pytest.approx(1.0)
    assert agreement.concordance(halved, TARGET) < 0.8


def test_the_reversed_order_disagrees_on_every_pair() -> None:
    reversed_ = {name: 1 - score for name, score in TARGET.items()}
    assert agreement.pairwise_agreement(reversed_, TARGET) == 0.0
    assert agreement.kendall_tau(reversed_, TARGET) == pytest.approx(-1.0)


def test_an_evaluator_that_scores_at_random_agrees_about_half_the_time_over_many_seeds() -> None:
    rng = random.Random(7)
    values = [agreement.pairwise_agreement({name: rng.random() for name in TARGET}, TARGET) for _ in range(2000)]
    mean = sum(values) / len(values)
    assert 0.48 < mean < 0.52  # 15 pairs x 2,000 draws: the mean's standard error is about 0.004


def test_ties_count_half_for_the_evaluator_and_leave_a_pair_out_for_the_target() -> None:
    constant = dict.fromkeys(TARGET, 0.5)
    assert agreement.pairwise_agreement(constant, TARGET) == 0.5
    assert agreement.kendall_tau(constant, TARGET) is None
    tied_target = {"a": 0.5, "b": 0.5, "c": 0.1}
    assert agreement.pairwise_agreement({"a": 0.1, "b": 0.9, "c": 0.0}, tied_target) == 1.0  # a-b left out; a>c, b>c agree
    assert agreement.pairwise_agreement({"a": 1, "b": 2, "c": 3}, dict.fromkeys("abc", 0.2)) is None


def test_kendall_tau_is_scipys_tau_b() -> None:
    rng = random.Random(3)
    for _ in range(20):
        evaluator = {name: rng.choice([0.0, 0.25, 0.5, 1.0]) for name in TARGET}
        expected = kendalltau([evaluator[n] for n in sorted(TARGET)], [TARGET[n] for n in sorted(TARGET)]).statistic
        got = agreement.kendall_tau(evaluator, TARGET)
        assert (got is None and len(set(evaluator.values())) == 1) or got == pytest.approx(expected)


def test_scores_of_other_candidates_are_refused() -> None:
    with pytest.raises(ValueError, match="same candidates"):
        agreement.pairwise_agreement({"candidate-01": 1.0}, TARGET)


def test_the_ceiling_is_the_other_targets_agreement_with_a_target() -> None:
    targets = {"a": TARGET, "b": dict(TARGET), "c": {name: 1 - score for name, score in TARGET.items()}}
    assert agreement.ceiling(targets, "a") == pytest.approx(0.5)  # b agrees fully, c not at all
    assert agreement.ceiling({"a": TARGET}, "a") is None


def test_the_interval_covers_the_agreement_and_narrows_with_more_candidates() -> None:
    rng = random.Random(11)
    small = {f"c{i}": i / 6 for i in range(6)}
    large = {f"c{i}": i / 30 for i in range(30)}
    noisy_small = {n: v + rng.gauss(0, 0.2) for n, v in small.items()}
    noisy_large = {n: v + rng.gauss(0, 0.2) for n, v in large.items()}
    for noisy, target in ((noisy_small, small), (noisy_large, large)):
        low, high = agreement.agreement_interval(noisy, target)
        assert low <= agreement.pairwise_agreement(noisy, target) <= high
    width = [agreement.agreement_interval(n, t) for n, t in ((noisy_small, small), (noisy_large, large))]
    assert width[1][1] - width[1][0] < width[0][1] - width[0][0]


def test_a_score_carried_by_a_few_items_is_told_apart_from_a_spread_one() -> None:
    spread = [(1.0, 1.0)] * 30
    assert agreement.top_items_share(spread) == pytest.approx(0.1)
    dominated = [(1.0, 20.0)] * 2 + [(0.1, 1.0)] * 30
    assert agreement.top_items_share(dominated) > 0.9
    assert agreement.top_items_share([(0.0, 1.0)] * 5) is None
