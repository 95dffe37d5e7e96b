"""Running a declarative harness: render the prompt (substitution-only Jinja2, sandboxed) and extract the answer."""

from __future__ import annotations

import ast
import re
from collections import deque
from functools import lru_cache

import regex
from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.sandbox import SandboxedEnvironment

from services.common.contracts import EvaluationSettings, Harness
from services.common.errors import Unprocessable

_ENV = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
REGEX_TIMEOUT_S = 0.5  # seconds an answer_regex may run on one completion; past it nothing is extracted (score 0)
# A Markdown fence: ``` and an optional info string (``python``, ``py``…) on its own line; the body runs to the
# closing fence, or to the end when the completion was cut before it.
_FENCE = re.compile(r"```[^`\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")


@lru_cache(maxsize=64)
def _template(source: str):  # noqa: ANN202
    return _ENV.from_string(source)


_SAFE_FILTERS = frozenset({"trim", "upper", "lower", "capitalize"})
_SAFE_NODES = (nodes.Template, nodes.Output, nodes.TemplateData, nodes.Name, nodes.Filter)


def _check_template(source: str) -> None:
    """Allow substitution only: text, ``{{ question }}`` and a few string filters. Statements, calls, arithmetic
    and attribute access are refused, so a template cannot loop or allocate without bound (Jinja2's sandbox
    blocks unsafe attributes but not resource exhaustion)."""
    try:
        tree = _ENV.parse(source)
    except TemplateError as exc:
        raise Unprocessable(f"harness.user_template does not parse: {exc}", field="harness.user_template") from exc
    for node in tree.find_all(nodes.Node):
        if not isinstance(node, _SAFE_NODES) or (isinstance(node, nodes.Filter) and node.name not in _SAFE_FILTERS) \
                or (isinstance(node, nodes.Name) and node.name != "question"):
            raise Unprocessable(f"harness.user_template may only substitute {{{{ question }}}} (filters: {', '.join(sorted(_SAFE_FILTERS))}); "
                                f"found {type(node).__name__}", field="harness.user_template")


def check_harness(harness: Harness) -> None:
    """Raise ``Unprocessable`` naming the field if the template or regex cannot be used."""
    _check_template(harness.user_template)
    try:
        render_messages(harness, "2 + 2 =")
    except (TemplateError, TypeError) as exc:
        raise Unprocessable(f"harness.user_template does not render: {exc}", field="harness.user_template") from exc
    if harness.answer_extraction == "regex":
        if not harness.answer_regex:
            raise Unprocessable("answer_extraction 'regex' needs answer_regex", field="harness.answer_regex")
        try:
            regex.compile(harness.answer_regex)
        except regex.error as exc:
            raise Unprocessable(f"harness.answer_regex is invalid: {exc}", field="harness.answer_regex") from exc


def apply_settings(harness: Harness, settings: EvaluationSettings) -> Harness:
    """The harness as evaluated: ``max_tokens`` capped and ``temperature`` fixed by the benchmark's settings."""
    update: dict = {"max_tokens": min(harness.max_tokens, settings.max_tokens)}
    if settings.temperature is not None:
        update["temperature"] = settings.temperature
    return harness.model_copy(update=update)


def render_messages(harness: Harness, question: str) -> list[dict[str, str]]:
    """The chat messages for one task: optional system prompt, then the rendered user message."""
    messages = []
    if harness.system_prompt:
        messages.append({"role": "system", "content": harness.system_prompt})
    messages.append({"role": "user", "content": _template(harness.user_template).render(question=question)})
    return messages


# ------------------------------------------------------------------------------------------- answer extraction

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


# code: the fenced block that holds the solution, sanitized as evalplus does (evalplus/sanitize.py: keep the
# imports and the top-level definitions the entry point reaches, drop usage examples and tests), with ``ast``.
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


def extract_answer(harness: Harness, completion: str, *, entry_point: str | None = None) -> str | None:
    """The answer in ``completion`` per ``harness.answer_extraction``; ``None`` if none is found. Never raises; the
    work is linear in the completion's length (``regex``: bounded by :data:`REGEX_TIMEOUT_S`).

    ``entry_point``: the function a ``code`` answer must define (HumanEval's ``entry_point``), which picks the
    fenced block and what of it to keep. ``code`` keeps the first line's indentation: a model that continues a
    function body writes it indented."""
    text = completion.strip()
    mode = harness.answer_extraction
    if mode == "boxed":
        answer = _last_boxed(completion)
    elif mode == "code":
        answer = _LEADING_BLANK_LINES.sub("", _extract_code(completion, entry_point)).rstrip()
    elif mode == "strip":
        answer = text
    elif mode == "first_line":
        answer = text.splitlines()[0].strip() if text else ""
    elif mode == "last_number":
        answer = _last_number(text)
    else:
        try:  # an agent's pattern: bounded in time, since backtracking can take forever ("(.|.)*X")
            match = regex.search(harness.answer_regex or "", text, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            match = None
        answer = (match.group(1) if match and match.groups() else match.group(0) if match else "").strip()
    return answer or None
