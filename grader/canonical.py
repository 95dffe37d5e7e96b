"""Canonical forms of items: what stays of a task when its wording changes.

A suite's item is usually a fixed instruction wrapped around the task proper ("State the final answer to the
following arithmetic problem: 15 - 43 - 75 ="). A copy of a hidden test item with the instruction reworded
("Compute 15 - 43 - 75.") shares almost no 13-gram with it, so the n-gram audit alone misses it. A suite
therefore gives each item a **canonical form**: a short token sequence in one of the :data:`VIEWS` that any
copy of the item contains, contiguously (and, in the math view, as a whole expression: :func:`occurrences`),
when the copy is read in the same view:

- ``"math"`` (:func:`math_tokens`): numbers, operators and the one-letter variables next to them, nothing else:
  the expression of an arithmetic item, whatever sentence surrounds it.
- ``"text"`` (:func:`text_tokens`): normalized words, punctuation and whole expressions (the audit's tokens): a problem statement
  without its instruction text, a function's ``def`` line.

The instruction text of a generated family is learned from the family itself (:func:`template_clauses`):
the clauses that recur verbatim across many of its items. Canonical forms are used by the contamination audit
(:mod:`grader.audit`) and by the operator's split report (:mod:`grader.splits`); a form too short to be
evidence is no form at all (``None``): in the math view, fewer than two numbers, or a list of numbers with no operator
between them and fewer than :data:`MIN_DIGITS` digits ("4, 6" occurs by chance in many texts); in the text view,
fewer than :data:`MIN_TEXT_TOKENS` tokens. An expression is evidence however short ("4 - 5 - 3"): it must occur as a
whole expression, which no other text holds by chance; a copy whose own data holds it has the hidden item, whatever
the instruction around it says.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

MIN_DIGITS = 4  # a list of numbers "4, 6" is no evidence of copying (texts hold such pairs by chance); "760, 368" is
MIN_TEXT_TOKENS = 6
# An arithmetic expression of numbers and binary operators ("73 - 46 + 37") is one token, so that no n-gram ends inside
# one: "73 - 46" cut from "... 73 - 46 + 37 =" is not the item "... 73 - 46 =". Else words and single punctuation marks.
_NUMBER = r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])"
_TEXT_TOKEN = re.compile(rf"{_NUMBER}(?:\s*[-+*/^%]\s*{_NUMBER})+|\w+|[^\w\s]")
_SPACE = re.compile(r"\s+")
# A number (thousands separators and a decimal part allowed: 1,234,567.5), an operator, or a word.
# A minus sign stuck to the digits after it, where no operand ends just before it, is the number's sign ("= -27").
_MATH_TOKEN = re.compile(r"(?:(?<![\w).])-)?\d+(?:,\d{3})*(?:\.\d+)?|[-+*/^%()<>]|[^\W\d_]+")
_MATH_SYMBOLS = str.maketrans({"−": "-", "–": "-", "×": "*", "·": "*", "÷": "/", "∗": "*"})
_OPERATORS = frozenset("-+*/^%()<>")
_BINARY = _OPERATORS - {"(", ")"}  # what continues an expression past a window (brackets may close around a whole one)
# Clause ends: sentence punctuation followed by white space, or line breaks.
_CLAUSE_END = re.compile(r"(?<=[.?!:;])\s+|\n+")


class Canonical(NamedTuple):
    """An item's canonical form: the view it is read in and its tokens in that view."""

    view: str
    tokens: tuple[str, ...]


def text_tokens(text: str) -> list[str]:
    """Normalized tokens: Unicode NFKC, lower case; an arithmetic expression (numbers joined by ``+ - * / ^ %``) as
    one token without its spaces (``"31 - 8 + 62"`` → ``"31-8+62"``), else words and single punctuation marks."""
    return [_SPACE.sub("", tok) for tok in _TEXT_TOKEN.findall(unicodedata.normalize("NFKC", text).lower())]


def _is_number(token: str) -> bool:
    return token.lstrip("-")[:1].isdigit()


