"""The terminal suite's generated test split (grader/suites/terminal_families.py): drawn from the seed, never a shipped
folder, and each family's verifier checked in a real sandbox (bubblewrap here; Docker in ``make test-slow``)."""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor

import pytest

from grader.model_endpoint import ModelEndpoint
from grader.suites import Item, get_suite
from grader.suites.terminal import tasks
from grader.suites.terminal_families import FAMILIES, generate
from services.common.errors import Unprocessable
from tests.unit.grader.scripted import run_script


def rollout(endpoint: ModelEndpoint, backend: str, item: Item, script: str) -> float:
    return run_script(endpoint, backend, "terminal", item, script, wall_s=30, verifier_wall_s=30).reward  # type: ignore[return-value]


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
