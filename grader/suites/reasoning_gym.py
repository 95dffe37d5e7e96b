"""The ``reasoning_gym`` suite: procedural task families from reasoning-gym, scored by their own scorers.

``params`` = ``{"task": "<family>", **family_config}``, e.g. ``{"task": "chain_sum", "min_terms": 2,
"max_terms": 3, "min_digits": 1, "max_digits": 2}``. Items come from ``reasoning_gym.create_dataset``
with the split's seed; answers are scored with ``reasoning_gym.get_score_answer_fn(task)`` (the
family's official ``score_answer``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import reasoning_gym

from grader.canonical import Canonical, canonical_statement, template_clauses
from grader.suites import Item, chao1
from services.common.contracts import Harness
from services.common.errors import Unprocessable

_MAX_GENERATION_ROUNDS = 8
SPACE_DRAWS = 2000  # draws behind an item-space estimate


@lru_cache(maxsize=256)
def family_template(family: str) -> frozenset[str]:
    """The instruction clauses of a reasoning-gym family: those recurring across 200 of its items drawn with its
    default config and seed 0 (:func:`grader.canonical.template_clauses`); empty if the family cannot be drawn so."""
    try:
        return template_clauses(entry["question"] for entry in reasoning_gym.create_dataset(family, seed=0, size=200))
    except Exception:  # noqa: BLE001 - a family that needs a config: no clause is known to be instruction text
        return frozenset()


def canonical_form(item: Item) -> Canonical | None:
    """The canonical form (:mod:`grader.canonical`) of a reasoning-gym item: its question without its family's
    instruction clauses, read as math when it holds an expression."""
    family = item.entry.get("metadata", {}).get("source_dataset")
    return canonical_statement(item.question, family_template(family) if family else frozenset())


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=list))


class ReasoningGymSuite:
    """reasoning-gym families; the default harness asks for the final answer only, greedy decoding."""

    name = "reasoning_gym"
    default_harness = Harness(
        system_prompt="Answer with the final number only.",
        user_template="{{ question }}",
        max_tokens=16,
        temperature=0.0,
        answer_extraction="first_line",
    )

    def check_params(self, params: dict[str, Any]) -> None:
        task = params.get("task")
        if not isinstance(task, str):
            raise Unprocessable("suite.params.task must name a reasoning-gym task family", field="suite.params.task")
        config = {k: v for k, v in params.items() if k != "task"}
        try:
            reasoning_gym.create_dataset(task, seed=0, size=1, **config)
        except Exception as exc:  # reasoning-gym raises several kinds for bad names/configs
            raise Unprocessable(f"reasoning-gym rejected task {task!r} with {config}: {exc}", field="suite.params") from exc

    def generate(self, params: dict[str, Any], seed: int, size: int, *, split: str, exclude: frozenset[str] = frozenset()) -> list[Item]:
        """Deterministic items; questions in ``exclude`` (and repeats within the split) are skipped."""
        task = params["task"]
        config = {k: v for k, v in params.items() if k != "task"}
        items: list[Item] = []
        seen = set(exclude)
        want = size * 2
        for round_ in range(_MAX_GENERATION_ROUNDS):
            dataset = reasoning_gym.create_dataset(task, seed=seed + 1_000_003 * round_, size=want, **config)
            for entry in dataset:
                if entry["question"] in seen:
                    continue
                seen.add(entry["question"])
                items.append(Item(id=f"{split}-{len(items):05d}", question=entry["question"], answer=str(entry["answer"]), entry=_jsonable(entry)))
                if len(items) == size:
                    return items
            want *= 2
        raise Unprocessable(f"{task}: only {len(items)} distinct {split} items exist outside the excluded set; ask for fewer", field=f"suite.splits.{split}.size")

    def score(self, answer: str | None, item: Item) -> float:
        if answer is None:
            return 0.0
        scorer = reasoning_gym.get_score_answer_fn(item.entry["metadata"]["source_dataset"])
        return float(scorer(answer, item.entry))

    def canonical(self, item: Item) -> Canonical | None:
        """The item's statement without its family's instruction text (:func:`canonical_form`)."""
        return canonical_form(item)

    def item_space(self, params: dict[str, Any]) -> tuple[int, bool]:
        """Estimated distinct questions: :func:`grader.suites.chao1` over ``SPACE_DRAWS`` draws with seed 0."""
        config = {k: v for k, v in params.items() if k != "task"}
        return chao1(e["question"] for e in reasoning_gym.create_dataset(params["task"], seed=0, size=SPACE_DRAWS, **config)), False
