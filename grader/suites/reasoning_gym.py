"""The ``reasoning_gym`` suite: procedural task families from reasoning-gym, scored by their own scorers.

``params`` = ``{"task": "<family>", **family_config}``, e.g. ``{"task": "chain_sum", "min_terms": 2,
"max_terms": 3, "min_digits": 1, "max_digits": 2}``. Items come from ``reasoning_gym.create_dataset``
with the split's seed.

``Item.entry`` is the reasoning-gym entry (``question``, ``answer``, ``metadata``) as :func:`encode_entry` writes
it, plus ``config`` (the params without ``task``). The grader stores entries as JSON, which has no
tuples, sets, ``Fraction`` values or non-string keys, and family scorers compare against them
(``arc_agi`` and ``rearc`` compare the answer grid with a tuple of tuples: a grid that became a list of lists
matches nothing); :func:`encode_entry` tags those values so that :func:`decode_entry` gives back an equal entry.
Score: the family's ``score_answer`` on a dataset built with the item's config, as ``CompositeDataset.score_answer``
forwards it (reasoning_gym/composite.py): families such as ``decimal_arithmetic`` (its tolerance) read their config
when scoring. (``composite`` itself is no task here: its config holds ``DatasetSpec`` objects, which params
cannot.) The scorer runs in a child process (:mod:`grader.suites.isolated`) with a wall-clock limit
(``score_timeout_s``, default 10 s): ``countdown``'s scorer spends over a minute on ``1e999999``. ``None`` (nothing
extracted) scores 0.0; an answer on which the scorer raises or overruns raises (the grader scores it 0.0 and
records why).
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from numbers import Integral, Real
from typing import Any

import reasoning_gym
from reasoning_gym.dataset import ProceduralDataset

from grader.canonical import Canonical, canonical_statement, template_clauses
from grader.suites import isolated
from grader.suites.base import Item, chao1, register_suite
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


_TAG = "__py__"  # the key that marks an encoded value; a plain dict holding it is encoded as a tagged "dict"
_SEQUENCES = {"tuple": tuple, "set": set, "frozenset": frozenset}


def encode_entry(value: Any) -> Any:
    """``value`` as plain JSON data that :func:`decode_entry` turns back into an equal value (of the same types).

    JSON values stay as they are; numbers and strings of other types that subclass them (``numpy.str_``,
    ``numpy.float64``, ``numpy.int64``) become Python's own; a tuple, set or frozenset becomes
    ``{"__py__": "tuple"|"set"|"frozenset", "v": [...]}``, a dict with a key other than a string (or with the key
    ``"__py__"``) ``{"__py__": "dict", "v": [[key, value], ...]}``, a ``Fraction`` ``{"__py__": "Fraction", "v":
    "3/4"}`` (likewise ``Decimal``), a ``complex`` ``{"__py__": "complex", "v": [re, im]}`` and a NaN or infinite float
    ``{"__py__": "float", "v": "nan"}`` (PostgreSQL's JSON has no NaN). Raises ``TypeError`` for any other type, so
    that a value JSON would change is never stored silently.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Fraction | Decimal):
        return {_TAG: type(value).__name__, "v": str(value)}
    if isinstance(value, Real):
        number = float(value)
        return number if math.isfinite(number) else {_TAG: "float", "v": repr(number)}
    if isinstance(value, complex):
        return {_TAG: "complex", "v": [encode_entry(value.real), encode_entry(value.imag)]}
    if isinstance(value, list):
        return [encode_entry(v) for v in value]
    if isinstance(value, tuple | set | frozenset):
        kind = next(name for name, cls in _SEQUENCES.items() if isinstance(value, cls))
        return {_TAG: kind, "v": [encode_entry(v) for v in value]}
    if isinstance(value, dict):
        if _TAG in value or not all(isinstance(k, str) for k in value):
            return {_TAG: "dict", "v": [[encode_entry(k), encode_entry(v)] for k, v in value.items()]}
        return {str(k): encode_entry(v) for k, v in value.items()}
    raise TypeError(f"cannot store a {type(value).__module__}.{type(value).__qualname__} losslessly as JSON: {value!r:.200}")


