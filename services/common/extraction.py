"""Answer extraction modes: how a harness reads the answer out of a completion (``Harness.answer_extraction``).

A mode is one function registered with :func:`extraction_mode`: ``(completion, options) -> answer`` with
``completion`` the model's text as returned, ``options`` the :class:`ExtractionOptions`, and ``""`` when there is no
answer. A mode never raises and its work is linear in the completion's length (a mode that runs the harness's
pattern bounds its time). A mode that needs more of the harness than its name registers a ``check`` as well, which
raises ``Unprocessable`` naming the harness field (``regex``: ``harness.answer_regex``).

:data:`MODES` is the one list of modes: the ``Harness`` contract accepts exactly its names and its JSON schema lists
them with each mode's summary (the first paragraph of its docstring), so the gateway's OpenAPI documents them; the
grader applies them (:func:`services.common.harness.extract_answer`). The modes are pure text functions that define what a
contract field means, so they live here beside the contracts rather than in the grader (``services.common`` imports
no service). Adding a mode is one decorated function here and its test.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import regex

from services.common.errors import Unprocessable

REGEX_TIMEOUT_S = 0.5  # seconds an answer_regex may run on one completion; past it nothing is extracted (score 0)


@dataclass(frozen=True)
class ExtractionOptions:
    """What a mode may read besides the completion: the harness's ``answer_regex``, and ``entry_point``, the function
    a ``code`` answer must define (HumanEval's ``entry_point``; ``None`` for other suites and when a harness is
    checked)."""

    answer_regex: str | None = None
    entry_point: str | None = None


Extract = Callable[[str, ExtractionOptions], str]


@dataclass(frozen=True)
class ExtractionMode:
    """One registered mode: its ``name`` (the value of ``Harness.answer_extraction``), its ``extract`` function and
    its optional ``check`` of the harness's options (raises ``Unprocessable`` naming the field)."""

    name: str
    extract: Extract
    check: Callable[[ExtractionOptions], None] | None = None

    @property
    def summary(self) -> str:
        """The first paragraph of the extract function's docstring, on one line."""
        return " ".join(inspect.cleandoc(self.extract.__doc__ or "").split("\n\n")[0].split())


MODES: dict[str, ExtractionMode] = {}
"""The registered modes by name, in registration order (the order the contract's schema lists them)."""


def extraction_mode(name: str, *, check: Callable[[ExtractionOptions], None] | None = None) -> Callable[[Extract], Extract]:
    """Decorator: register the decorated function as the mode ``name`` (with ``check``, if given) in :data:`MODES`
    and return it unchanged. Raises ``ValueError`` if ``name`` is taken."""
    def register(extract: Extract) -> Extract:
        if name in MODES:
            raise ValueError(f"answer extraction mode {name!r} is registered twice")
        MODES[name] = ExtractionMode(name, extract, check)
        return extract
    return register


def json_schema() -> dict[str, Any]:
    """The JSON schema keys of ``Harness.answer_extraction``: ``enum`` (the modes' names) and a ``description``
    with each mode's summary."""
    return {"enum": list(MODES),
            "description": "How the answer is read from the completion:\n" + "\n".join(f"- `{m.name}`: {m.summary}" for m in MODES.values())}


# ------------------------------------------------------------------------------------------------------- modes


@extraction_mode("strip")
def _strip(completion: str, _options: ExtractionOptions) -> str:
    """The whole completion, stripped."""
    return completion.strip()


@extraction_mode("first_line")
def _first_line(completion: str, _options: ExtractionOptions) -> str:
    """The first line of the stripped completion, stripped."""
    text = completion.strip()
    return text.splitlines()[0].strip() if text else ""


# last_number: one number as people and models write it. Integers with thousands separators (``1,234``,
# ``1,234,567.5``; ``{,}`` and ``\,`` as in LaTeX), decimals (``0.5``, ``.5``; ``3.`` ends a sentence and reads as
# ``3``), scientific notation (``1.5e3``), fractions (``-3/4``, ``\frac{3}{4}``, ``\dfrac``, ``\tfrac``), a
# percent sign, ASCII or Unicode minus (U+2212). A minus is a sign only where it cannot be subtraction (not after a
# letter, digit or closing bracket). The thousands rule is math-verify's (``[1-9]\d{0,2}`` then groups of exactly 3
# digits, math_verify/parser.py ``lazy_expr_regex``); each group checks its own end, so no match ever fails after
# consuming a long run and the search stays linear on any input.
_SIGN = r"(?:(?<![0-9A-Za-z)\]}])[-+\u2212])"
_UNSIGNED = (r"(?:(?<![0-9])(?:[1-9][0-9]{0,2}(?:(?:,|\{,\}|\\,)[0-9]{3}(?![0-9]))+|[0-9]+)(?:\.[0-9]+)?|(?<![0-9])\.[0-9]+)"
             r"(?:[eE][-+]?[0-9]+)?")
