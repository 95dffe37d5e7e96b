"""Grader logic without processes: harness rendering and extraction, metrics, suite splits and scorer."""

from __future__ import annotations

import datetime as dt
import math

import pytest
import reasoning_gym

from grader.evaluations import check_evaluation_limits
from grader.scoring import aggregate, pass_at_k
from grader.suites import get_suite
from services.common.contracts import EvaluationLimits, EvaluationSettings, EvaluationUsage, Harness
from services.common.errors import EvaluationRateLimited, FailedEvaluationLimit, Unprocessable
from services.common.harness import apply_settings, check_harness, extract_answer, render_messages

PARAMS = {"task": "chain_sum", "min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}


def test_harness_renders_system_and_user_messages() -> None:
    h = Harness(system_prompt="Only the number.", user_template="Q: {{ question }}")
    assert render_messages(h, "1 + 1 =") == [{"role": "system", "content": "Only the number."}, {"role": "user", "content": "Q: 1 + 1 ="}]


@pytest.mark.parametrize(("mode", "regex", "completion", "expected"), [
    ("strip", None, "  42 \n", "42"),
    ("first_line", None, "17\nbecause", "17"),
    ("last_number", None, "3 + 4 is 7.", "7"),
    ("last_number", None, "no digits", None),
    ("regex", r"answer: (-?\d+)", "the answer: -5", "-5"),
    ("first_line", None, "", None),
])
def test_answer_extraction(mode: str, regex: str | None, completion: str, expected: str | None) -> None:
    assert extract_answer(Harness(answer_extraction=mode, answer_regex=regex), completion) == expected


def test_bad_harness_names_the_field() -> None:
    with pytest.raises(Unprocessable) as exc:
        check_harness(Harness(user_template="{{ question "))
    assert exc.value.extra["field"] == "harness.user_template"
    with pytest.raises(Unprocessable) as exc:
        check_harness(Harness(answer_extraction="regex", answer_regex="("))
    assert exc.value.extra["field"] == "harness.answer_regex"


def test_sandboxed_template_cannot_reach_python_internals() -> None:
    with pytest.raises(Unprocessable):
        check_harness(Harness(user_template="{{ question.__class__.__mro__[1].__subclasses__() }}"))


def test_benchmark_settings_cap_the_harness() -> None:
    h = apply_settings(Harness(max_tokens=500, temperature=0.9), EvaluationSettings(max_tokens=16, temperature=0.0))
    assert (h.max_tokens, h.temperature) == (16, 0.0)


def test_pass_at_k_matches_the_unbiased_estimator() -> None:
    # Chen et al. 2021: 1 - C(n-c, k) / C(n, k)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 4, 3) == 1.0


def test_aggregate_avg_and_pass() -> None:
    scores = {"a": [1.0, 0.0], "b": [0.0, 0.0], "c": [1.0, 1.0]}
    avg = aggregate(scores, "avg@k", 2)
    assert (avg.value, avg.n, avg.metric) == (pytest.approx(0.5), 3, "avg@2")
    assert aggregate(scores, "pass@k", 2).value == pytest.approx(2 / 3)


def test_every_score_carries_a_reproducible_95_percent_bootstrap_interval() -> None:
    scores = {f"i{i}": [1.0 if i % 10 < 3 else 0.0] for i in range(200)}  # 30% correct
    first, again = aggregate(scores, "avg@k", 1), aggregate(scores, "avg@k", 1)
    assert first == again  # fixed seed: the same scores give the same interval
    assert first.ci_low < 0.3 < first.ci_high
    # the normal approximation's half-width for p = 0.3, n = 200 is 1.96 * sqrt(0.21 / 200) ≈ 0.064
    assert first.ci_high - first.ci_low == pytest.approx(2 * 1.96 * math.sqrt(0.3 * 0.7 / 200), rel=0.15)
    wider = aggregate(dict(list(scores.items())[:20]), "avg@k", 1)
    assert wider.ci_high - wider.ci_low > first.ci_high - first.ci_low
    assert aggregate({"a": [1.0], "b": [1.0]}, "avg@k", 1).model_dump() == {"value": 1.0, "n": 2, "metric": "avg@1", "k": 1, "ci_low": 1.0, "ci_high": 1.0}
    assert (aggregate({}, "avg@k", 1).ci_low, aggregate({}, "avg@k", 1).ci_high) == (None, None)


def test_suite_splits_are_deterministic_and_disjoint() -> None:
    suite = get_suite("reasoning_gym")
    train = suite.generate(PARAMS, 1, 500, split="train")
    val = suite.generate(PARAMS, 2, 60, split="validation", exclude=frozenset(i.question for i in train))
    test = suite.generate(PARAMS, 3, 100, split="test", exclude=frozenset(i.question for i in train + val))
    assert [i.question for i in val] == [i.question for i in suite.generate(PARAMS, 2, 60, split="validation", exclude=frozenset(i.question for i in train))]
    qs = [{i.question for i in split} for split in (train, val, test)]
    assert not (qs[0] & qs[1]) and not (qs[0] & qs[2]) and not (qs[1] & qs[2])
    assert len(qs[2]) == 100


def test_suite_scores_like_reasoning_gym_itself() -> None:
    suite = get_suite("reasoning_gym")
    items = suite.generate(PARAMS, 7, 40, split="validation")
    official = reasoning_gym.create_dataset("chain_sum", **{k: v for k, v in PARAMS.items() if k != "task"}, seed=0, size=1)
    for i, item in enumerate(items):
        for answer in (item.answer, str(int(item.answer) + 1), f" {item.answer} ", "", "x"):
            assert suite.score(answer, item) == official.score_answer(answer, item.entry), (i, answer)
    assert suite.score(None, items[0]) == 0.0


def test_unknown_suite_or_params_name_the_field() -> None:
    with pytest.raises(Unprocessable) as exc:
        get_suite("nope")
    assert exc.value.extra["field"] == "suite.name"
    with pytest.raises(Unprocessable) as exc:
        get_suite("reasoning_gym").check_params({"task": "no_such_task"})
    assert exc.value.extra["field"] == "suite.params"


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "{{ 'x' * 10000000000 }}",
    "{{ range(100000) | list }}",
    "{{ lipsum(1000000) }}",
    "{{ other }}",
])
def test_harness_templates_cannot_loop_or_allocate(template: str) -> None:
    with pytest.raises(Unprocessable) as exc:
        check_harness(Harness(user_template=template))
    assert exc.value.extra["field"] == "harness.user_template"


