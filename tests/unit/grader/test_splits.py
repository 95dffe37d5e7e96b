"""Split design and canonical forms, on the real suites and the shipped presets (no services).

The differential test over two deployments (``test_hidden_split_isolation.py``) proves that public answers do
not depend on the hidden split; these tests pin the pieces: how the hidden split is drawn around the public ones,
what the operator is told, and the audit catching reworded copies of hidden items.
"""

from __future__ import annotations

import functools
import random
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from crucible.cli import app
from gateway.benchmarks import grading_spec, parse_benchmark
from grader import splits
from grader.audit import audit
from grader.canonical import math_tokens, template_clauses
from grader.suites import Item, chao1, get_suite, suite_canonical
from services.common.contracts import AuditSettings, GradingSpec
from tests.conftest import ROOT

PRESETS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.yaml"))


def _specs(preset: str) -> list[GradingSpec]:
    spec = parse_benchmark(yaml.safe_load((ROOT / "benchmarks" / f"{preset}.yaml").read_text()))
    return [grading_spec(spec, task, f"bm_{task.name}") for task in spec.task_list()]


def _task(params: dict, sizes: tuple[int, int, int], suite: str = "reasoning_gym") -> GradingSpec:
    (train, val, test) = sizes
    return GradingSpec.model_validate({
        "task_id": "bm_t", "suite": {"name": suite, "params": params, "splits": {
            "train": {"seed": 7, "size": train}, "validation": {"seed": 8, "size": val}, "test": {"size": test}}},
        "initial_system": {"model": "smollm2-135m-instruct"}, "evaluation": {"max_tokens": 8}})


CHAIN = {"task": "chain_sum", "min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}


@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "swe-mini"])  # swe-mini's splits verify about 250 bugs as they are drawn
# (88 s alone, past 900 s beside the slow suites): the differential test draws them under two seeds and compares every route,
# and test_suite_swe.py checks that a public bug is never a test item however its issue is worded
def test_the_hidden_split_is_drawn_around_the_public_ones_and_the_public_ones_ignore_it(preset: str) -> None:
    for spec in _specs(preset):
        if spec.evaluator is not None:  # the evaluator track's own task: every split is every candidate, by design (public names)
            continue
        suite = get_suite(spec.suite.name)
        validation = splits.validation_split(spec)
        pool = splits.training_pool(spec, validation)
        public = validation + pool
        public_keys = {splits.item_key(suite, it) for it in public}
        tests = [splits.test_split(spec, seed, public) for seed in (11, 12)]
        for test in tests:
            assert len(test) == spec.suite.splits.test.size
            assert not {splits.item_key(suite, it) for it in test} & public_keys  # no hidden item's answer is public, reworded or not
        assert [it.question for it in tests[0]] != [it.question for it in tests[1]]
        assert [it.question for it in splits.test_split(spec, 11, public)] == [it.question for it in tests[0]]  # deterministic
        # an outsider regenerating the pool's raw stream sees it skip validation questions only
        raw = suite.generate(spec.suite.params, spec.suite.splits.train.seed or 0, len(pool) + len(validation), split="train")
        pool_questions = {it.question for it in pool}
        skipped = [it.question for it in raw[:len(pool)] if it.question not in pool_questions]
        assert set(skipped) <= {it.question for it in validation}


def test_a_split_that_cannot_be_drawn_around_the_public_ones_names_its_size() -> None:
    from services.common.errors import Unprocessable

    spec = _task({}, (100, 40, 30), suite="humaneval")
    validation = splits.validation_split(spec)
    with pytest.raises(Unprocessable) as exc:
        splits.test_split(spec, 5, validation + splits.training_pool(spec, validation))
    assert exc.value.extra["field"] == "suite.splits.test.size"


def test_chao1_estimates_the_size_of_a_population_from_its_repeats() -> None:
    rng = random.Random(0)
    for size in (200, 2000, 20_000):
        estimate = chao1(str(rng.randrange(size)) for _ in range(4000))
        assert 0.8 * size <= estimate <= 1.25 * size, (size, estimate)
    assert chao1(["a"] * 10) == 1