_NUMBER = re.compile(
    rf"(?P<latex>{_SIGN}?\\[dt]?frac ?\{{ ?(?P<num>{_SIGN}?{_UNSIGNED}) ?\}} ?\{{ ?(?P<den>{_SIGN}?{_UNSIGNED}) ?\}})"
    rf"|(?P<plain>{_SIGN}?{_UNSIGNED}(?: ?/ ?{_UNSIGNED})?)(?: ?\\?%)?")
_SEPARATORS = re.compile(r",|\{,\}|\\,| ")


def _plain_number(text: str) -> str:
    """``text`` (a match of one number of :data:`_NUMBER`) without separators or ``+``, ASCII minus, ``0.5`` for ``.5``."""
    text = _SEPARATORS.sub("", text).replace("\u2212", "-")
    sign, text = (text[0], text[1:]) if text[0] in "+-" else ("", text)
    return ("-" if sign == "-" else "") + ("0" + text if text.startswith(".") else text)


def _last_number(text: str) -> str:
    """The last number in ``text`` (see :data:`_NUMBER`), written plainly: ``1234``, ``-3/4``, ``0.5``, ``1.5e3``;
    a LaTeX fraction as ``a/b`` with the signs folded into ``a``; the percent sign dropped. ``""`` if none."""
    last = deque(_NUMBER.finditer(text), maxlen=1)
    if not last:
        return ""
    match = last[0]
    if match["plain"]:
        return _plain_number(match["plain"])
    num, den = _plain_number(match["num"]), _plain_number(match["den"])
    negative = (match["latex"].lstrip()[0] in "-\u2212") ^ num.startswith("-") ^ den.startswith("-")
    return ("-" if negative else "") + f"{num.lstrip('-')}/{den.lstrip('-')}"


@extraction_mode("last_number")
def _last_number_mode(completion: str, _options: ExtractionOptions) -> str:
    """The last number in the text, written plainly: ``1,234.`` → ``1234``, ``−3/4`` → ``-3/4``, ``\\frac{3}{4}`` →
    ``3/4``, ``.5`` → ``0.5``, ``50%`` → ``50``, ``1.5e3`` kept."""
    return _last_number(completion.strip())


def _check_regex(options: ExtractionOptions) -> None:
    """``answer_regex`` is set and compiles; raises ``Unprocessable`` (field ``harness.answer_regex``)."""
    if not options.answer_regex:
        raise Unprocessable("answer_extraction 'regex' needs answer_regex", field="harness.answer_regex")
    try:
        regex.compile(options.answer_regex)
    except regex.error as exc:
        raise Unprocessable(f"harness.answer_regex is invalid: {exc}", field="harness.answer_regex") from exc


@extraction_mode("regex", check=_check_regex)
def _regex(completion: str, options: ExtractionOptions) -> str:
    """The first group of ``answer_regex``'s first match in the stripped completion, else the whole match; stripped.

    The search stops after :data:`REGEX_TIMEOUT_S` (then nothing is extracted)."""
    try:  # an agent's pattern: bounded in time, since backtracking can take forever ("(.|.)*X")
        match = regex.search(options.answer_regex or "", completion.strip(), timeout=REGEX_TIMEOUT_S)
    except TimeoutError:
        return ""
    return (match.group(1) if match and match.groups() else match.group(0) if match else "").strip()


# code: the fenced block that holds the solution, sanitized as evalplus does (evalplus/sanitize.py: keep the
# imports and the top-level definitions the entry point reaches, drop usage examples and tests), with ``ast``.
# A Markdown fence: ``` and an optional info string (``python``, ``py``…) on its own line; the body runs to the
# closing fence, or to the end when the completion was cut before it.
_FENCE = re.compile(r"```[^`\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")  # the lines as Python's tokenizer counts them


def _parse(source: str) -> ast.Module | None:
    """``source`` as a Python module, or ``None`` if it does not parse (syntax, null bytes, nesting too deep)."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _is_stub(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``function``'s body is only a docstring, ``pass`` or ``...`` (a restated signature, not a solution)."""
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                           and (isinstance(s.value.value, str) or s.value.value is Ellipsis))
               for s in function.body)


