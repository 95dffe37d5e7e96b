"""Suites and answer-extraction modes are plug-ins: a class decorated with ``register_suite`` or a function decorated
with ``extraction_mode`` is found by name, listed, validated and used, with nothing else edited; an unknown name is a
422 that names the field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from grader.suites import get_suite, suite_names
from grader.suites.base import SUITES, Item, register_suite
from services.common.app import create_service_app
from services.common.contracts import Harness
from services.common.errors import Unprocessable
from services.common.extraction import MODES, ExtractionOptions, extraction_mode
from services.common.harness import check_harness, extract_answer


@pytest.fixture
def toy_suite() -> Iterator[type]:
    """A suite registered by the test (sums of the seed and the index), removed afterwards."""
    suite_names()  # the package's own suites register first

    @register_suite
    class ToySuite:
        name = "toy_sums"
        default_harness = Harness(answer_extraction="last_number")

        def check_params(self, params: dict[str, Any]) -> None:
            if params:
                raise Unprocessable("toy_sums takes no parameters", field="suite.params")

        def generate(self, params: dict[str, Any], seed: int, size: int, *, split: str, exclude: frozenset[str] = frozenset()) -> list[Item]:
            return [Item(id=f"{split}-{i}", question=f"{seed} + {i} =", answer=str(seed + i)) for i in range(size)]

        def item_space(self, params: dict[str, Any]) -> tuple[int, bool]:
            return 1000, True

        def score(self, answer: str | None, item: Item) -> float:
            return float(answer == item.answer)

    yield ToySuite
    SUITES.pop(ToySuite.name)


@pytest.fixture
def shout_mode() -> Iterator[str]:
    """An extraction mode registered by the test, removed afterwards."""

    @extraction_mode("shout")
    def _shout(completion: str, _options: ExtractionOptions) -> str:
        """The stripped completion in capitals."""
        return completion.strip().upper()

    yield "shout"
    MODES.pop("shout")


@pytest.fixture
def tagged_mode() -> Iterator[str]:
    """An extraction mode with its own check: it reads the text after ``answer_regex`` taken literally, and needs one."""

    def needs_marker(options: ExtractionOptions) -> None:
        if not options.answer_regex:
            raise Unprocessable("answer_extraction 'after_marker' needs answer_regex", field="harness.answer_regex")

    @extraction_mode("after_marker", check=needs_marker)
    def _after_marker(completion: str, options: ExtractionOptions) -> str:
        """The text after the last ``answer_regex`` (taken literally), stripped."""
        return completion.rpartition(options.answer_regex or "")[2].strip() if options.answer_regex in completion else ""

    yield "after_marker"
    MODES.pop("after_marker")


def test_a_registered_suite_is_found_by_name_and_listed(toy_suite: type) -> None:
    assert "toy_sums" in suite_names()
    assert {"bfcl", "bfcl_multi_turn", "humaneval", "math", "reasoning_gym", "swe", "terminal"} <= set(suite_names())
    suite = get_suite("toy_sums")
    assert isinstance(suite, toy_suite)
    [item] = suite.generate({}, 40, 3, split="validation")[2:]
    answer = extract_answer(suite.default_harness, "40 + 2 = 42")
    assert (item.answer, suite.score(answer, item)) == ("42", 1.0)


def test_a_suite_name_belongs_to_one_class() -> None:
    class Impostor:
        name = "humaneval"

    suite_names()
    with pytest.raises(ValueError, match="humaneval"):
        register_suite(Impostor)
    assert type(get_suite("humaneval")).__name__ == "HumanEvalSuite"


def test_a_registered_extraction_mode_is_accepted_by_the_harness_and_used(shout_mode: str) -> None:
    harness = Harness.model_validate({"answer_extraction": shout_mode})
    check_harness(harness)
    assert extract_answer(harness, "  the answer is yes \n") == "THE ANSWER IS YES"
    assert extract_answer(harness, "   ") is None
    schema = Harness.model_json_schema()["properties"]["answer_extraction"]
    assert schema["enum"] == ["strip", "first_line", "last_number", "regex", "code", "boxed", "shout"]
    assert "- `shout`: The stripped completion in capitals." in schema["description"]


def test_a_modes_own_check_runs_when_the_harness_is_checked(tagged_mode: str) -> None:
    with pytest.raises(Unprocessable) as exc:
        check_harness(Harness(answer_extraction=tagged_mode))
    assert exc.value.extra["field"] == "harness.answer_regex"
    harness = Harness(answer_extraction=tagged_mode, answer_regex="ANSWER:")
    check_harness(harness)
    assert extract_answer(harness, "ANSWER: 3\nANSWER: 7 ") == "7"


def test_an_extraction_mode_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="boxed"):
        extraction_mode("boxed")(lambda completion, _options: completion)
    assert MODES["boxed"].extract.__name__ == "_boxed"


def test_every_mode_is_documented_in_the_contract_schema() -> None:
    description = Harness.model_json_schema()["properties"]["answer_extraction"]["description"]
    for mode in MODES.values():
        assert mode.summary and f"- `{mode.name}`: {mode.summary}" in description


def test_unknown_suite_or_mode_is_a_422_naming_the_field() -> None:
    app = create_service_app("registries-test", title="registries", description="suite and mode lookups")

    @app.post("/harness")
    def accept(harness: Harness) -> dict[str, str]:
        return {"answer_extraction": harness.answer_extraction}

    @app.get("/suites/{name}")
    def suite(name: str) -> dict[str, str]:
        return {"name": get_suite(name).name}

    client = TestClient(app)
    assert client.post("/harness", json={"answer_extraction": "boxed"}).json() == {"answer_extraction": "boxed"}
    response = client.post("/harness", json={"answer_extraction": "loudest"})
    assert (response.status_code, response.json()["field"]) == (422, "answer_extraction")
    assert response.json()["detail"] == "answer_extraction: Input should be 'strip', 'first_line', 'last_number', 'regex', 'code' or 'boxed'"
    assert client.get("/suites/math").json() == {"name": "math"}
    response = client.get("/suites/nope")
    assert (response.status_code, response.json()["field"]) == (422, "suite.name")
    assert response.json()["detail"] == "unknown suite 'nope'; available: bfcl, bfcl_multi_turn, evaluator, humaneval, math, reasoning_gym, swe, terminal"
