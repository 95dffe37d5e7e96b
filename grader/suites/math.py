"""The ``math`` suite: reasoning-gym's math task families, or the CHAMP competition problems.

``params`` picks one source.

**reasoning-gym**: ``{"source": "reasoning_gym", "tasks": ["chain_sum", "gcd", …], "config": {"chain_sum":
{"min_terms": 2, …}}}``. ``tasks``: families of reasoning-gym's ``arithmetic``, ``algebra``, ``geometry`` and
``probability`` categories (:func:`math_families`); ``config`` (optional): per family, fields of its config
dataclass other than ``seed`` and ``size``, which the suite sets. A split of ``size`` items gives each family
``size // n`` items (the first ``size % n`` families one more), interleaved family 1, 2, …, n, 1, 2, …. Family
``f`` draws, in index order, from ``reasoning_gym.create_dataset(f, seed=<first 8 bytes of sha256("<seed>/<f>")>,
…)``, skipping questions in ``exclude`` or already taken, and gives up after ``max(1000, 20 × its items)`` draws.
(reasoning-gym's ``CompositeDataset`` picks a family at random for each index, so its families are not spread
evenly; it is not used to draw.) ``Item.id`` is ``<split>-<n:05d>``, ``answer`` the family's answer and ``entry``
the reasoning-gym entry (``question``, ``answer``, ``metadata``) as
:func:`grader.suites.reasoning_gym.encode_entry` writes it (JSON that decodes to an equal entry: tuples, sets and
``gsm_symbolic``'s ``Fraction`` variables included) plus ``source``, ``config`` and ``seed`` (the family's draw
seed; ``metadata.source_index`` is the index). Score: the family's ``score_answer`` on a dataset built with the
item's config, given the decoded entry, as ``CompositeDataset.score_answer`` forwards it
(reasoning_gym/composite.py), in a child process (:func:`grader.suites.reasoning_gym.score_entry`). With a default
config that is ``reasoning_gym.get_score_answer_fn(family)``; ``decimal_arithmetic`` (its tolerance),
``time_intervals`` and ``polynomial_equations`` read their config when scoring, so for them only the configured
dataset gives the official score. ``None`` goes to the scorer too (some give it 0.01, like a wrong answer). An
answer on which the scorer raises (``prime_factorization``'s raises ``ValueError`` on the factor ``3.``) or runs
past ``check_timeout_s`` raises: the grader scores it 0.0 and records why.

**CHAMP**: ``{"source": "champ"}``, optionally ``"categories": ["Number-Theory", …]``. The 270 problems of CHAMP
(Mao, Kim and Zhou, 2024, "CHAMP: A Competition-level Dataset for Fine-Grained Analyses of LLMs' Mathematical
Reasoning Capabilities"), read with ``champ_dataset.load("v0")`` from the JSON file inside the PyPI package
``champ-dataset`` (nothing is downloaded). Its answers are free text (``"No"``, ``"376 and 625"``,
``"@@C(10, 5)@@, or equivalently @@252@@"``; ``@@`` marks math), graded by hand or by GPT-4 in the paper, so only
the problems whose answer math-verify can check are kept (:func:`champ_problems`): the answer is one number or one
``@@…@@`` expression; math-verify reads ``$<expression>$`` as a sympy object (not a string); the reading has no
undefined function (CHAMP's ``C(n, k)`` is ``\\binom{n}{k}`` in a LaTeX answer; ``f(x)=0``); and every variable
letter of the expression is a free symbol of the reading (this drops misreadings such as
``2^floor(n/2)*floor(n/2)!`` read as ``2`` and ``sum_(k=1)^n 1/k`` read as ``1``). 125 problems are kept. A split
is the first ``size`` kept problems not in ``exclude``, in file order shuffled with ``random.Random(seed)``.
``Item.id`` is CHAMP's problem id (``P_Combinatorics_6``), ``question`` the problem text, ``answer`` the reference
expression (``2^(n-1)``) and ``entry`` ``{source, problem_id, category, gold}`` with ``gold = "$<expression>$"``.

Score (CHAMP): math-verify (HuggingFace), ``verify(parse(gold), parse(answer))`` → 1.0 or 0.0. math-verify reads
LaTeX only between math delimiters (bare ``2^{n-1}`` reads as ``2``), so an answer with none of ``$``, ``\\(``,
``\\[``, ``\\boxed`` is passed as ``\\boxed{<answer>}``: what math-verify reads in the completion the default
harness took it from (given several boxes, math-verify reads them all together; the harness takes the last).
``None`` scores 0.0. The check runs in a child process (:mod:`grader.suites.isolated`: address space capped at
2 GiB) with math-verify's timeouts off (``parsing_timeout=None``, ``timeout_seconds=None``: they use ``SIGALRM``)
and one wall-clock limit instead (``check_timeout_s``, default 10 s): answers such as ``2^{2^{30}}`` or
``(n+1)^{10000}`` keep sympy busy for minutes (and gigabytes), partly inside C calls that no signal interrupts.
Past the limit the child is killed and the check raises ``isolated.ScorerTimeout`` (the grader scores the answer
0.0 and records why).
"""

