"""A benchmark task's three splits, and the rule that keeps the hidden one hidden.

**Rule: no answer a run key can obtain is a function of the test split or of its seed** (only the final,
aggregate grade of a submission is). So the public splits are drawn from public inputs alone, and the hidden
split is drawn last, around them:

- **validation** (public): ``size`` items from the validation seed.
- **training pool** (public): ``size`` items from the train seed, without the validation questions.
- **test** (hidden): ``size`` items from the hidden seed (:func:`test_seed`: the grader's secret mixed with the
  suite spec), without any item of the two public splits, up to its wording (same question, or same canonical
  form: :mod:`grader.canonical`).

The training pool never skips a test item. It used to, and since the train seed is public, anyone who
regenerated the suite's raw stream and compared it with ``GET /v1/suite/train-sample`` saw exactly which items
were skipped: the hidden ones, answers included. Decontamination by exclusion leaks whenever the excluded set is
observable, so it happens on the hidden side only: the test split depends on the public ones, never the reverse,
and no test item's answer is public. The price is the test split's distribution: the task's natural one without
the public items. Where the public splits hold a large share of what the task draws (a small sub-space drawn
often, such as one-digit sums, or a fixed dataset such as HumanEval), :func:`split_report` measures that share
for the operator (``crucible admin check-benchmark``) and warns. The contamination audit (:mod:`grader.audit`)
leaves the public items' n-grams and canonical forms out, so training on them is never evidence of contamination.

Where a task has few distinct items (:func:`item_space` under ``ENUMERABLE_FACTOR`` × the three split sizes), an
agent can enumerate them all (and knows the test split lies among those that are not public), so no seed keeps it
secret: registering such a task, and checking its file, warns.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable

from pydantic import BaseModel, Field

from grader.canonical import Canonical, canonical_key, public_forms
from grader.suites import Item, Suite, get_suite, suite_canonical
from services.common.contracts import GradingSpec
from services.common.errors import Unprocessable

ENUMERABLE_FACTOR = 10  # a task with fewer distinct items than this many times its split sizes is enumerable
SKEW_WARNING_SHARE = 0.2  # from this public share of natural test draws on, the test split's distribution is called skewed
PROBES = 3  # natural test draws measured for the operator's report, with seeds that stand in for the hidden one


def test_seed(secret: int, spec: GradingSpec) -> int:
    """The hidden test seed: ``secret`` (the grader's configuration alone holds it) mixed with the suite spec, so
    two tasks of one deployment get unrelated test splits. First 4 bytes of SHA-256 of ``"<secret>:<suite JSON>"``."""
    return _mixed_seed(str(secret), spec)


def _mixed_seed(label: str, spec: GradingSpec) -> int:
    return int.from_bytes(hashlib.sha256(f"{label}:{spec.suite.model_dump_json()}".encode()).digest()[:4], "big")


def probe_seeds(spec: GradingSpec) -> list[int]:
    """:data:`PROBES` public seeds that stand in for the hidden one in the operator's report: the same mixing as
    :func:`test_seed` under the labels ``probe-0``, ``probe-1``… (unrelated to the files' small train and validation seeds)."""
    return [_mixed_seed(f"probe-{i}", spec) for i in range(PROBES)]


def validation_split(spec: GradingSpec) -> list[Item]:
    """The visible validation items: drawn from the validation seed (1 if the file gives none)."""
    val = spec.suite.splits.validation
    return get_suite(spec.suite.name).generate(spec.suite.params, val.seed or 1, val.size, split="validation")


def training_pool(spec: GradingSpec, validation: Iterable[Item]) -> list[Item]:
    """The public training pool: drawn from the train seed (0 if none), without the validation questions. A
    function of the benchmark file alone, never of the test split."""
    train = spec.suite.splits.train
    return get_suite(spec.suite.name).generate(spec.suite.params, train.seed or 0, train.size, split="train",
                                               exclude=frozenset(it.question for it in validation))


def item_key(suite: Suite, item: Item) -> str:
    """What identifies ``item`` up to its wording: its canonical form, or its question (:func:`grader.canonical.canonical_key`)."""
    return canonical_key(suite_canonical(suite, item), item.question)


def test_split(spec: GradingSpec, seed: int, public: list[Item]) -> list[Item]:
    """The hidden test items: drawn from ``seed``, without the ``public`` items (validation and training pool) up to
    their wording, nor an item whose canonical form a public text holds (``8 - 3 =`` where a public item asks for
    ``-(8 - 3) * 9``: :func:`grader.canonical.public_forms`), so a reworded copy of any hidden item is evidence the
    audit can flag. Raises ``Unprocessable`` (field ``suite.splits.test.size``) if the task has too few other items."""
    suite = get_suite(spec.suite.name)
    size = spec.suite.splits.test.size
    questions, keys = frozenset(it.question for it in public), {item_key(suite, it) for it in public}
    texts = [t for it in public for t in (it.question, it.answer)]
    checked: dict[Canonical, bool] = {}  # a drawn item's form -> whether a public text holds it
    want, before = size, -1
    while True:  # draw more until enough are left once the reworded public items are out
        drawn = [(it, suite_canonical(suite, it)) for it in suite.generate(spec.suite.params, seed, want, split="test", exclude=questions)]
        new = {form for _, form in drawn if form is not None and form not in checked}
        held = public_forms(new, texts) if new else set()
        checked.update({form: form in held for form in new})
        kept = [it for it, form in drawn if canonical_key(form, it.question) not in keys and (form is None or not checked[form])]
        if len(kept) >= size:
            return kept[:size]
        if len(kept) <= before:  # drawing more gave nothing new: the task has no more items outside the public ones
            raise Unprocessable(f"{spec.task}: only {len(kept)} test items exist outside the public splits; the test split asks for {size}",
                                field="suite.splits.test.size")
        before = len(kept)
        want += 2 * (size - len(kept))


def collection_split(spec: GradingSpec, seed: int, accepted: list[Item], public: list[Item]) -> list[Item]:
    """The hidden test items drawn from an imported collection's ``accepted`` tasks: shuffled by ``seed``, without the
    ``public`` items' questions, the first ``suite.splits.test.size``. Raises ``Unprocessable`` (field
    ``suite.splits.test.size``) when fewer are left."""
    questions = {it.question for it in public}
    left = [it for it in accepted if it.question not in questions]
    random.Random(seed).shuffle(left)
    size = spec.suite.splits.test.size
    if len(left) < size:
        raise Unprocessable(f"the collection {spec.suite.splits.test.collection!r} has {len(left)} accepted tasks outside the public splits; "
                            f"the test split asks for {size}", field="suite.splits.test.size")
    return left[:size]


class ItemSpace(BaseModel):
    """How many distinct items a suite's params allow."""

    count: int = Field(description="Distinct items: exact for a fixed dataset, a Chao1 estimate for a generator.")
    exact: bool


def item_space(spec: GradingSpec) -> ItemSpace:
    """The task's item space: the suite's ``item_space(params) -> (count, exact)``."""
    count, exact = get_suite(spec.suite.name).item_space(spec.suite.params)
    return ItemSpace(count=count, exact=exact)


class SplitReport(BaseModel):
    """What an operator should know about a task's splits before agents see them (public inputs only)."""

    task: str
    suite: str
    item_space: ItemSpace
    split_items: int = Field(description="train + validation + test sizes")
    enumerable: bool = Field(description=f"fewer distinct items than {ENUMERABLE_FACTOR}× the split sizes: the test split cannot stay secret")
    public_items: int = Field(description="distinct items (up to wording) of the training pool and the validation split")
    public_share_of_draws: float = Field(description="share of a natural test draw that is public (up to wording), so left out of the test split; "
                                                     "measured on natural draws with public seeds (probe_seeds), never the hidden one")
    warnings: list[str]


def enumerable_warning(spec: GradingSpec, space: ItemSpace) -> str | None:
    """The warning for a task whose item space is small enough to enumerate, ``None`` otherwise (and for a test split
    drawn from an imported collection, which no agent can enumerate)."""
    if spec.suite.splits.test.collection:
        return None
    total = _split_items(spec)
    if space.count >= ENUMERABLE_FACTOR * total:
        return None
    about = "" if space.exact else "about "
    return (f"task {spec.task!r}: {spec.suite.name} {spec.suite.params} has {about}{space.count} distinct items, under {ENUMERABLE_FACTOR}× its "
            f"{total} split items: an agent can enumerate them, so its test split cannot stay secret")


def _split_items(spec: GradingSpec) -> int:
    splits = spec.suite.splits
    return splits.train.size + splits.validation.size + splits.test.size


def split_report(spec: GradingSpec) -> SplitReport:
    """Measure a task's splits without the hidden seed: its item space, its public items, and the share of natural
    test draws (seeds :func:`probe_seeds`) that are public and so are left out of the test split. Raises
    ``Unprocessable`` naming the field if a split cannot be drawn at its size."""
    suite = get_suite(spec.suite.name)
    validation = validation_split(spec)
    public = validation + training_pool(spec, validation)
    keys = {item_key(suite, it) for it in public}
    space = item_space(spec)
    if spec.evaluator is not None:
        return SplitReport(task=spec.task, suite=spec.suite.name, item_space=space, split_items=_split_items(spec), enumerable=False,
                           public_items=len(keys), public_share_of_draws=1.0,
                           warnings=[f"task {spec.task!r}: the evaluator track's own task; its items are the candidates' opaque names, public by "
                                     "design: what stays hidden is the sealed targets' scores"])
    if collection := spec.suite.splits.test.collection:
        return SplitReport(task=spec.task, suite=spec.suite.name, item_space=space, split_items=_split_items(spec), enumerable=False,
                           public_items=len(keys), public_share_of_draws=0.0,
                           warnings=[f"task {spec.task!r}: the test split is drawn from the imported collection {collection!r}, which only the "
                                     "grader holds; its size is checked when the benchmark is loaded"])
    size = min(spec.suite.splits.test.size, space.count) if space.exact else spec.suite.splits.test.size
    seeds = probe_seeds(spec)
    draws = [item_key(suite, it) in keys for seed in seeds for it in suite.generate(spec.suite.params, seed, size, split="test")]
    share = sum(draws) / max(1, len(draws))
    test_split(spec, seeds[0], public)  # a test split of this size can be drawn around the public ones
    enumerable = enumerable_warning(spec, space)
    warnings = [enumerable] if enumerable else []
    if share >= SKEW_WARNING_SHARE:
        warnings.append(f"task {spec.task!r}: {share:.0%} of natural test draws are public items; the test split is drawn from the others, "
                        "so its distribution differs from the task's (smaller public splits or a wider config keep it closer)")
    return SplitReport(task=spec.task, suite=spec.suite.name, item_space=space, split_items=_split_items(spec),
                       enumerable=enumerable is not None, public_items=len(keys), public_share_of_draws=share, warnings=warnings)
