"""Running a declarative harness: render the prompt (substitution-only Jinja2, sandboxed) and extract the answer
(with the harness's mode of :mod:`services.common.extraction`)."""

from __future__ import annotations

from functools import lru_cache

from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.sandbox import SandboxedEnvironment

from services.common.contracts import EvaluationSettings, Harness
from services.common.errors import Unprocessable
from services.common.extraction import MODES, ExtractionOptions

_ENV = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)


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
    """Raise ``Unprocessable`` naming the field if the template cannot be used or the harness lacks what its
    extraction mode needs (the mode's ``check``: ``regex`` needs a valid ``answer_regex``)."""
    _check_template(harness.user_template)
    try:
        render_messages(harness, "2 + 2 =")
    except (TemplateError, TypeError) as exc:
        raise Unprocessable(f"harness.user_template does not render: {exc}", field="harness.user_template") from exc
    check = MODES[harness.answer_extraction].check
    if check:
        check(ExtractionOptions(answer_regex=harness.answer_regex))


def apply_settings(harness: Harness, settings: EvaluationSettings) -> Harness:
    """The harness as evaluated: ``max_tokens`` capped and ``temperature`` fixed by the benchmark's settings."""
    update: dict = {"max_tokens": min(harness.max_tokens, settings.max_tokens)}
    if settings.temperature is not None:
        update["temperature"] = settings.temperature
    return harness.model_copy(update=update)


def render_user(harness: Harness, question: str) -> str:
    """The user message the harness's template makes of ``question``."""
    return _template(harness.user_template).render(question=question)


def render_messages(harness: Harness, question: str) -> list[dict[str, str]]:
    """The chat messages for one task: optional system prompt, then the rendered user message."""
    messages = []
    if harness.system_prompt:
        messages.append({"role": "system", "content": harness.system_prompt})
    messages.append({"role": "user", "content": render_user(harness, question)})
    return messages


def extract_answer(harness: Harness, completion: str, *, entry_point: str | None = None) -> str | None:
    """The answer in ``completion`` per ``harness.answer_extraction`` (a mode of :mod:`services.common.extraction`);
    ``None`` if none is found. Never raises; the work is linear in the completion's length.

    ``entry_point``: the function a ``code`` answer must define (HumanEval's ``entry_point``), which picks the
    fenced block and what of it to keep."""
    options = ExtractionOptions(answer_regex=harness.answer_regex, entry_point=entry_point)
    return MODES[harness.answer_extraction].extract(completion, options) or None
