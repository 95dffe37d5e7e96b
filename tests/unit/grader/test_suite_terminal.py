"""The terminal suite's generated test split (grader/suites/terminal_families.py): drawn from the seed, never a shipped
folder, and each family's verifier checked in a real sandbox (bubblewrap here; Docker in ``make test-slow``)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from grader.harness_archives import inspect_archive
from grader.model_endpoint import Binding, ModelEndpoint
from grader.rollouts import RolloutLimits, run_rollout
from grader.sandboxes import get_sandbox
from grader.suites import Item, get_suite
from grader.suites.terminal import tasks
from grader.suites.terminal_families import FAMILIES, generate
from services.common.errors import Unprocessable
from tests.archives import code_harness


@pytest.fixture(scope="module")
def endpoint() -> Iterator[ModelEndpoint]:
    endpoint = ModelEndpoint(None)  # type: ignore[arg-type]  # no model is called by these harnesses
    endpoint.start()
    yield endpoint
    endpoint.stop()


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.slow])])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


def rollout(endpoint: ModelEndpoint, backend: str, item: Item, script: str) -> float:
    data = code_harness(script)
    binding = Binding(model="m", ctx=None, hold_id=None, key=f"eval_test:{item.id}:0", context_tokens=None, max_tokens=16, max_calls=1)
    outcome = run_rollout(get_sandbox(backend), endpoint, archive=data, archive_id="har_test", manifest=inspect_archive(data),
                          instruction=item.question, binding=binding, environment=get_suite("terminal").environment(item),
                          caps=RolloutLimits(wall_s=30, verifier_wall_s=30))
    return outcome.reward  # type: ignore[return-value]


def test_the_test_split_is_generated_from_its_seed_and_is_no_shipped_task() -> None:
    suite = get_suite("terminal")
    items = suite.generate({}, 11, 16, split="test")
    assert [(i.id, i.question) for i in items] == [(i.id, i.question) for i in suite.generate({}, 11, 16, split="test")]
    assert not {i.id for i in items} & {i.id for i in suite.generate({}, 12, 16, split="test")}
    shipped = {t["instruction"] for t in tasks().values()}
    assert not any(i.id in tasks() or i.question in shipped for i in items)
    assert {i.entry["family"] for i in items} == set(FAMILIES)  # the families taken in turn
    assert {i.entry["family"] for i in suite.generate({"categories": ["data"]}, 11, 4, split="test")} <= {"csv-column-sum", "json-count-by-type", "csv-filter-rows"}
    validation = suite.generate({}, 5, 4, split="validation")
    assert all(i.id in tasks() for i in validation)  # the public splits stay the shipped tasks
    with pytest.raises(Unprocessable) as exc:
        suite.generate({"tasks": ["fizzbuzz-script"]}, 1, 1, split="test")
    assert exc.value.extra["field"] == "suite.params"


def test_every_family_is_solved_by_its_expected_output_and_not_by_nothing_or_a_near_miss(endpoint: ModelEndpoint, backend: str) -> None:
    suite = get_suite("terminal")
    items = suite.generate({}, 3, len(FAMILIES), split="test")
    scripts = {}
    for item in items:
        generated = generate(item.entry["family"], item.entry["instance"])
        write = f"printf '%s\\n' {shlex.quote(generated.expected)} > /app/{generated.output}\n"
        near = generated.expected.splitlines()[:-1] if generated.compare != "json" else ["{}"]
        scripts[item.id] = (write, "exit 0\n", f"printf '%s\\n' {shlex.quote(chr(10).join(near) or 'x')} > /app/{generated.output}\n")
    with ThreadPoolExecutor(2) as pool:
        rewards = dict(zip(scripts, pool.map(lambda it: tuple(rollout(endpoint, backend, it, s) for s in scripts[it.id]), items), strict=True))
    assert {k: v for k, v in rewards.items() if v != (1.0, 0.0, 0.0)} == {}
