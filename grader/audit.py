"""Contamination audit of a final submission: n-gram overlap between the run's uploaded datasets and the
hidden test split.

Text is normalized (Unicode NFKC, lower case) and split into word and punctuation tokens, so that "31 - 8"
and "31 + 8" stay different (operators matter in math and code); an arithmetic expression is one token, so that an
n-gram never ends inside one ("…problem: 73 - 46" would be shared by "…problem: 73 - 46 =" and by the different
problem "…problem: 73 - 46 + 37 =", and flag the one when the other was planted). An item's n-grams are its windows of
``ngram`` tokens (13 by default, after Brown et al. 2020, "Language Models are Few-Shot Learners", app. C);
an item shorter than that is one n-gram, itself. An item's question is compared, and its reference answer
too when that is at least ``ngram`` tokens long (a HumanEval solution without its docstring is still the
test item). N-grams that also occur in the benchmark's public training pool are not evidence (the agent may train on the pool, and templated suites share long prefixes
between items) and are left out. A test item is flagged when at least ``min_overlap`` of its remaining
n-grams occur in one row of the run's datasets (every string of the row joined); an item with none left
cannot be told apart from the training pool and is not flagged.

N-grams miss a copy whose instruction text was reworded ("Compute 15 - 43 - 75." for "State the final answer to
the following arithmetic problem: 15 - 43 - 75 ="). So a test item is flagged as well when its **canonical
form** (:mod:`grader.canonical`, given by the suite: the expression of an arithmetic item, the statement without
its instruction, a function's ``def`` line) occurs contiguously in a row read in the form's view (an expression
as a whole one: :func:`grader.canonical.occurrences`). A canonical form
that occurs in a public text read the same way is no evidence either, and is left out like a public n-gram.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from grader.canonical import VIEWS, Canonical, occurrences, public_forms, text_tokens
from grader.schemas import ContaminationReport
from grader.suites import Item
from services.common.contracts import AuditSettings

tokens = text_tokens  # the audit's normalization: NFKC, lower case, words, single punctuation marks, whole expressions


def _ngrams(toks: list[str], n: int) -> set[tuple[str, ...]]:
    if len(toks) <= n:
        return {tuple(toks)} if toks else set()
    return {tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)}


def row_text(row: Any) -> str:
    """Every string in a dataset row (messages' contents, prompt, completion, chosen, rejected…), joined."""
    if isinstance(row, str):
        return row
    if isinstance(row, dict):
        return "\n".join(row_text(v) for v in row.values())
    if isinstance(row, list):
        return "\n".join(row_text(v) for v in row)
    return ""


def audit(test_items: list[Item], rows: Iterable[Any], settings: AuditSettings, *, public: Iterable[str] = (), datasets: int = 0,
          canonical: Callable[[Item], Canonical | None] | None = None) -> ContaminationReport:
    """Flag the test items whose question (or long answer) overlaps a dataset row, or whose canonical form occurs in
    one (see the module docstring). ``public``: the texts (questions and answers) of what agents may see, whose
    n-grams and canonical forms are no evidence; ``canonical``: the suite's canonical form of an item (``None``: n-grams
    only). Cost: one pass over the tokens of ``public`` and of the rows per distinct n-gram or form length and view."""
    units = _units(test_items, settings.ngram)
    wanted: dict[int, dict[tuple[str, ...], list[int]]] = {}  # n -> n-gram -> indexes of the units having it
    for index, (_item, toks) in enumerate(units):
        for gram in _ngrams(toks, settings.ngram):
            wanted.setdefault(len(gram), {}).setdefault(gram, []).append(index)
    forms: dict[str, dict[int, dict[tuple[str, ...], list[int]]]] = {}  # view -> length -> form -> test item indexes
    for index, item in enumerate(test_items):
        form = canonical(item) if canonical else None
        if form is not None:
            forms.setdefault(form.view, {}).setdefault(len(form.tokens), {}).setdefault(form.tokens, []).append(index)
    public = list(public)
    for text in public:  # drop what the public training pool contains as well
        toks = tokens(text)
        for n, grams in wanted.items():
            for gram in occurrences("text", toks, n):
                grams.pop(gram, None)
    for form in public_forms((Canonical(view, gram) for view, by_length in forms.items() for found in by_length.values() for gram in found), public):
        forms[form.view][len(form.tokens)].pop(form.tokens, None)
    sizes = [0] * len(units)
    for grams in wanted.values():
        for indexes in grams.values():
            for index in indexes:
                sizes[index] += 1
    flagged: set[int] = set()
    by_form: set[int] = set()
    count = 0
    for row in rows:
        count += 1
        text = row_text(row)
        toks = tokens(text)
        hits: dict[int, int] = {}
        for n, grams in wanted.items():
            for gram in occurrences("text", toks, n):  # each distinct n-gram of a row once
                for index in grams.get(gram, ()):
                    hits[index] = hits.get(index, 0) + 1
        flagged.update(units[i][0] for i, h in hits.items() if h / sizes[i] >= settings.min_overlap)
        for view, by_length in forms.items():
            view_toks = toks if view == "text" else VIEWS[view](text)
            for n, found in by_length.items():
                for gram in occurrences(view, view_toks, n):
                    by_form.update(found.get(gram, ()))
    flagged |= by_form
    return ContaminationReport(contaminated=bool(flagged), flagged_items=len(flagged), items=len(test_items), datasets=datasets, rows=count,
                               ngram=settings.ngram, min_overlap=settings.min_overlap, flagged_by_canonical_form=len(by_form))


def _units(test_items: list[Item], ngram: int) -> list[tuple[int, list[str]]]:
    """What is compared, as ``(item index, tokens)``: each item's question, and its reference answer when that is
    at least ``ngram`` tokens long (a code solution, a proof; a short answer such as ``-9`` is no evidence)."""
    units = []
    for index, item in enumerate(test_items):
        units.append((index, tokens(item.question)))
        answer = tokens(item.answer)
        if len(answer) >= ngram:
            units.append((index, answer))
    return units