from __future__ import annotations

import hashlib
import random
import re
from functools import lru_cache
from itertools import zip_longest
from typing import Any

import champ_dataset
import math_verify
import reasoning_gym
from reasoning_gym.factory import DATASETS
from sympy import Basic
from sympy.core.function import AppliedUndef

from grader.canonical import Canonical
from grader.suites import isolated
from grader.suites.base import Item, register_suite
from grader.suites.reasoning_gym import canonical_form, encode_entry, family_space, score_entry
from services.common.contracts import Harness
from services.common.errors import Unprocessable

SOURCES = ("reasoning_gym", "champ")
MATH_CATEGORIES = frozenset({"arithmetic", "algebra", "geometry", "probability"})
_PARAMS = {"reasoning_gym": ("source", "tasks", "config"), "champ": ("source", "categories")}
_DRAWS_PER_ITEM = 20
_MIN_DRAWS = 1000
_SINGLE_EXPRESSION = re.compile(r"\s*(?:@@([^@]+)@@|(-?\d+))\s*")
_VARIABLE_LETTERS = re.compile(r"[A-Za-z]+(?![A-Za-z(])")  # letter runs not naming a function (sqrt(, C(, floor()
_MATH_DELIMITERS = re.compile(r"\$|\\\(|\\\[|\\boxed")


@lru_cache(maxsize=1)
def math_families() -> tuple[str, ...]:
    """The reasoning-gym families this suite accepts, sorted: those of its math categories (27 in reasoning-gym 0.1.25)."""
    return tuple(sorted(name for name, (cls, _config) in DATASETS.items() if cls.__module__.split(".")[1] in MATH_CATEGORIES))


@lru_cache(maxsize=1)
def champ_problems() -> tuple[dict[str, str], ...]:
    """The CHAMP problems math-verify can check (module docstring), in file order: ``{problem_id, category,
    question, answer, gold}``."""
    kept = []
    for problem in champ_dataset.load("v0").problems.values():
        match = _SINGLE_EXPRESSION.fullmatch(problem.raw_answer)
        if match is None:
            continue
        expression = match.group(1) or match.group(2)
        gold = f"${expression}$"
        reading = math_verify.parse(gold, parsing_timeout=None)  # the package's own data: no timeout needed
        if not reading or not isinstance(reading[0], Basic) or reading[0].atoms(AppliedUndef):
            continue
        letters = {c for run in _VARIABLE_LETTERS.findall(expression) for c in run}
        if letters <= {str(s) for s in reading[0].free_symbols}:
            kept.append({"problem_id": problem.identifier, "category": problem.category, "question": problem.text, "answer": expression, "gold": gold})
    return tuple(kept)