def test_the_operator_is_warned_of_enumerable_tasks_and_told_the_public_share_of_test_draws() -> None:
    small = splits.split_report(_task({"task": "chain_sum", "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, (60, 10, 10)))
    assert small.enumerable and small.item_space.count < 1000 and any("cannot stay secret" in w for w in small.warnings)
    assert small.public_share_of_draws > 0.2 and any("distribution differs" in w for w in small.warnings)
    wide = splits.split_report(_task({"task": "chain_sum", "min_terms": 4, "max_terms": 5, "min_digits": 3, "max_digits": 4}, (500, 20, 20)))
    assert not wide.enumerable and wide.warnings == [] and wide.public_share_of_draws == 0.0
    code = splits.split_report(_specs("vibetraining-mini")[1])
    assert (code.item_space.count, code.item_space.exact, code.enumerable) == (164, True, True)


def test_check_benchmark_prints_each_tasks_split_report_and_warnings() -> None:
    out = CliRunner().invoke(app, ["admin", "check-benchmark", str(ROOT / "benchmarks" / "rsigym-mini.yaml")], terminal_width=400)
    assert out.exit_code == 0, out.output
    assert "public share of test draws" in out.output and "humaneval" in out.output
    assert "task 'code': humaneval {} has 164 distinct items" in out.output


def test_check_benchmark_names_the_field_of_bad_suite_params(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "benchmarks" / "chain-sum-demo.yaml").read_text())
    doc["suite"]["splits"]["test"]["size"] = 10**6
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    out = CliRunner().invoke(app, ["admin", "check-benchmark", str(bad)], terminal_width=400)
    assert out.exit_code == 1 and "suite.splits.test.size" in out.output


# --------------------------------------------------------------------------- canonical forms and the audit

REWORDINGS = ("Compute {expr}.", "What is {expr}? Reply with a number only.", "Q: {expr} = ?\nA:", "Please evaluate the expression {expr} for me")
GCD_REWORDINGS = ("What is the greatest common divisor of {a} and {b}?", "gcd({a}, {b}) = ?", "Give the GCD of the numbers {a}, {b}.")


def test_the_instruction_text_of_a_family_is_learned_from_the_family() -> None:
    questions = [it.question for it in get_suite("reasoning_gym").generate({"task": "gcd"}, 3, 200, split="x")]
    assert template_clauses(questions) == {"Find the Greatest Common Divisor (GCD) of these numbers:", "Give only the GCD as your final answer."}
    assert math_tokens("The total is 1,234 − 5×6. So x = -3/4") == ["1234", "-", "5", "*", "6", "x", "-3", "/", "4"]
    assert math_tokens("4-1 = 3, 2 - -5 = 7") == ["4", "-", "1", "3", "2", "-", "-5", "7"]


@pytest.mark.parametrize("params", [CHAIN, {"source": "reasoning_gym", "tasks": ["chain_sum", "basic_arithmetic", "gcd"]}])
def test_reworded_copies_of_hidden_arithmetic_items_are_flagged_and_the_public_pool_is_not(params: dict) -> None:
    suite_name = "math" if "source" in params else "reasoning_gym"
    spec = _task(params, (2000, 40, 60), suite=suite_name)
    suite = get_suite(suite_name)
    validation = splits.validation_split(spec)
    public = validation + splits.training_pool(spec, validation)
    test = splits.test_split(spec, 99, public)
    public_texts = [t for it in public for t in (it.question, it.answer)]
    canonical = lambda item: suite_canonical(suite, item)  # noqa: E731
    honest = [{"messages": [{"role": "user", "content": it.question}, {"role": "assistant", "content": it.answer}]} for it in public]
    clean = audit(test, honest, AuditSettings(), public=public_texts, canonical=canonical)
    assert (clean.flagged_items, clean.rows) == (0, len(public))

    has_form = [it for it in test if canonical(it) is not None]
    assert len(has_form) >= len(test) // 2  # most items of these tasks carry an expression worth matching
    for i, template in enumerate(REWORDINGS + GCD_REWORDINGS):
        rows = []
        for it in has_form:
            meta = it.entry["metadata"]
            if "numbers" in meta:
                text = GCD_REWORDINGS[i % len(GCD_REWORDINGS)].format(a=meta["numbers"][0], b=meta["numbers"][1])
            else:
                text = REWORDINGS[i % len(REWORDINGS)].format(expr=meta["expression"])
            rows.append({"prompt": text, "completion": it.answer})
        report = audit(test, honest + rows, AuditSettings(), public=public_texts, canonical=canonical)
        assert report.flagged_items == len(has_form) and report.flagged_by_canonical_form == len(has_form), template
        without_forms = audit(test, honest + rows, AuditSettings(), public=public_texts)
        assert without_forms.flagged_items < len(has_form)  # the n-grams alone miss reworded copies


def test_a_hidden_function_copied_with_a_reworded_docstring_is_flagged() -> None:
    suite = get_suite("humaneval")
    spec = _task({}, (40, 20, 40), suite="humaneval")
    validation = splits.validation_split(spec)
    public = validation + splits.training_pool(spec, validation)
    test = splits.test_split(spec, 3, public)
    public_texts = [t for it in public for t in (it.question, it.answer)]
    canonical = lambda item: suite_canonical(suite, item)  # noqa: E731
    honest = [{"prompt": it.question, "completion": it.answer} for it in public]
    assert audit(test, honest, AuditSettings(), public=public_texts, canonical=canonical).flagged_items == 0
    public_defs = {m for text in public_texts for m in re.findall(r"def\s+(\w+)\s*\(", text)}
    named = [it for it in test if canonical(it) is not None and it.entry["entry_point"] not in public_defs]  # a shared helper is no evidence
    assert len(named) >= 30
    rows = [{"messages": [{"role": "user", "content": f"Implement `def {it.entry['entry_point']}(...)` as its tests require."},
                          {"role": "assistant", "content": f"def {it.entry['entry_point']}(*args):\n    return None\n"}]} for it in named]
    report = audit(test, honest + rows, AuditSettings(), public=public_texts, canonical=canonical)
    assert report.flagged_items == len(named)


def _arithmetic_tasks() -> list[tuple[str, GradingSpec]]:
    """Every task of the shipped presets on a suite of generated arithmetic (reasoning-gym's families, the math suite's)."""
    return [(f"{preset}:{spec.task}", spec) for preset in PRESETS for spec in _specs(preset) if spec.suite.name in ("reasoning_gym", "math")]


WORDS = ("compute", "what", "is", "the", "value", "of", "please", "evaluate", "answer", "result", "find", "tell", "me", "sum",
         "solve", "quickly", "number", "only", "give", "q", "calculate", "work", "out", "and", "reply")


@functools.cache
def _public(task: str) -> tuple[GradingSpec, list[Item], list[str]]:
    spec = dict(_arithmetic_tasks())[task]
    validation = splits.validation_split(spec)
    public = validation + splits.training_pool(spec, validation)
    return spec, public, [t for it in public for t in (it.question, it.answer)]


@pytest.mark.parametrize("task", [name for name, _ in _arithmetic_tasks()])
@settings(max_examples=4, deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_rewording_of_a_hidden_items_instruction_is_flagged(task: str, data: st.DataObject) -> None:
    """A hidden item copied with its instruction replaced by any other words (``Compute 4 - 5 - 3.``, ``q: what is
    4 - 5 - 3 ? reply``), its expression or numbers unchanged, is flagged (every shipped arithmetic task, hidden seeds
    and wordings drawn by Hypothesis); the public pool uploaded as it is is not. The only items without a form are
    lists of numbers too short to be evidence (``MIN_DIGITS``)."""
    spec, public, public_texts = _public(task)
    suite = get_suite(spec.suite.name)
    test = splits.test_split(spec, data.draw(st.integers(0, 2**31), label="hidden seed"), public)[:40]
    canonical = lambda item: suite_canonical(suite, item)  # noqa: E731
    formless = [it for it in test if canonical(it) is None]
    assert all(not any(t in "+-*/^%" for t in math_tokens(it.question)) for it in formless), [it.question for it in formless]
    words = st.lists(st.sampled_from(WORDS), max_size=6).map(" ".join)
    rows = []
    for it in test:
        form = canonical(it)
        if form is None:
            continue
        body = " ".join(form.tokens) if form.view == "math" else it.question
        text = data.draw(words) + data.draw(st.sampled_from([" ", ": ", "\n", ", "])) + body + data.draw(st.sampled_from(["", " =", " = ?", ".", "?"])) \
            + " " + data.draw(words)
        rows.append({"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": it.answer}]})
    report = audit(test, rows, AuditSettings(), public=public_texts, canonical=canonical)
    assert report.flagged_items == len(test) - len(formless), (task, [r["messages"][0]["content"] for r in rows][:5])
