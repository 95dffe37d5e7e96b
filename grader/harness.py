"""Running a declarative harness: render the prompt (substitution-only Jinja2, sandboxed) and extract the answer."""

from __future__ import annotations

import re
from functools import lru_cache

import regex
from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.sandbox import SandboxedEnvironment

from services.common.contracts import EvaluationSettings, Harness
from services.common.errors import Unprocessable

_ENV = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
REGEX_TIMEOUT_S = 0.5  # seconds an answer_regex may run on one completion; past it nothing is extracted (score 0)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# A Markdown fence: ``` and an optional info string (``python``, ``py``…) on its own line; the body runs to the
# closing fence, or to the end when the completion was cut before it.
_FENCE = re.compile(r"```[^`\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")
_BOXED = re.compile(r"\\boxed\s*\{")


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


def _last_boxed(text: str) -> str:
    """The content of the last ``\\boxed{…}`` in ``text`` whose braces balance (a cut-off one is skipped), stripped;
    ``""`` if there is none. The convention of MATH-style graders (Hendrycks et al., 2021; math-verify's LaTeX extraction)."""
    for start in reversed([m.end() for m in _BOXED.finditer(text)]):
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
    return ""


def extract_answer(harness: Harness, completion: str) -> str | None:
    """The answer in ``completion`` per ``harness.answer_extraction``; ``None`` if none is found.

    ``code`` keeps the first line's indentation: a model that continues a function body writes it indented."""
    text = completion.strip()
    mode = harness.answer_extraction
    if mode == "boxed":
        answer = _last_boxed(text)
    elif mode == "code":
        fenced = _FENCE.search(completion)
        answer = _LEADING_BLANK_LINES.sub("", fenced.group(1) if fenced else completion).rstrip()
    elif mode == "strip":
        answer = text
    elif mode == "first_line":
        answer = text.splitlines()[0].strip() if text else ""
    elif mode == "last_number":
        numbers = _NUMBER.findall(text)
        answer = numbers[-1] if numbers else ""
    else:
        try:  # an agent's pattern: bounded in time, since backtracking can take forever ("(.|.)*X")
            match = regex.search(harness.answer_regex or "", text, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            match = None
        answer = (match.group(1) if match and match.groups() else match.group(0) if match else "").strip()
    return answer or None