def _champ_chosen(categories: list[str] | None) -> list[dict[str, str]]:
    """The kept CHAMP problems of ``categories`` (``None``: all), in file order."""
    return [p for p in champ_problems() if categories is None or p["category"] in categories]


def _family_seed(seed: int, family: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{family}".encode()).digest()[:8], "big")


@lru_cache(maxsize=4096)
def _gold(text: str) -> list[Any]:
    return math_verify.parse(text, parsing_timeout=None)


def _verify(gold: str, answer: str) -> bool:
    """math-verify's verdict on ``answer`` against ``gold`` (run in a child process: :meth:`MathSuite.score`)."""
    return bool(math_verify.verify(_gold(gold), math_verify.parse(answer, parsing_timeout=None), timeout_seconds=None))


@register_suite
class MathSuite:
    """Math word and competition problems; the default harness asks for the final answer in ``\\boxed{}``, greedy decoding."""

    name = "math"
    default_harness = Harness(
        system_prompt="Solve the problem step by step, then write the final answer as \\boxed{answer}.",
        user_template="{{ question }}",
        max_tokens=512,
        temperature=0.0,
        answer_extraction="boxed",
    )

    def __init__(self, *, check_timeout_s: float = 10.0) -> None:
        """``check_timeout_s``: wall-clock seconds for one scoring call (a family's scorer, or math-verify's check of a CHAMP answer)."""
        self.check_timeout_s = check_timeout_s

    def check_params(self, params: dict[str, Any]) -> None:
        source = params.get("source")
        if source not in SOURCES:
            raise Unprocessable(f"suite.params.source must be one of: {', '.join(SOURCES)}", field="suite.params.source")
        for key in params:
            if key not in _PARAMS[source]:
                raise Unprocessable(f"math source {source!r} takes no parameter {key!r}; allowed: {', '.join(_PARAMS[source])}", field=f"suite.params.{key}")
        if source == "champ":
            self._check_categories(params.get("categories"))
        else:
            self._check_families(params.get("tasks"), params.get("config", {}))

    @staticmethod
    def _check_categories(categories: Any) -> None:
        if categories is None:
            return
        known = sorted({p["category"] for p in champ_problems()})
        if not isinstance(categories, list) or not categories or not all(c in known for c in categories) or len(set(categories)) != len(categories):
            raise Unprocessable(f"suite.params.categories must be a non-empty list of distinct CHAMP categories: {', '.join(known)}",
                                field="suite.params.categories")

    @staticmethod
    def _check_families(tasks: Any, config: Any) -> None:
        if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks) or len(set(tasks)) != len(tasks):
            raise Unprocessable("suite.params.tasks must be a non-empty list of distinct reasoning-gym families", field="suite.params.tasks")
        unknown = [t for t in tasks if t not in math_families()]
        if unknown:
            raise Unprocessable(f"not reasoning-gym math families: {', '.join(unknown)}; available: {', '.join(math_families())}", field="suite.params.tasks")
        if not isinstance(config, dict) or not all(f in tasks and isinstance(c, dict) and not {"seed", "size"} & c.keys() for f, c in config.items()):
            raise Unprocessable("suite.params.config must map families listed in tasks to their config (without seed and size)", field="suite.params.config")
        for family in tasks:
            try:
                reasoning_gym.create_dataset(family, seed=0, size=1, **config.get(family, {}))[0]
            except Exception as exc:  # reasoning-gym raises several kinds (TypeError, AssertionError, ValueError) for bad configs
                field = "suite.params.config" if family in config else "suite.params.tasks"
                raise Unprocessable(f"reasoning-gym rejected {family} with {config.get(family, {})}: {exc}", field=field) from exc

    def generate(self, params: dict[str, Any], seed: int, size: int, *, split: str, exclude: frozenset[str] = frozenset()) -> list[Item]:
        """``size`` items drawn deterministically from ``seed`` (module docstring), none whose question is in ``exclude``;
        raises ``Unprocessable`` (field ``suite.splits.<split>.size``) if there are not that many."""
        if params["source"] == "champ":
            return self._champ_items(params.get("categories"), seed, size, split, exclude)
        return self._family_items(params["tasks"], params.get("config", {}), seed, size, split, exclude)

    @staticmethod
    def _family_items(tasks: list[str], configs: dict[str, dict[str, Any]], seed: int, size: int, split: str, exclude: frozenset[str]) -> list[Item]:
        seen = set(exclude)
        groups = []
        for i, family in enumerate(tasks):
            quota = size // len(tasks) + (i < size % len(tasks))
            config, family_seed = configs.get(family, {}), _family_seed(seed, family)
            picked: list[dict[str, Any]] = []
            for entry in reasoning_gym.create_dataset(family, seed=family_seed, size=max(_MIN_DRAWS, _DRAWS_PER_ITEM * quota), **config):
                if len(picked) == quota:
                    break
                if entry["question"] not in seen:
                    seen.add(entry["question"])
                    picked.append({**encode_entry(entry), "source": "reasoning_gym", "config": config, "seed": family_seed})
            if len(picked) < quota:
                raise Unprocessable(f"{family}: only {len(picked)} of the {quota} distinct {split} items it owes were found outside the excluded set; "
                                    "ask for fewer or widen its config", field=f"suite.splits.{split}.size")
            groups.append(picked)
        entries = [e for row in zip_longest(*groups) for e in row if e is not None]
        return [Item(id=f"{split}-{n:05d}", question=e["question"], answer=str(e["answer"]), entry=e) for n, e in enumerate(entries)]

    @staticmethod
    def _champ_items(categories: list[str] | None, seed: int, size: int, split: str, exclude: frozenset[str]) -> list[Item]:
        problems = _champ_chosen(categories)
        random.Random(seed).shuffle(problems)
        left = [p for p in problems if p["question"] not in exclude]
        if size > len(left):
            raise Unprocessable(f"champ: only {len(left)} {split} problems are left outside the other splits; ask for at most that many",
                                field=f"suite.splits.{split}.size")
        return [Item(id=p["problem_id"], question=p["question"], answer=p["answer"],
                     entry={"source": "champ", "problem_id": p["problem_id"], "category": p["category"], "gold": p["gold"]}) for p in left[:size]]

    def score(self, answer: str | None, item: Item) -> float:
        """Score in [0, 1]: the family's reasoning-gym scorer, or math-verify's verdict for CHAMP, 1.0 or 0.0 (module
        docstring). Raises what the scorer raises, ``isolated.ScorerTimeout`` past ``check_timeout_s`` or
        ``isolated.ScorerDied``."""
        entry = item.entry
        if entry["source"] == "champ":
            if answer is None:
                return 0.0
            text = answer if _MATH_DELIMITERS.search(answer) else f"\\boxed{{{answer}}}"
            return 1.0 if isolated.call(_verify, entry["gold"], text, timeout_s=self.check_timeout_s) else 0.0
        return score_entry(answer, entry, timeout_s=self.check_timeout_s)

    def canonical(self, item: Item) -> Canonical | None:
        """A reasoning-gym item's statement without its family's instruction text; ``None`` for CHAMP, whose
        questions carry no instruction (the harness adds it), so the n-gram audit reads them whole."""
        return None if item.entry["source"] == "champ" else canonical_form(item)

    def item_space(self, params: dict[str, Any]) -> tuple[int, bool]:
        """CHAMP: the kept problems of the chosen categories (exact). reasoning-gym: the sum over the families of
        their estimates (:func:`grader.suites.reasoning_gym.family_space`)."""
        if params["source"] == "champ":
            return len(_champ_chosen(params.get("categories"))), True
        configs = params.get("config", {})
        return sum(family_space(f, configs.get(f, {})) for f in params["tasks"]), False