def test_harness_template_substitution_and_filters_are_allowed() -> None:
    check_harness(Harness(user_template="Problem: {{ question | trim }}\nAnswer:"))


def _usage(last_hour: int = 0, last_day: int = 0, active: int = 0, failed: int = 0) -> EvaluationUsage:
    return EvaluationUsage(last_hour=last_hour, last_day=last_day, active=active, failed=failed, total=last_day + failed)


def test_evaluation_limits_refuse_with_the_limit_named_and_when_to_retry() -> None:
    now = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
    started = [now - dt.timedelta(minutes=m) for m in (5, 20, 50, 300)]  # newest first
    limits = EvaluationLimits(per_hour=3, per_day=10, concurrent=2, failed=1)
    check_evaluation_limits(_usage(last_hour=2, last_day=3), started[1:], limits, now)  # one more is fine

    with pytest.raises(EvaluationRateLimited) as exc:
        check_evaluation_limits(_usage(last_hour=3, last_day=4), started, limits, now)
    assert exc.value.extra["limit"] == "validation_evaluations_per_hour"
    assert exc.value.extra["retry_after_s"] == 10 * 60  # the one started 50 minutes ago leaves the window in 10

    with pytest.raises(EvaluationRateLimited) as exc:
        check_evaluation_limits(_usage(active=2), [], limits, now)
    assert exc.value.extra["limit"] == "concurrent_evaluations" and exc.value.status == 429

    with pytest.raises(FailedEvaluationLimit) as exc:
        check_evaluation_limits(_usage(failed=1), [], limits, now)
    assert exc.value.status == 403 and exc.value.extra["limit"] == "failed_evaluations"

    day = [now - dt.timedelta(hours=h) for h in (2, 3, 23)]
    with pytest.raises(EvaluationRateLimited) as exc:
        check_evaluation_limits(_usage(last_day=3), day, EvaluationLimits(per_day=3), now)
    assert exc.value.extra["retry_after_s"] == 3600
    check_evaluation_limits(_usage(last_hour=99, last_day=99, active=99, failed=99), [], EvaluationLimits(concurrent=None, failed=None), now)


def test_an_answer_regex_that_backtracks_forever_is_stopped_and_extracts_nothing() -> None:
    import time

    harness = Harness(answer_extraction="regex", answer_regex=r"(x+x+)+y")  # exponential backtracking on "xxx…x"
    start = time.monotonic()
    assert extract_answer(harness, "x" * 40) is None
    assert time.monotonic() - start < 5
    assert extract_answer(Harness(answer_extraction="regex", answer_regex=r"answer is (\d+)"), "the answer is 42") == "42"
