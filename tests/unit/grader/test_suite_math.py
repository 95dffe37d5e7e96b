"""The math suite: splits are deterministic and disjoint, scores are those of reasoning-gym's own scorers and of
math-verify run on the model's output, and an answer that keeps sympy busy cannot hang the grader."""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from fractions import Fraction

import math_verify
import pytest
import reasoning_gym
import sympy
from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

from grader.scoring import score_item
from grader.suites import Item, get_suite
from grader.suites.math import MathSuite, champ_problems, math_families
from services.common.errors import Unprocessable
from services.common.harness import check_harness, extract_answer

SUITE = get_suite("math")
GYM_CONFIG = {"chain_sum": {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 3},
              "decimal_arithmetic": {"min_num_decimal_places": 1, "max_num_decimal_places": 2}}
GYM = {"source": "reasoning_gym", "config": GYM_CONFIG,
       "tasks": ["chain_sum", "basic_arithmetic", "gcd", "lcm", "fraction_simplification", "decimal_arithmetic", "prime_factorization",
                 "power_function", "coin_flip", "simple_equations", "complex_arithmetic", "polynomial_multiplication"]}
CHAMP = {"source": "champ"}


def _official_gym_entry(item: Item) -> dict:
    """The entry as reasoning-gym itself generates it (not our JSON copy), from the family, seed, config and index."""
    family, index = item.entry["metadata"]["source_dataset"], item.entry["metadata"]["source_index"]
    return reasoning_gym.create_dataset(family, seed=item.entry["seed"], size=index + 1, **item.entry["config"])[index]


def _number_variants(reference: str) -> list[str]:
    """``x.0`` for an integer, the decimal of a fraction and the fraction of a decimal, where ``reference`` is a number."""
    try:
        value = Fraction(reference)
    except (ValueError, ZeroDivisionError):
        return []
    variants = [f"{value.numerator}.0"] if value.denominator == 1 else [str(float(value)), f"{value.numerator}/{value.denominator}"]
    return [*variants, str(value + 1)]


def test_math_suite_is_registered_with_a_boxed_default_harness() -> None:
    assert SUITE.name == "math" and isinstance(SUITE, MathSuite)
    check_harness(SUITE.default_harness)
    assert SUITE.default_harness.answer_extraction == "boxed"
    assert len(math_families()) == 27 and {"chain_sum", "gcd", "lcm", "basic_arithmetic", "simple_equations", "coin_flip"} <= set(math_families())


@pytest.mark.parametrize(("params", "field"), [
    ({}, "suite.params.source"),
    ({"source": "gsm8k"}, "suite.params.source"),
    ({"source": "champ", "tasks": ["gcd"]}, "suite.params.tasks"),
    ({"source": "champ", "categories": ["Geometry"]}, "suite.params.categories"),
    ({"source": "champ", "categories": []}, "suite.params.categories"),
    ({"source": "reasoning_gym"}, "suite.params.tasks"),
    ({"source": "reasoning_gym", "tasks": ["no_such_family"]}, "suite.params.tasks"),
    ({"source": "reasoning_gym", "tasks": ["word_ladder"]}, "suite.params.tasks"),  # a reasoning-gym family, not a math one
    ({"source": "reasoning_gym", "tasks": ["gcd", "gcd"]}, "suite.params.tasks"),
    ({"source": "reasoning_gym", "tasks": ["gcd"], "categories": ["Polynomial"]}, "suite.params.categories"),
    ({"source": "reasoning_gym", "tasks": ["gcd"], "config": {"lcm": {}}}, "suite.params.config"),
    ({"source": "reasoning_gym", "tasks": ["gcd"], "config": {"gcd": {"seed": 3}}}, "suite.params.config"),
    ({"source": "reasoning_gym", "tasks": ["gcd"], "config": {"gcd": {"no_such_field": 1}}}, "suite.params.config"),
    ({"source": "reasoning_gym", "tasks": ["chain_sum"], "config": {"chain_sum": {"min_terms": 5, "max_terms": 2}}}, "suite.params.config"),
])
def test_bad_params_name_the_field(params: dict, field: str) -> None:
    with pytest.raises(Unprocessable) as exc:
        SUITE.check_params(params)
    assert exc.value.extra["field"] == field


def test_good_params_pass() -> None:
    for params in (GYM, CHAMP, {"source": "champ", "categories": ["Polynomial", "Sequence"]}, {"source": "reasoning_gym", "tasks": ["gcd"]}):
        SUITE.check_params(params)