def decode_entry(value: Any) -> Any:
    """The value :func:`encode_entry` encoded (plain JSON, such as an entry stored before tagging, is returned as it is)."""
    if isinstance(value, list):
        return [decode_entry(v) for v in value]
    if not isinstance(value, dict):
        return value
    if _TAG not in value:
        return {k: decode_entry(v) for k, v in value.items()}
    kind, data = value[_TAG], value["v"]
    if kind in _SEQUENCES:
        return _SEQUENCES[kind](decode_entry(v) for v in data)
    if kind == "dict":
        return {decode_entry(k): decode_entry(v) for k, v in data}
    if kind == "complex":
        return complex(decode_entry(data[0]), decode_entry(data[1]))
    return {"Fraction": Fraction, "Decimal": Decimal, "float": float}[kind](data)


@lru_cache(maxsize=64)
def family_dataset(family: str, config_json: str) -> ProceduralDataset:
    """The reasoning-gym family's dataset with ``config_json`` (a JSON object of its config fields), whose
    ``score_answer`` scores the family's items."""
    return reasoning_gym.create_dataset(family, **json.loads(config_json))


def family_space(family: str, config: dict[str, Any]) -> int:
    """Estimated distinct questions of a family with ``config``: :func:`grader.suites.base.chao1` over ``SPACE_DRAWS``
    draws with seed 0."""
    return chao1(e["question"] for e in reasoning_gym.create_dataset(family, seed=0, size=SPACE_DRAWS, **config))


def _score_in_child(family: str, config_json: str, answer: str | None, entry: dict[str, Any]) -> float:
    return float(family_dataset(family, config_json).score_answer(answer, entry))


def score_entry(answer: str | None, entry: dict[str, Any], *, timeout_s: float) -> float:
    """The official score of ``answer`` for a stored reasoning-gym ``entry`` (:func:`encode_entry` plus ``config``):
    ``score_answer`` of the family's dataset (``metadata.source_dataset``) built with that config, given the decoded
    entry, in a child process (:func:`grader.suites.isolated.call`). An entry without ``config`` is scored with the
    default config. Raises what the scorer raises, ``isolated.ScorerTimeout`` past ``timeout_s`` seconds, or
    ``isolated.ScorerDied``."""
    config_json = json.dumps(entry.get("config", {}), sort_keys=True)
    return isolated.call(_score_in_child, entry["metadata"]["source_dataset"], config_json, answer, decode_entry(entry), timeout_s=timeout_s)


@register_suite
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

    def __init__(self, *, score_timeout_s: float = 10.0) -> None:
        """``score_timeout_s``: wall-clock seconds for one call of a family's scorer."""
        self.score_timeout_s = score_timeout_s

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
                items.append(Item(id=f"{split}-{len(items):05d}", question=entry["question"], answer=str(entry["answer"]),
                                  entry={**encode_entry(entry), "config": config}))
                if len(items) == size:
                    return items
            want *= 2
        raise Unprocessable(f"{task}: only {len(items)} distinct {split} items exist outside the excluded set; ask for fewer", field=f"suite.splits.{split}.size")

    def score(self, answer: str | None, item: Item) -> float:
        """The task's official score of ``answer`` (:func:`score_entry`); 0.0 for ``None``. Raises what the scorer
        raises, or ``isolated.ScorerTimeout``/``ScorerDied``."""
        if answer is None:
            return 0.0
        return score_entry(answer, item.entry, timeout_s=self.score_timeout_s)

    def canonical(self, item: Item) -> Canonical | None:
        """The item's statement without its family's instruction text (:func:`canonical_form`)."""
        return canonical_form(item)

    def item_space(self, params: dict[str, Any]) -> tuple[int, bool]:
        """Estimated distinct questions (:func:`family_space`)."""
        return family_space(params["task"], {k: v for k, v in params.items() if k != "task"}), False