def _bound_names(node: ast.stmt) -> set[str]:
    """The module-level names a top-level definition or assignment binds."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
    return {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}


def _sanitize(source: str, tree: ast.Module, entry_point: str) -> str:
    """The imports of ``source`` and the top-level definitions (functions, classes, assignments) that
    ``entry_point`` reaches through the names they use, in source order; everything else at top level (calls,
    prints, asserts, ``if __name__ == "__main__":``) is dropped, and so are the lines between two kept statements
    unless they are only blank lines and comments. Every definition of a reached name is kept, so the name is
    bound as the whole block binds it."""
    uses: dict[str, set[str]] = {}
    for node in tree.body:
        for name in _bound_names(node):
            uses.setdefault(name, set()).update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
    reached, queue = {entry_point}, [entry_point]
    while queue:
        for name in uses.get(queue.pop(), ()):
            if name in uses and name not in reached:
                reached.add(name)
                queue.append(name)
    lines = _LINE.findall(source)
    keep: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom) or _bound_names(node) & reached:
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
            keep.update(range(first - 1, node.end_lineno or node.lineno))
    kept, out = sorted(keep), []
    for line, next_line in zip(kept, [*kept[1:], None], strict=True):
        out.append(lines[line])
        gap = lines[line + 1:next_line] if next_line is not None else []
        if all(not g.strip() or g.lstrip().startswith("#") for g in gap):  # blank lines and comments between kept code stay
            out.extend(gap)
    return "".join(out)


def _defines(tree: ast.Module, name: str | None) -> bool:
    """Whether ``tree`` defines, at top level, the function ``name`` (more than a stub), or any function if ``name`` is ``None``."""
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and (name is None or (n.name == name and not _is_stub(n)))
               for n in tree.body)


def _extract_code(completion: str, entry_point: str | None) -> str:
    """The code in ``completion``: without a fenced block, the whole completion (a continued function body).
    Among fenced blocks: the first that parses and defines ``entry_point`` (more than a stub), sanitized
    (:func:`_sanitize`); else the first that parses and defines a function; else the first block. Only blocks
    with a ``def`` line of the name sought are parsed, each at most once."""
    blocks = [m.group(1) for m in _FENCE.finditer(completion)]
    if not blocks:
        return completion
    trees: dict[int, ast.Module | None] = {}
    for name in ([entry_point] if entry_point else []) + [None]:
        defined = rf"[ \t]+{re.escape(name)}\b" if name else r"[ \t]"
        def_line = re.compile(rf"(?:^|(?<=\r))(?:async[ \t]+)?def{defined}", re.MULTILINE)  # a top-level def line
        for i, block in enumerate(blocks):
            if def_line.search(block):
                if i not in trees:
                    trees[i] = _parse(block)
                tree = trees[i]
                if tree is not None and _defines(tree, name):
                    return _sanitize(block, tree, name) if name else block
    return blocks[0]


@extraction_mode("code")
def _code(completion: str, options: ExtractionOptions) -> str:
    """Among fenced blocks, the first that defines the task's entry point, keeping only its imports and the
    definitions the entry point uses, as evalplus sanitizes; else the first block defining a function, else the
    first block; without a fence the whole completion; leading blank lines and trailing whitespace dropped,
    indentation kept.

    The first line's indentation stays: a model that continues a function body writes it indented."""
    return _LEADING_BLANK_LINES.sub("", _extract_code(completion, options.entry_point)).rstrip()


# boxed: Hendrycks et al. (2021) MATH's ``last_boxed_only_string`` and ``remove_boxed`` as lm-evaluation-harness
# states them (lm_eval/tasks/minerva_math/utils.py).
_BRACES = re.compile(r"[{}]")


def _closing_brace(text: str, start: int) -> int | None:
    """The index of the ``}`` at which the braces counted from ``start`` first balance (``None`` if never): the
    reference's scan, which counts every brace (``\\{`` too)."""
    depth = 0
    for match in _BRACES.finditer(text, start):
        depth += 1 if match.group() == "{" else -1
        if depth == 0:
            return match.start()
    return None


def _last_boxed(text: str) -> str:
    """The content of the last box in ``text``, stripped; ``""`` if there is none or it does not close.

    As the reference: if ``\\boxed `` (with a space) occurs anywhere, the answer is what follows its last occurrence
    up to the next ``$`` (``\\boxed 5$`` → ``5``); otherwise the box is the last ``\\boxed`` (else the last
    ``\\fbox``) through the ``}`` where the braces counted from there balance, and the answer is inside its outer
    braces; a box that does not close (a completion cut off inside it) gives nothing, even after an earlier
    complete box. Two departures, where the reference has no answer or a wrong one: ``\\fbox{…}`` gives its content
    (the reference's ``remove_boxed`` fails on it), and ``\\boxed {7}`` gives ``7`` as TeX reads it (the reference
    gives ``{7}``)."""
    if "\\boxed " in text:
        rest = text.rpartition("\\boxed ")[2].partition("$")[0]
        group = rest.lstrip()
        if not group.startswith("{"):
            return rest.strip()
        end = _closing_brace(group, 0)
        return group[1:end].strip() if end is not None else ""
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return ""
    end = _closing_brace(text, start)
    if end is None:
        return ""
    box = text[start:end + 1]
    for left in ("\\boxed{", "\\fbox{"):
        if box.startswith(left):
            return box[len(left):-1].strip()
    return ""  # ``\boxed5 … {…}``: the reference's remove_boxed refuses it


@extraction_mode("boxed")
def _boxed(completion: str, _options: ExtractionOptions) -> str:
    """The last ``\\boxed{…}``, ``\\boxed …$`` or ``\\fbox{…}``, as MATH's ``last_boxed_only_string`` and
    ``remove_boxed`` read it; a last box cut off before its closing brace gives nothing."""
    return _last_boxed(completion)