@pytest.mark.parametrize(("params", "sizes"), [(GYM, (60, 120)), (CHAMP, (45, 80))], ids=["reasoning_gym", "champ"])
def test_splits_are_deterministic_disjoint_and_serializable(params: dict, sizes: tuple[int, int]) -> None:
    val = SUITE.generate(params, 1, sizes[0], split="validation")
    test = SUITE.generate(params, 2, sizes[1], split="test", exclude=frozenset(i.question for i in val))
    assert SUITE.generate(params, 1, sizes[0], split="validation") == val  # same seed, same items (ids, questions, answers, entries)
    assert [i.question for i in SUITE.generate(params, 3, sizes[0], split="validation")] != [i.question for i in val]
    assert not {i.question for i in val} & {i.question for i in test}
    for split in (val, test):
        assert len({i.id for i in split}) == len({i.question for i in split}) == len(split)
        assert all(json.loads(json.dumps(i.entry)) == i.entry for i in split)
    assert (len(val), len(test)) == sizes


def test_families_share_a_split_evenly_in_turn() -> None:
    items = SUITE.generate(GYM, 5, 100, split="validation")
    families = [i.entry["metadata"]["source_dataset"] for i in items]
    counts = Counter(families)
    assert set(counts) == set(GYM["tasks"]) and max(counts.values()) - min(counts.values()) <= 1
    assert families[:24] == GYM["tasks"] * 2  # interleaved: family 1, 2, …, n, 1, 2, …
    assert [counts[t] for t in GYM["tasks"]] == [9] * 4 + [8] * 8  # 100 = 12 × 8 + 4: the first four get one more


def test_champ_keeps_checkable_answers_and_filters_categories() -> None:
    kept = {p["problem_id"]: p for p in champ_problems()}
    assert len(kept) == 125
    assert kept["P_Combinatorics_6"]["gold"] == "$2^(n-1)$" and kept["P_Combinatorics_25"]["answer"] == "n!"
    for dropped in ("P_Combinatorics_3", "P_Inequality_12", "P_Combinatorics_16", "P_Number-Theory_1", "P_Combinatorics_2"):
        assert dropped not in kept  # misread floor(...)!, misread sum_(k=1)^n, undefined C(n, k), "No", "C(10, 5), or equivalently 252"
    items = SUITE.generate({"source": "champ", "categories": ["Sequence"]}, 0, 12, split="validation")
    assert {i.entry["category"] for i in items} == {"Sequence"}


