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

**Harness archives** (:func:`audit_harnesses`) are read the same way, each text file of an archive a row: an archive that
carries hidden test items (a suite's answer key) is flagged as a dataset is. It is flagged as well when it carries a
suite's **solution material** (:func:`solution_material`), texts public or not that solve hidden items without a model:
a hidden item's gold patch (the fixed code with its context, ``entry["patch"]``), the swe projects' released library
files (a harness that copies them over ``/app`` undoes every bug), the terminal families' answer code (the functions
that compute each instance's expected output). A piece of material counts as carried when ``min_overlap`` of its
n-grams occur in the archive's files together (so a copy split over files, reformatted or recased still counts);
material of fewer than :data:`MIN_MATERIAL_NGRAMS` n-grams (an ``__init__.py`` of two imports) is no evidence. Unlike
a dataset's, public n-grams are not left out here: the material is public by nature, and carrying it is the fault.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from backports import tarfile  # the PEP 706 filters on every Python 3.11 (Debian's 3.11.2 has none)

from grader.canonical import VIEWS, Canonical, occurrences, public_forms, text_tokens
from grader.harness_archives import MAX_MEMBERS, MAX_UNPACKED_BYTES
from grader.schemas import ContaminationReport
from grader.suites import Item
from services.common import untrusted
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


# --------------------------------------------------------------------------- harness archives

MIN_MATERIAL_NGRAMS = 20
"""A piece of solution material with fewer n-grams than this is too short to tell a copy from a coincidence."""
MAX_ARCHIVE_FILE_BYTES = 4 * 1024 * 1024
"""An archive's file larger than this is not read (no source file or answer key of a suite is); nor is a binary one."""


@dataclass(frozen=True)
class Material:
    """A text that solves hidden items without a model: ``kind`` says whose (``swe project toolz: released library``),
    ``name`` which one (a file, a family, an item) and ``text`` is it."""

    kind: str
    name: str
    text: str


def solution_material(suite: str, params: dict[str, Any], test_items: Iterable[Item]) -> list[Material]:
    """The solution material of suite ``suite`` (with ``params``) and its hidden ``test_items``: each item's gold patch
    (the post-image of its hunks: context and added lines), and by suite the swe projects' released library files (those
    of ``params["projects"]``, default all, where prepared on this host) and the terminal families' answer code (each
    family's function). Empty for a suite with none."""
    material = [Material("gold patch of a hidden item", item.id, _post_image(item.entry["patch"]))
                for item in test_items if isinstance(item.entry.get("patch"), str)]
    if suite == "swe":
        from grader.suites.swe_mutants import PROJECTS  # the suites' own modules: imported only where the suite is audited

        for name in params.get("projects") or PROJECTS:
            project = PROJECTS.get(name)
            if project is not None and project.repo.is_dir():
                material += [Material(f"swe project {name}: released library", str(path), (project.repo / path).read_text(errors="replace"))
                             for path in project.modules()]
    elif suite == "terminal":
        from grader.suites.terminal_families import FAMILIES

        for name, family in FAMILIES.items():
            fn = family[-1] if isinstance(family, tuple) else family
            material.append(Material("terminal family answer code", name, inspect.getsource(fn)))
    return material


def _post_image(patch: str) -> str:
    """A unified diff's hunks as they read after it is applied (context and added lines)."""
    return "\n".join(line[1:] for line in patch.splitlines() if line[:1] in (" ", "+") and not line.startswith("+++"))


def archive_files(data: bytes) -> list[tuple[str, str]]:
    """The text files of a harness archive (a ``.tar.gz`` validated on upload, :mod:`grader.harness_archives`) as
    ``(path, text)``: regular files of at most :data:`MAX_ARCHIVE_FILE_BYTES` that decode as UTF-8. Nothing is written
    to disk or run. A damaged archive has no files."""
    files = []
    try:
        with untrusted.open_tar(data, max_stream_bytes=untrusted.stream_cap(MAX_UNPACKED_BYTES, MAX_MEMBERS), what="a harness archive") as tar:
            for member in tar:
                if member.isfile() and member.size <= MAX_ARCHIVE_FILE_BYTES:
                    try:
                        files.append((member.name, tar.extractfile(member).read().decode("utf-8")))  # type: ignore[union-attr]
                    except UnicodeDecodeError:
                        continue
    except (tarfile.TarError, OSError, EOFError, untrusted.UnsafeArchive):
        return files
    return files


def audit_harnesses(archives: Iterable[tuple[str, bytes]], material: Iterable[Material], settings: AuditSettings, *,
                    test_items: Sequence[Item] = (), public: Iterable[str] = (),
                    canonical: Callable[[Item], Canonical | None] | None = None) -> list[str]:
    """Why harness archives are flagged (see the module docstring): for each ``(id, .tar.gz)`` of ``archives``, one
    reason per kind of material it carries (``"har_…: <kind>: <how many> (<the first few>)"``) and one for the hidden
    ``test_items`` its files hold (:func:`audit`, each file a row; ``public`` and ``canonical`` as there); empty when
    none carries any. Reasons are the operator's to read. Cost: the material tokenized once, each archive's text once."""
    pieces = [(piece, grams) for piece in material if len(grams := _ngrams(tokens(piece.text), settings.ngram)) >= MIN_MATERIAL_NGRAMS]
    public = list(public)
    reasons = []
    for archive_id, data in archives:
        texts = [text for _path, text in archive_files(data)]
        present: set[tuple[str, ...]] = set()
        for text in texts:
            toks = tokens(text)
            present.update(tuple(toks[i:i + settings.ngram]) for i in range(len(toks) - settings.ngram + 1))
        carried: dict[str, list[str]] = {}
        for piece, grams in pieces:
            if len(grams & present) / len(grams) >= settings.min_overlap:
                carried.setdefault(piece.kind, []).append(piece.name)
        reasons += [f"{archive_id}: {kind}: {len(names)} ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})" for kind, names in carried.items()]
        if test_items and texts:
            report = audit(list(test_items), texts, settings, public=public, canonical=canonical)
            if report.contaminated:
                reasons.append(f"{archive_id}: hidden test items in its files: {report.flagged_items} of {report.items}")
    return reasons
