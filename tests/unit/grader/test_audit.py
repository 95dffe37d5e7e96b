"""The contamination audit on real suite items: planted test items are flagged, items that only share the
suite's template or differ in an operator are not."""

from __future__ import annotations

import pytest

from grader.audit import audit, row_text, tokens
from grader.suites import Item, get_suite, suite_canonical
from services.common.contracts import AuditSettings

PARAMS = {"task": "chain_sum", "min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}


def _items() -> tuple[list[Item], list[Item]]:
    suite = get_suite("reasoning_gym")
    test = suite.generate(PARAMS, 3, 40, split="test")
    train = suite.generate(PARAMS, 1, 2000, split="train", exclude=frozenset(i.question for i in test))
    return test, train


def test_planted_test_items_are_flagged_and_honest_training_data_is_not() -> None:
    test, train = _items()
    honest = [{"messages": [{"role": "user", "content": it.question}, {"role": "assistant", "content": it.answer}]} for it in train]
    public = [it.question for it in train]
    clean = audit(test, honest, AuditSettings(), public=public, datasets=1)
    assert (clean.contaminated, clean.flagged_items, clean.items, clean.rows) == (False, 0, 40, 2000)

    planted = honest + [{"prompt": f"Q: {it.question}", "completion": it.answer} for it in test[:7]]
    report = audit(test, planted, AuditSettings(), public=public)
    assert report.contaminated and report.flagged_items == 7
    # with 8-grams an item has windows of the template alone; without the public pool they would flag honest data:
    # that is why the pool's n-grams are left out
    assert audit(test, honest, AuditSettings(ngram=8), public=public).flagged_items == 0
    assert audit(test, honest, AuditSettings(ngram=8)).flagged_items > 0
    assert audit(test, planted, AuditSettings(ngram=8), public=public).flagged_items == 7


def test_normalization_keeps_operators_and_ignores_case_and_spacing() -> None:
    assert tokens("State  the answer:\n31 - 8 + 62 =") == ["state", "the", "answer", ":", "31-8+62", "="]
    assert tokens("3x + 5 = 2.5, v1.2 + 3") == ["3x", "+", "5", "=", "2", ".", "5", ",", "v1", ".", "2", "+", "3"]
    item = Item(id="t", question="What is 31 - 8 + 62 ?", answer="85")
    assert audit([item], ["WHAT is 31 - 8 + 62?"], AuditSettings()).flagged_items == 1
    assert audit([item], ["what is 31 + 8 - 62 ?"], AuditSettings()).flagged_items == 0


def test_long_items_need_the_configured_share_of_their_13_grams() -> None:
    words = [f"w{i}" for i in range(40)]
    item = Item(id="long", question=" ".join(words), answer="")  # 28 distinct 13-grams
    half = " ".join(words[:27])  # windows 0..14: 15 of 28
    quarter = " ".join(words[:20])  # windows 0..7: 8 of 28
    assert audit([item], [half], AuditSettings()).flagged_items == 1
    assert audit([item], [quarter], AuditSettings()).flagged_items == 0
    assert audit([item], [quarter], AuditSettings(min_overlap=0.25)).flagged_items == 1


def test_every_string_of_a_row_is_read() -> None:
    row = {"prompt": "a", "chosen": "b", "rejected": "c", "messages": [{"role": "user", "content": "d"}], "n": 3}
    assert set(row_text(row).split()) == {"a", "b", "c", "user", "d"}


def test_a_long_reference_answer_planted_without_its_question_is_flagged_too() -> None:
    from grader.suites import get_suite

    suite = get_suite("humaneval")
    test = suite.generate({}, 3, 20, split="test")
    public = suite.generate({}, 1, 40, split="train", exclude=frozenset(i.question for i in test))
    honest = [{"prompt": it.question, "completion": it.answer} for it in public]
    settings = AuditSettings()
    public_texts = [t for it in public for t in (it.question, it.answer)]
    assert audit(test, honest, settings, public=public_texts).flagged_items == 0
    long_answers = [it for it in test if len(tokens(it.answer)) >= settings.ngram][:3]
    solutions_only = honest + [{"prompt": "write the function", "completion": it.answer} for it in long_answers]
    assert audit(test, solutions_only, settings, public=public_texts).flagged_items == 3


def test_a_planted_item_does_not_flag_an_item_that_it_starts_with_or_that_starts_it() -> None:
    """An expression is one token, so no n-gram ends inside it: "…: 73 - 46 =" shares no 13-gram with the different
    problem "…: 73 - 46 + 37 =" (token by token they would share "…problem: 73 - 46", half the short item's 13-grams)."""
    stem = "State the final answer to the following arithmetic problem: "
    short, long_ = Item(id="a", question=stem + "73 - 46 =", answer="27"), Item(id="b", question=stem + "73 - 46 + 37 =", answer="64")
    other = Item(id="c", question=stem + "1 - 3 - 3 =", answer="-5")
    for planted, flagged in ((long_, "b"), (short, "a"), (Item(id="d", question=stem + "1 - 3 - 8 =", answer="-10"), None)):
        report = audit([short, long_, other], [{"prompt": planted.question, "completion": planted.answer}], AuditSettings())
        assert report.flagged_items == (flagged is not None), (planted.question, report)
    assert audit([short], [stem + "73 - 46.5 ="], AuditSettings()).flagged_items == 0


# Hidden seeds under which planting the first five test items of the test suite's benchmark flagged a sixth that
# shares a prefix with one of them (the planted "73 - 46 + 37 =" flagged "73 - 46 ="; "1 - 3 - 8 =" flagged "1 - 3 - 3 =").
PREFIX_SEEDS = (2237951778, 3498182076, 1858758766, 2096560163)


@pytest.fixture(scope="module")
def benchmark_splits() -> tuple[object, list[Item]]:
    """The test suite's benchmark as the grader sees it, and its public items (validation and training pool)."""
    from grader import splits
    from services.common.contracts import EvaluationSettings, GradingSpec, SuiteSpec, SystemSpec
    from tests.conftest import TEST_BENCHMARK

    spec = GradingSpec(task_id="t", suite=SuiteSpec.model_validate(TEST_BENCHMARK["suite"]), initial_system=SystemSpec(model="m"),
                       evaluation=EvaluationSettings.model_validate(TEST_BENCHMARK["evaluation"]))
    validation = splits.validation_split(spec)
    return spec, splits.training_pool(spec, validation) + validation


@pytest.mark.parametrize("seed", PREFIX_SEEDS)
def test_planting_five_hidden_items_flags_exactly_those_five(seed: int, benchmark_splits: tuple[object, list[Item]]) -> None:
    from grader import splits

    spec, public = benchmark_splits
    test = splits.test_split(spec, seed, public)  # type: ignore[arg-type]
    rows = [{"messages": [{"role": "user", "content": it.question}, {"role": "assistant", "content": "0"}]} for it in test[:5]]
    suite = get_suite("reasoning_gym")
    report = audit(test, rows, AuditSettings(), public=[t for it in public for t in (it.question, it.answer)],
                   canonical=lambda item: suite_canonical(suite, item))
    assert report.flagged_items == 5


# --------------------------------------------------------------------------- harness archives


def _archive(files: dict[str, str]) -> bytes:
    """A harness archive (``.tar.gz``) of ``files`` beside its manifest."""
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, text in {"harness.toml": 'name = "h"\nentry = "python3 /harness/agent.py"\n', **files}.items():
            data = text.encode()
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return out.getvalue()


AGENT = "import os, sys\nfrom openai import OpenAI\nclient = OpenAI()\ntask = sys.stdin.read()\n" \
        "print(client.chat.completions.create(model=os.environ['OPENAI_MODEL'], messages=[{'role': 'user', 'content': task}]))\n"


def test_a_harness_carrying_a_swe_projects_released_library_is_flagged_with_its_reason() -> None:
    from grader.audit import audit_harnesses, solution_material
    from grader.suites.swe_mutants import PROJECTS

    toolz = PROJECTS["toolz"]
    material = solution_material("swe", {"projects": ["toolz"]}, [])
    assert {m.kind for m in material} == {"swe project toolz: released library"} and len(material) == len(toolz.modules())
    released = (toolz.repo / "toolz" / "itertoolz.py").read_text()
    restore = _archive({"agent.py": AGENT, "vendor/it.py": released.upper().replace("    ", "\t")})  # recased, reindented: still the file
    clean = _archive({"agent.py": AGENT, "notes.md": "Read the issue, ask the model for a patch, apply it with git apply."})
    findings = audit_harnesses([("har_restore", restore), ("har_clean", clean)], material, AuditSettings())
    assert findings == ["har_restore: swe project toolz: released library: 1 (toolz/itertoolz.py)"]


def test_a_harness_carrying_a_gold_patch_a_terminal_familys_answer_code_or_the_answer_key_is_flagged() -> None:
    import inspect

    from grader.audit import audit_harnesses, solution_material
    from grader.suites.terminal_families import FAMILIES

    family, fn = next(iter(FAMILIES.items()))
    fn = fn[-1] if isinstance(fn, tuple) else fn
    terminal = solution_material("terminal", {}, [])
    assert len(terminal) == len(FAMILIES) and {m.kind for m in terminal} == {"terminal family answer code"}
    copied = _archive({"agent.py": AGENT, "solve.py": inspect.getsource(fn)})
    assert audit_harnesses([("har_t", copied)], terminal, AuditSettings()) == [f"har_t: terminal family answer code: 1 ({family})"]

    fixed = "\n".join(f"    total_{i} = sum(values[{i}:]) + offset * {i}  # keep the running total" for i in range(12))
    patch = "--- a/lib/core.py\n+++ b/lib/core.py\n@@ -1,12 +1,12 @@\n" + "\n".join(" " + line for line in fixed.splitlines()) + "\n"
    item = Item(id="bug-1", question="The total is off by one.", answer="", entry={"patch": patch})
    gold = solution_material("math", {}, [item])
    assert [m.kind for m in gold] == ["gold patch of a hidden item"]
    assert audit_harnesses([("har_g", _archive({"fix.py": fixed}))], gold, AuditSettings()) == ["har_g: gold patch of a hidden item: 1 (bug-1)"]

    test, train = _items()
    key = _archive({"agent.py": AGENT, "key.json": "\n".join(f'{{"q": "{it.question}", "a": "{it.answer}"}}' for it in test[:5])})
    findings = audit_harnesses([("har_k", key)], [], AuditSettings(), test_items=test, public=[it.question for it in train])
    assert findings == [f"har_k: hidden test items in its files: 5 of {len(test)}"]
    assert audit_harnesses([("har_c", _archive({"agent.py": AGENT}))], terminal + gold, AuditSettings(), test_items=test) == []