def test_a_split_larger_than_the_task_space_names_its_size_field() -> None:
    val = SUITE.generate(CHAMP, 1, 100, split="validation")
    assert len(SUITE.generate(CHAMP, 2, 25, split="test", exclude=frozenset(i.question for i in val))) == 25
    tiny = {"source": "reasoning_gym", "tasks": ["gcd", "chain_sum"],
            "config": {"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}}
    for params, size, exclude in ((CHAMP, 26, frozenset(i.question for i in val)), (CHAMP, 126, frozenset()), (tiny, 1000, frozenset())):
        with pytest.raises(Unprocessable) as exc:
            SUITE.generate(params, 2, size, split="test", exclude=exclude)
        assert exc.value.extra["field"] == "suite.splits.test.size"


def test_reasoning_gym_scores_match_each_familys_own_scorer() -> None:
    items = SUITE.generate(GYM, 7, 72, split="validation")
    agree = total = 0
    official_scores: Counter[float] = Counter()
    for item in items:
        family = item.entry["metadata"]["source_dataset"]
        entry = _official_gym_entry(item)
        assert (entry["question"], str(entry["answer"])) == (item.question, item.answer)
        scorers = [reasoning_gym.create_dataset(family, **GYM_CONFIG.get(family, {})).score_answer]
        if family not in GYM_CONFIG:
            scorers.append(reasoning_gym.get_score_answer_fn(family))
        reference = item.answer
        answers = [reference, f"\\boxed{{{reference}}}", f" {reference} ", *_number_variants(reference), "0", "wrong", "", None]
        for answer in answers:
            ours = score_item(SUITE, answer, item)[0]  # as the grader scores: 0.0 where the scorer raises
            for official in scorers:
                try:
                    expected = float(official(answer, entry))
                    official_scores[expected if expected in (0.0, 1.0) else "partial"] += 1
                except ValueError:  # prime_factorization's scorer raises on a non-integer factor; the grader scores 0.0
                    expected = 0.0
                    official_scores["raised"] += 1
                total += 1
                agree += ours == expected
                assert ours == expected, (family, reference, answer)
        assert SUITE.score(reference, item) == 1.0, (family, reference)
    print(f"\nreasoning_gym: {agree}/{total} scores identical to the families' own scorers over {len(items)} items "
          f"of {len(GYM['tasks'])} families; official scores: {dict(official_scores)}")
    assert len(items) >= 50 and agree == total


def test_a_family_config_decides_its_score_as_in_reasoning_gyms_composite() -> None:
    """decimal_arithmetic's tolerance is its config's last decimal place: the configured dataset scores, as
    ``CompositeDataset.score_answer`` does, not ``get_score_answer_fn``'s default-config one."""
    params = {"source": "reasoning_gym", "tasks": ["decimal_arithmetic"],
              "config": {"decimal_arithmetic": {"min_num_decimal_places": 1, "max_num_decimal_places": 1}}}
    item = SUITE.generate(params, 0, 1, split="validation")[0]
    composite = CompositeDataset(CompositeConfig(size=1, seed=0, datasets=[DatasetSpec("decimal_arithmetic", 1.0, params["config"]["decimal_arithmetic"])]))
    near = str(Decimal(item.answer) + Decimal("0.05"))
    assert SUITE.score(near, item) == composite.score_answer(near, _official_gym_entry(item)) == 1.0
    assert reasoning_gym.get_score_answer_fn("decimal_arithmetic")(near, item.entry) == 0.0


def _champ_answers(item: Item, gold: list) -> list[str]:
    """Answers to one CHAMP item: the gold in sympy's LaTeX, CHAMP's own plain form, numeric variants, wrong ones."""
    reading = gold[0]
    answers = [sympy.latex(reading), item.answer]
    if isinstance(reading, sympy.Rational):
        answers += [f"{reading}.0"] if reading.q == 1 else [str(float(reading)), f"\\frac{{{reading.p}}}{{{reading.q}}}"]
    wrong = sympy.latex(reading + 1) if isinstance(reading, sympy.Expr) else "7"
    return [*answers, wrong, "n+2", "\\text{No}"]


def test_champ_scores_match_math_verify_on_the_model_output() -> None:
    """Our pipeline (the default harness's boxed extraction, then the suite's scorer in its child process) against
    math-verify called here, in the main thread with its defaults, on the whole completion and on the answer."""
    items = SUITE.generate(CHAMP, 11, len(champ_problems()), split="validation")
    agree = total = 0
    verdicts: Counter[float] = Counter()
    for item in items:
        gold = math_verify.parse(item.entry["gold"])
        answers = _champ_answers(item, gold)
        completions = [f"Putting it together, the final answer is $\\boxed{{{a}}}$." for a in answers] + ["\\boxed{}", "I could not solve it.", ""]
        pairs = [(SUITE.score(extract_answer(SUITE.default_harness, c), item), math_verify.verify(gold, math_verify.parse(c))) for c in completions]
        pairs += [(SUITE.score(a, item), math_verify.verify(gold, math_verify.parse(a))) for a in (f"\\boxed{{{answers[0]}}}", f"${answers[-3]}$")]
        for ours, official in pairs:
            total += 1
            agree += ours == float(official)
            verdicts[float(official)] += 1
        assert [ours for ours, _ in pairs] == [float(official) for _, official in pairs], item.id
        assert pairs[0] == (1.0, True) and pairs[len(answers) - 3] == (0.0, False), item.id  # the gold in LaTeX passes, gold + 1 fails
    assert SUITE.score(None, items[0]) == 0.0
    print(f"\nchamp: {agree}/{total} verdicts identical to math-verify's over {len(items)} items; math-verify's verdicts: {dict(verdicts)}")
    assert len(items) >= 50 and agree == total


def test_scores_are_the_same_from_worker_threads() -> None:
    """The grader scores from a thread pool, where math-verify's SIGALRM timeouts cannot be set."""
    items = SUITE.generate(CHAMP, 4, 30, split="validation") + SUITE.generate(GYM, 4, 30, split="validation")
    tasks = [(answer, item) for item in items for answer in (item.answer, "0", "\\frac{1}{2}")]
    with ThreadPoolExecutor(8) as pool:
        threaded = list(pool.map(lambda task: score_item(SUITE, *task), tasks))
    assert threaded == [score_item(SUITE, *task) for task in tasks]
    assert threaded.count((1.0, None)) >= len(items)


def test_an_answer_that_keeps_sympy_busy_is_stopped_and_the_checker_recovers() -> None:
    suite = MathSuite(check_timeout_s=2.0)
    item = next(i for i in SUITE.generate(CHAMP, 0, len(champ_problems()), split="validation") if i.id == "P_Combinatorics_12")  # (n+1)^(n-1)
    started = time.monotonic()
    assert score_item(suite, "(n+1)^{10000}", item) == (0.0, "ScorerTimeout: the scorer ran past its 2 s limit")  # math-verify alone runs for minutes
    assert time.monotonic() - started < 10.0
    assert suite.score("(n+1)^{n-1}", item) == 1.0