def math_tokens(text: str) -> list[str]:
    """The math of ``text``: numbers (thousands separators dropped: ``1,234`` → ``1234``; a ``-`` stuck to the digits
    after it and to no operand before it is their sign: ``-27`` in ``= -27``, an operator in ``4-1``), the operators
    ``+ - * / ^ % ( ) < >`` (``−``, ``×``, ``÷`` read as ``-``, ``*``, ``/``) and one-letter words next to a number or
    an operator (variables: ``3 x + 5``). Other words, ``=``, ``?`` and sentence punctuation are dropped."""
    raw = _MATH_TOKEN.findall(unicodedata.normalize("NFKC", text.translate(_MATH_SYMBOLS)).lower())
    out = []
    for i, tok in enumerate(raw):
        if _is_number(tok):
            out.append(tok.replace(",", ""))
        elif tok in _OPERATORS or len(tok) == 1 and any(0 <= j < len(raw) and (_is_number(raw[j]) or raw[j] in _OPERATORS) for j in (i - 1, i + 1)):
            out.append(tok)
    return out


VIEWS: dict[str, Callable[[str], list[str]]] = {"text": text_tokens, "math": math_tokens}


def occurrences(view: str, toks: list[str], n: int) -> Iterator[tuple[str, ...]]:
    """The distinct windows of ``n`` tokens of ``toks`` (read in ``view``) that could be a whole canonical form. In the
    math view a window must be a whole expression, not part of a longer one: no binary operator just before or after
    it (``14 + 73`` occurs in ``Compute 14 + 73.`` and in ``gcd(14, 73)``, not in ``14 + 73 - 85``)."""
    seen: set[tuple[str, ...]] = set()
    for i in range(max(0, len(toks) - n + 1)):
        if view == "math" and ((i > 0 and toks[i - 1] in _BINARY) or (i + n < len(toks) and toks[i + n] in _BINARY)):
            continue
        gram = tuple(toks[i:i + n])
        if gram not in seen:
            seen.add(gram)
            yield gram


def public_forms(forms: Iterable[Canonical], texts: Iterable[str]) -> set[Canonical]:
    """Of ``forms``, those that occur in one of ``texts`` read in their view (:func:`occurrences`: in the math view, as a
    whole expression, a bracketed one included: ``8 - 3`` occurs in ``-(8 - 3) * 9``). A form that public texts hold is
    no evidence of copying: the hidden split holds no item of one (:func:`grader.splits.test_split`), and the audit
    leaves it out. Cost: one pass over each text per view and form length."""
    wanted: dict[str, dict[int, set[tuple[str, ...]]]] = {}
    for form in forms:
        wanted.setdefault(form.view, {}).setdefault(len(form.tokens), set()).add(form.tokens)
    found: set[Canonical] = set()
    for text in texts:
        for view, by_length in wanted.items():
            toks = VIEWS[view](text)
            for n, grams in by_length.items():
                found.update(Canonical(view, gram) for gram in occurrences(view, toks, n) if gram in grams)
    return found


def clauses(text: str) -> list[str]:
    """``text`` cut into clauses at sentence punctuation followed by white space, and at line breaks."""
    return [c.strip() for c in _CLAUSE_END.split(text) if c.strip()]


def template_clauses(texts: Iterable[str], min_share: float = 0.05, min_count: int = 3) -> frozenset[str]:
    """The clauses that occur in at least ``min_share`` of ``texts`` (and at least ``min_count`` of them): the
    instruction text a generator wraps around each task."""
    counts: Counter[str] = Counter()
    total = 0
    for text in texts:
        total += 1
        counts.update(set(clauses(text)))
    return frozenset(c for c, n in counts.items() if n >= max(min_count, min_share * total))


def statement(text: str, template: frozenset[str]) -> str:
    """``text`` without its ``template`` clauses: the problem statement."""
    return "\n".join(c for c in clauses(text) if c not in template)


def canonical_statement(text: str, template: frozenset[str] = frozenset()) -> Canonical | None:
    """The canonical form of a generated task: its statement (``text`` minus ``template``) in the math view when
    that holds two numbers or more (an expression, with a binary operator, however short; a list of numbers only with
    ``MIN_DIGITS`` digits or more: else ``None``), else in the text view when that is long enough to be evidence;
    ``None`` otherwise."""
    body = statement(text, template)
    math = math_tokens(body)
    numbers = [t for t in math if _is_number(t)]
    if len(numbers) >= 2:  # numbers: an expression, a list long enough to be evidence, or nothing
        expression = any(t in _BINARY for t in math)
        return Canonical("math", tuple(math)) if expression or sum(c.isdigit() for t in numbers for c in t) >= MIN_DIGITS else None
    words = text_tokens(body)
    return Canonical("text", tuple(words)) if len(words) >= MIN_TEXT_TOKENS else None


def canonical_key(form: Canonical | None, question: str) -> str:
    """A string identifying an item up to its wording: its canonical form, or its question when it has none."""
    return f"{form.view}:{' '.join(form.tokens)}" if form else f"question:{question}"
