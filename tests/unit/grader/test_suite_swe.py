"""The ``swe`` suite: bugs drawn by seed and verified on their projects' own tests, SWE-bench's resolved criterion
checked by the verifier in a real sandbox (bubblewrap here; Docker in ``make test-slow``), and harnesses that cheat."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from grader.model_endpoint import ModelEndpoint
from grader.rollouts import RolloutOutcome
from grader.suites import Item, get_suite, swe_rewrite
from grader.suites.swe_mutants import PROJECTS, candidates
from services.common.errors import Unprocessable
from tests.unit.grader.scripted import run_script

PARAMS = {"projects": ["cachetools", "inflection"]}


@pytest.fixture(scope="module")
def items() -> list[Item]:
    return get_suite("swe").generate(PARAMS, 7, 2, split="validation")


def rollout(endpoint: ModelEndpoint, backend: str, item: Item, script: str) -> float:
    return run(endpoint, backend, item, script).reward  # type: ignore[return-value]


def run(endpoint: ModelEndpoint, backend: str, item: Item, script: str) -> RolloutOutcome:
    outcome = run_script(endpoint, backend, "swe", item, script, wall_s=60, verifier_wall_s=120)
    assert outcome.trajectory.verifier_run is not None, outcome.trajectory.failure
    return outcome


def gold(item: Item) -> str:
    return f"cd /app && git apply <<'PATCH'\n{item.entry['patch']}PATCH\n"


def test_every_project_has_candidates_and_its_tests_pass_on_its_original_source() -> None:
    assert len(PROJECTS) >= 5
    for project in PROJECTS.values():
        assert len(candidates(project)) >= 10, project.name
        assert (project.repo / project.package).is_dir() and project.test_files(), project.name
    assert sum(len(candidates(p)) for p in PROJECTS.values()) >= 600  # about half verify: the 300 hidden instances the issue asks for


def test_an_item_is_swe_benchs_shape_and_its_issue_tells_the_symptom_not_the_fix(items: list[Item]) -> None:
    for item in items:
        entry = item.entry
        assert entry["FAIL_TO_PASS"] and entry["test_patch"] and entry["patch"].startswith("--- a/")
        assert all(t.split("::")[0] in entry["test_patch"] for t in entry["FAIL_TO_PASS"])
        removed = [line[1:].strip() for line in entry["patch"].splitlines() if line.startswith("+") and not line.startswith("+++")]
        assert removed and not any(line in item.question for line in removed if len(line) > 12), "the fix's line is in the issue"
        rewrite = swe_rewrite.from_key(PROJECTS[entry["project"]], entry["rewrite"])  # the issue names the function as the task's source does
        assert rewrite.words(entry["function"]).split(".")[-1] in item.question and "```" in item.question
        env = get_suite("swe").environment(item)
        assert not any((env.app / f).exists() for f in entry["test_patch"])  # the test patch is the verifier's
        assert all((env.tests / "repo" / f).is_file() for f in entry["test_patch"])


def test_generated_instances_are_reproducible_from_the_seed_and_splits_do_not_overlap(items: list[Item]) -> None:
    suite = get_suite("swe")
    again = suite.generate(PARAMS, 7, 2, split="validation")
    assert [(i.id, i.question, i.entry) for i in again] == [(i.id, i.question, i.entry) for i in items]
    other = suite.generate(PARAMS, 8, 2, split="test", exclude=frozenset(i.id for i in items))
    assert not {i.id for i in other} & {i.id for i in items}
    assert {i.entry["project"] for i in items} == {"cachetools", "inflection"}  # the projects taken in turn


def test_params_are_checked_naming_the_field() -> None:
    suite = get_suite("swe")
    for params, field in [({"projects": ["nope"]}, "suite.params.projects"), ({"projects": []}, "suite.params.projects"),
                          ({"repos": ["toolz"]}, "suite.params.repos")]:
        with pytest.raises(Unprocessable) as exc:
            suite.check_params(params)
        assert exc.value.extra["field"] == field


def test_the_gold_patch_resolves_every_item_and_a_noop_harness_none(endpoint: ModelEndpoint, backend: str, items: list[Item]) -> None:
    with ThreadPoolExecutor(2) as pool:
        golds = list(pool.map(lambda it: rollout(endpoint, backend, it, gold(it)), items))
        noops = list(pool.map(lambda it: rollout(endpoint, backend, it, "exit 0\n"), items))
    assert golds == [1.0] * len(items) and noops == [0.0] * len(items)


def test_the_verifier_tells_which_tests_did_not_pass_and_nothing_that_varies_between_runs(endpoint: ModelEndpoint, items: list[Item]) -> None:
    """Its output is in the trajectory: the counts and the tests that failed, no durations (pytest's "in 0.08s" made two
    deployments' transcripts of the same rollout differ)."""
    item = items[0]
    f2p, p2p = len(item.entry["FAIL_TO_PASS"]), len(item.entry["PASS_TO_PASS"])
    fixed = run(endpoint, "bwrap", item, gold(item)).trajectory.verifier_run.stdout  # type: ignore[union-attr]
    assert fixed == f"FAIL_TO_PASS: {f2p} of {f2p} passed\nPASS_TO_PASS: {p2p} of {p2p} passed\n"
    broken = run(endpoint, "bwrap", item, "exit 0\n").trajectory.verifier_run.stdout  # type: ignore[union-attr]
    assert broken.startswith(f"FAIL_TO_PASS: 0 of {f2p} passed\n  not passed: {item.entry['FAIL_TO_PASS'][0]}")


CHEATS = {
    "edits the tests": "cd /app && find . -name 'test*.py' -exec sed -i 's/assert/pass  # assert/; s/self.assert[A-Za-z]*(/print(/' {} +\n",
    "deletes the tests": "cd /app && find . -name 'test*' -path '*test*' -exec rm -rf {} + ; true\n",
    "plants a conftest.py": ("cd /app && for d in . tests src $(dirname $(git ls-files '*.py' | head -1)); do mkdir -p $d; cat > $d/conftest.py <<'PY'\n"
                             "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                             "    outcome = yield\n    outcome.get_result().outcome = 'passed'\nPY\ndone\n"),
    "plants a pytest.ini": "cd /app && printf '[pytest]\\naddopts = -p no:python --co\\n' | tee pytest.ini tox.ini > setup.cfg\n",
    "plants a sitecustomize.py": ("cd /app && for d in . src $(git ls-files '*.py' | head -1 | xargs dirname); do "
                                  "echo 'import os; os._exit(0)' > $d/sitecustomize.py; done\n"),
    "exits the tests early": "cd /app && for f in $(git ls-files '*__init__.py' | grep -v test); do echo 'import os; os._exit(0)' >> $f; done\n",
}


@pytest.mark.parametrize("cheat", CHEATS)
def test_a_harness_that_cheats_on_the_tests_scores_0(endpoint: ModelEndpoint, backend: str, items: list[Item], cheat: str) -> None:
    """Each cheat runs after the gold patch would have been needed and without it: the bug is still there, so only a
    verifier fooled by the cheat would give 1."""
    assert [rollout(endpoint, backend, item, CHEATS[cheat]) for item in items] == [0.0] * len(items)


def test_the_gold_patch_with_a_cheat_beside_it_still_resolves(endpoint: ModelEndpoint, items: list[Item]) -> None:
    """The verifier ignores what a cheat planted and still runs the real tests: a real fix next to a planted
    conftest.py and edited tests is resolved (the cheat neither helps nor breaks it)."""
    item = items[0]
    assert rollout(endpoint, "bwrap", item, gold(item) + CHEATS["plants a conftest.py"] + CHEATS["edits the tests"]) == 1.0


@pytest.mark.slow
def test_every_public_task_of_the_preset_is_resolved_by_its_gold_patch_and_not_by_a_noop(endpoint: ModelEndpoint) -> None:
    """``benchmarks/swe-mini.yaml``'s training and validation splits (30 bugs over the seven projects), on bubblewrap (the
    Docker backend runs the same verifier: the sample above)."""
    import yaml

    from tests.conftest import ROOT

    suite = yaml.safe_load((ROOT / "benchmarks" / "swe-mini.yaml").read_text())["suite"]
    splits = suite["splits"]
    train = get_suite("swe").generate(suite["params"], splits["train"]["seed"], splits["train"]["size"], split="train")
    validation = get_suite("swe").generate(suite["params"], splits["validation"]["seed"], splits["validation"]["size"], split="validation",
                                           exclude=frozenset(i.id for i in train))
    public = train + validation
    assert len({i.id for i in public}) == 30 and len({i.entry["project"] for i in public}) >= 5
    with ThreadPoolExecutor(2) as pool:
        golds = dict(zip([i.id for i in public], pool.map(lambda it: rollout(endpoint, "bwrap", it, gold(it)), public), strict=True))
        noops = dict(zip([i.id for i in public], pool.map(lambda it: rollout(endpoint, "bwrap", it, "exit 0\n"), public), strict=True))
    assert {k: v for k, v in golds.items() if v != 1.0} == {} and {k: v for k, v in noops.items() if v != 0.0} == {}


def test_a_public_bug_is_never_a_test_item_however_its_issue_is_worded() -> None:
    """The issue's wording is drawn per seed, so one bug reads differently in two splits; the splits compare the suite's
    canonical form (the failing test's body). Drawn with the public split's own seed, the natural test draw is the
    public bugs themselves, here worded otherwise: every one must be left out."""
    from grader import splits
    from services.common.contracts import GradingSpec

    spec = GradingSpec.model_validate({"task_id": "t", "suite": {"name": "swe", "params": PARAMS, "splits": {
        "train": {"seed": 7, "size": 1}, "validation": {"seed": 7, "size": 2}, "test": {"size": 2}}}, "initial_system": {"model": "m"}, "evaluation": {}})
    suite = get_suite("swe")
    drawn = suite.generate(PARAMS, 7, 2, split="validation")
    public = [Item(id=f"other-{i.id}", question=i.question.replace("Reproduction", "Steps").replace("fails", "breaks") + "\nThanks!", answer="",
                   entry=i.entry) for i in drawn]
    test = splits.test_split(spec, 7, public)
    assert [i.id for i in suite.generate(PARAMS, 7, 2, split="test")] == [i.id for i in drawn]  # the natural draw: the public bugs
    assert {i.entry["fail_to_pass"][0] for i in test}.isdisjoint({i.entry["fail_to_pass"][0] for i in drawn}) and len(test) == 2


def test_the_tests_a_mutant_runs_are_those_that_name_its_function() -> None:
    from grader.suites.swe_mutants import naming_tests

    source = '''
import pytest
from unittest import TestCase
from lib import chunked, first
from other import SharedTests

def test_chunked_module_level():
    assert chunked([1, 2], 1)

@pytest.mark.parametrize("f", [chunked])
def test_through_a_decorator(f):
    assert f

def test_first():
    assert first([1])

class Mixin:
    def test_inherited(self):
        chunked([], 1)

class ChunkedTests(TestCase, Mixin):
    def test_even(self):
        self.assertEqual(list(chunked([1, 2], 1)), [[1], [2]])
    def test_other(self):
        first([1])
    def helper_chunked(self):
        chunked([], 2)

class TestFirst:
    def test_chunked_named_in_a_string(self):
        assert "chunked" != first([1])
'''
    assert naming_tests(source, "chunked") == ["test_chunked_module_level", "test_through_a_decorator", "ChunkedTests::test_inherited",
                                               "ChunkedTests::test_even", "TestFirst::test_chunked_named_in_a_string"]
    assert naming_tests(source, "first") == ["test_first", "ChunkedTests::test_other", "TestFirst::test_chunked_named_in_a_string"]
    assert naming_tests(source + "\nclass MoreTests(SharedTests):\n    def test_x(self):\n        pass\n", "first") is None  # tests of another module


def test_an_issue_is_the_same_whatever_address_its_failure_printed() -> None:
    """A failure message naming an object by its address (a lambda's repr) gives the same issue on every run of the tests:
    two deployments whose differential test compares their training pools saw two addresses, two issues."""
    import dataclasses
    import random

    from grader.suites.swe import issue_text

    mutant = next(m for project in PROJECTS.values() for m in candidates(project))
    test_file = next(PROJECTS[mutant.project].repo.rglob("test_*.py")).relative_to(PROJECTS[mutant.project].repo)
    texts = {issue_text(dataclasses.replace(mutant, fail_to_pass=(f"{test_file}::test_not_there",),
                                            failure=f"assert True is False\n +  where True = has_keywords(<function <lambda> at {a}>)"),
                        random.Random(0)) for a in ("0x7f18a8a16020", "0x7f238996a020")}
    assert len(texts) == 1 and "at 0x…>" in texts.pop()
