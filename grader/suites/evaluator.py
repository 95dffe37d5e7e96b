"""The ``evaluator`` suite: the evaluator track's own task, whose items are the benchmark's candidate systems.

An evaluator-track benchmark is registered as its targets (tasks that grade every candidate, ``GradingSpec.target``)
and one task of this suite, which the research agent's evaluator is evaluated on. ``params`` =
``{"candidates": ["candidate-01", …]}``, the opaque names alone: the systems behind them are the task's
``GradingSpec.candidates``. Every split is every candidate, in name order (the names are public; what the grader keeps
from the run is the targets' scores, not the items), so ``seed`` and ``exclude`` change nothing.

``Item.id`` is the candidate's name, ``question`` the JSON ``{"candidate": "<name>"}`` the evaluator reads on stdin,
``answer`` empty. The evaluator (a code harness, :mod:`grader.evaluators`) runs once per item with the candidate as its
only model; an item's score is the evaluator's score of the candidate (:func:`grader.evaluators.parse_output`: its final
score, else the weighted mean of the items it finished, else 0). What an evaluation of an evaluator is worth is not
the mean of those scores but their agreement with the targets' (:func:`grader.evaluators.grade`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from grader.suites.base import Item, register_suite
from services.common.contracts import CANDIDATE_NAME, Harness
from services.common.errors import Unprocessable


def _names(params: dict[str, Any]) -> list[str]:
    return sorted(params.get("candidates") or [])


@register_suite
class EvaluatorSuite:
    name = "evaluator"
    default_harness = Harness()

    def check_params(self, params: dict[str, Any]) -> None:
        names = params.get("candidates")
        if set(params) != {"candidates"} or not isinstance(names, list) or len(names) < 2 \
                or not all(isinstance(n, str) and re.fullmatch(CANDIDATE_NAME, n) for n in names) or len(set(names)) != len(names):
            raise Unprocessable("suite.params: the evaluator suite takes {candidates: [candidate-01, …]}, two or more distinct names",
                                field="suite.params.candidates")

    def generate(self, params: dict[str, Any], seed: int, size: int, *, split: str, exclude: frozenset[str] = frozenset()) -> list[Item]:
        return [Item(id=name, question=json.dumps({"candidate": name}), answer="", entry={}) for name in _names(params)][:size]

    def item_space(self, params: dict[str, Any]) -> tuple[int, bool]:
        return len(_names(params)), True

    def score(self, answer: str | None, item: Item) -> float:
        from grader.evaluators import candidate_score

        return candidate_score(answer or "") or 0.0
