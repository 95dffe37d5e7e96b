"""Graders as OpenAI's fine-tuning and evals APIs define them: the wire models of a grader spec, shared by the gateway
(``method.reinforcement.grader``, ``/v1/fine_tuning/alpha/graders/…``), the trainer (a GRPO job's ``grader``) and the
grader service, which runs them (:mod:`grader.graders`).

A grader scores one **sample** (a model's answer: ``sample.output_text``, and ``sample.output_json`` when that text is
JSON) against one **item** (the dataset row's other fields), giving a float reward. Its text fields are templates:
``{{ sample.output_text }}``, ``{{ item.answer }}`` (Jinja2, rendered in its sandboxed environment; a variable that is
missing is an error, never an empty string). The kinds, with OpenAI's names and fields:

- ``string_check``: 1.0 when ``input`` and ``reference`` compare true under ``operation`` (``eq``, ``ne``, ``like``:
  contains, ``ilike``: contains ignoring case), else 0.0.
- ``text_similarity``: ``evaluation_metric`` between ``input`` and ``reference``: ``fuzzy_match`` (rapidfuzz's
  normalized Indel similarity), ``bleu`` (sacrebleu's sentence BLEU / 100), ``gleu`` (NLTK's sentence GLEU),
  ``rouge_1``…``rouge_5``, ``rouge_l`` (Google's rouge-score F-measure). ``cosine`` (an embedding model) and
  ``meteor`` (WordNet data) need what Crucible does not ship: refused naming the field.
- ``python``: ``source`` defines ``grade(sample, item) -> float``, run in the grader's sandbox like any agent code
  (no network, CPU, memory and wall limits).
- ``score_model``: a served model (base or checkpoint) answers the rendered ``input`` messages through the run's
  metered inference; the last number in its answer (or ``{"result": x}``), clipped to ``range`` (default ``[0, 1]``).
- ``label_model``: the model answers with one of ``labels``; 1.0 when it is one of ``passing_labels``.
- ``multi``: named graders (``graders``) combined by ``calculate_output``, a formula over their names (``+ - * / ^``,
  ``min``, ``max``, ``abs``, ``floor``, ``ceil``, ``exp``, ``sqrt``, ``log``).

Every field a grader does not define is refused (422 naming it), never ignored.
"""

from __future__ import annotations

import ast
import json
import math
import operator
from typing import Annotated, Any, Literal

import jinja2
import simpleeval
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator
from pydantic_core import PydanticCustomError


class _FieldsFirst(SandboxedEnvironment):
    """Jinja2's sandbox in which ``obj.name`` on a dict is its key ``name`` when it has one: ``{{ item.values }}`` is the
    row's field ``values``, not the dict's method (Jinja2 itself tries the attribute first)."""

    intercepted_binops = frozenset({"*", "**"})

    def getattr(self, obj: Any, attribute: str) -> Any:  # noqa: ANN401 - any template value
        if isinstance(obj, dict) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:  # noqa: ANN401
        """``*`` and ``**`` through simpleeval's guards: a string or list of more than 100,000 items, or a power with an
        exponent over 4,000,000, is a ``SecurityError`` (``{{ 'x' * 10**9 }}`` once held the grader for a minute)."""
        try:
            return (simpleeval.safe_mult if operator == "*" else simpleeval.safe_power)(left, right)
        except simpleeval.InvalidExpression as exc:
            raise SecurityError(f"{operator}: {exc}") from None


TEMPLATES = _FieldsFirst(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
"""Where grader templates are compiled and rendered: Jinja2's sandbox (no attribute of Python's internals is reachable),
a missing variable an error, a dict's key before its method."""

MAX_TEMPLATE_CHARS = 100_000
MAX_SOURCE_CHARS = 256 * 1024

NAME = Annotated[StrictStr, Field(min_length=1, max_length=128, description="The grader's name (a `multi` grader's formula uses its key).")]


def _template(text: str) -> str:
    try:
        TEMPLATES.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise PydanticCustomError("template_syntax", "not a valid template (line {line}: {message})",
                                  {"line": exc.lineno, "message": exc.message or "syntax error"}) from None
    return text


Template = Annotated[StrictStr, Field(max_length=MAX_TEMPLATE_CHARS), AfterValidator(_template)]
"""A text that may hold ``{{ sample.… }}`` and ``{{ item.… }}`` variables."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StringCheckGrader(_Spec):
    """1.0 when ``input`` ``operation`` ``reference`` holds: ``eq`` equal, ``ne`` different, ``like`` ``reference`` is
    contained in ``input``, ``ilike`` the same ignoring case; else 0.0."""

    model_config = ConfigDict(json_schema_extra={"example": {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
                                                             "reference": "{{ item.answer }}", "operation": "eq"}})

    type: Literal["string_check"]
    name: NAME
    input: Template
    reference: Template
    operation: Literal["eq", "ne", "like", "ilike"]


UNSUPPORTED_METRICS = {
    "cosine": "needs an embedding model, which Crucible does not serve",
    "meteor": "needs WordNet's data, which no package of the registry ships",
}


class TextSimilarityGrader(_Spec):
    """``evaluation_metric`` of ``input`` against ``reference``, in [0, 1] (module docstring)."""

    type: Literal["text_similarity"]
    name: NAME
    input: Template
    reference: Template
    evaluation_metric: Literal["cosine", "fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l"]

    @field_validator("evaluation_metric")
    @classmethod
    def _supported(cls, metric: str) -> str:
        if metric in UNSUPPORTED_METRICS:
            raise PydanticCustomError("unsupported_metric", "{metric} {why}; use fuzzy_match, bleu, gleu or rouge_*",
                                      {"metric": metric, "why": UNSUPPORTED_METRICS[metric]})
        return metric


class PythonGrader(_Spec):
    """``source`` defines ``grade(sample: dict, item: dict) -> float``; it runs in the grader's sandbox."""

    type: Literal["python"]
    name: NAME
    source: Annotated[StrictStr, Field(min_length=1, max_length=MAX_SOURCE_CHARS)]
    image_tag: str | None = Field(None, description="Only `null` (the platform's sandbox image, Python 3.11 and the standard library).")

    @field_validator("source")
    @classmethod
    def _compiles(cls, source: str) -> str:
        try:
            compile(source, "grader.py", "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            raise PydanticCustomError("python_syntax", "does not compile: {error}", {"error": str(exc)}) from None
        return source

    @field_validator("image_tag")
    @classmethod
    def _one_image(cls, tag: str | None) -> None:
        if tag is not None:
            raise PydanticCustomError("image_tag", "python graders run in the platform's one sandbox image; leave image_tag out")
        return None


class InputText(_Spec):
    """A text part of a grader message (OpenAI's ``input_text`` / ``output_text``)."""

    type: Literal["input_text", "output_text"]
    text: Template


class GraderMessage(_Spec):
    """One message a model grader is shown; ``developer`` is sent as ``system``."""

    role: Literal["user", "assistant", "system", "developer"]
    content: Template | Annotated[list[InputText], Field(min_length=1, max_length=64)] = Field(
        description="A template, or text parts (images and audio are refused: the served models read text).")
    type: Literal["message"] | None = None

    def template(self) -> str:
        """The content as one template (text parts joined by newlines)."""
        return self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)


class SamplingParams(_Spec):
    """How the grading model samples (OpenAI's names); ``reasoning_effort`` is refused: the served models do not reason on request."""

    max_completions_tokens: int | None = Field(None, ge=1, le=4096)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    reasoning_effort: None = Field(None, description="Refused when set.")


class ScoreModelGrader(_Spec):
    """A served model scores the sample: its answer's last number (or ``{"result": x}``), clipped to ``range``."""

    type: Literal["score_model"]
    name: NAME
    model: Annotated[StrictStr, Field(min_length=1, max_length=200, description="A base model or the run's checkpoint (`ckpt_…`).")]
    input: list[GraderMessage] = Field(min_length=1, max_length=64)
    range: list[float] | None = Field(None, min_length=2, max_length=2, description="`[low, high]`, default `[0, 1]`.")
    sampling_params: SamplingParams | None = None

    @field_validator("range")
    @classmethod
    def _ordered(cls, bounds: list[float] | None) -> list[float] | None:
        if bounds is not None and not bounds[0] < bounds[1]:
            raise PydanticCustomError("range_order", "range is [low, high] with low < high")
        return bounds

    def bounds(self) -> tuple[float, float]:
        """``(low, high)``."""
        low, high = self.range or (0.0, 1.0)
        return float(low), float(high)


class LabelModelGrader(_Spec):
    """A served model labels the sample with one of ``labels``; 1.0 when it is one of ``passing_labels``."""

    type: Literal["label_model"]
    name: NAME
    model: Annotated[StrictStr, Field(min_length=1, max_length=200)]
    input: list[GraderMessage] = Field(min_length=1, max_length=64)
    labels: list[Annotated[StrictStr, Field(min_length=1, max_length=200)]] = Field(min_length=2, max_length=64)
    passing_labels: list[StrictStr] = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _passing_among_labels(self) -> LabelModelGrader:
        if stray := [label for label in self.passing_labels if label not in self.labels]:
            raise PydanticCustomError("passing_labels", "passing_labels {stray} are not among labels", {"stray": stray})
        return self


SingleGrader = Annotated[StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader | LabelModelGrader, Field(discriminator="type")]

FORMULA_FUNCTIONS: dict[str, Any] = {"min": min, "max": max, "abs": abs, "floor": math.floor, "ceil": math.ceil, "exp": math.exp,
                                     "sqrt": math.sqrt, "log": math.log}
FORMULA_OPERATORS = {ast.Add: simpleeval.safe_add, ast.Sub: operator.sub, ast.Mult: simpleeval.safe_mult, ast.Div: operator.truediv,
                     ast.Pow: simpleeval.safe_power, ast.BitXor: simpleeval.safe_power, ast.USub: operator.neg, ast.UAdd: operator.pos}
"""``^`` is a power in a formula, as in OpenAI's examples, and ``**`` too; simpleeval's guarded operators (an exponent over
4,000,000 or a string past 100,000 characters is refused: ``9**9**9`` once held the gateway)."""


class FormulaError(ValueError):
    """A ``calculate_output`` formula that cannot be evaluated: a syntax error, an unknown name or function, a math error."""


def evaluate_formula(formula: str, values: dict[str, float]) -> float:
    """``formula`` (a ``multi`` grader's ``calculate_output``) with each grader's name bound to its reward, evaluated by
    simpleeval with only :data:`FORMULA_OPERATORS` and :data:`FORMULA_FUNCTIONS`. Raises :class:`FormulaError`."""
    evaluator = simpleeval.SimpleEval(operators=FORMULA_OPERATORS, functions=FORMULA_FUNCTIONS, names=values)
    try:
        result = evaluator.eval(formula)
    except simpleeval.NameNotDefined as exc:
        raise FormulaError(f"{exc.name!r} is not a grader of this multi grader ({', '.join(sorted(values))})") from None
    except simpleeval.FunctionNotDefined as exc:
        raise FormulaError(f"{exc.func_name!r} is not a function of formulas ({', '.join(FORMULA_FUNCTIONS)})") from None
    except (simpleeval.InvalidExpression, SyntaxError) as exc:
        raise FormulaError(f"not a formula ({exc})") from None
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise FormulaError(f"cannot be computed ({exc})") from None
    try:
        finite = not isinstance(result, bool) and isinstance(result, int | float) and math.isfinite(result)
        value = float(result) if finite else math.nan
    except OverflowError:  # an integer too large for a float
        finite = False
    if not finite or not math.isfinite(value):
        raise FormulaError(f"gives {str(result)[:40]!r}, not a finite number")
    return value


class MultiGrader(_Spec):
    """Named graders combined by ``calculate_output`` (a formula over their names; module docstring). ``graders`` is a
    mapping of name to grader, as OpenAI documents it, or one grader (its ``name`` is its variable), as its SDK types it."""

    model_config = ConfigDict(json_schema_extra={"example": {
        "type": "multi", "name": "blend", "calculate_output": "0.7 * exact + 0.3 * close",
        "graders": {"exact": {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}",
                              "operation": "eq"},
                    "close": {"type": "text_similarity", "name": "close", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}",
                              "evaluation_metric": "fuzzy_match"}}}})

    type: Literal["multi"]
    name: NAME
    graders: Annotated[dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")], SingleGrader], Field(min_length=1, max_length=16)] | SingleGrader
    calculate_output: Annotated[StrictStr, Field(min_length=1, max_length=2000)]

    def named(self) -> dict[str, Any]:
        """The graders by the names the formula uses."""
        if isinstance(self.graders, dict):
            return dict(self.graders)
        return {self.graders.name: self.graders}

    @model_validator(mode="after")
    def _formula_names_graders(self) -> MultiGrader:
        try:
            evaluate_formula(self.calculate_output, dict.fromkeys(self.named(), 0.5))
        except FormulaError as exc:
            raise PydanticCustomError("formula", "calculate_output: {problem}", {"problem": str(exc)}) from None
        return self


Grader = Annotated[StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader | LabelModelGrader | MultiGrader,
                   Field(discriminator="type")]
"""Any grader spec, told apart by ``type``."""


class GraderSample(BaseModel):
    """One sample to grade: the model's answer and the dataset row's fields."""

    model_config = ConfigDict(extra="forbid")

    output_text: str = Field(max_length=200_000)
    item: dict[str, Any] = Field(default_factory=dict)


class GraderRunRequest(BaseModel):
    """Grade samples with one grader (GRPO's rewards for a graded job; OpenAI's ``graders.run``)."""

    model_config = ConfigDict(extra="forbid")

    grader: Grader
    samples: list[GraderSample] = Field(min_length=1, max_length=4096)


class GraderResult(BaseModel):
    """One sample's reward, the rewards of a ``multi`` grader's parts (``sub_rewards``), and what went wrong (``error``:
    ``None``, or a kind: ``template``, ``python_runtime``, ``python_timeout``, ``model_parse``, ``model_server``,
    ``formula``), with ``error_details``. A sample a grader could not score has reward 0.0."""

    reward: float
    sub_rewards: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    error_details: str | None = None
    model_tokens: int = Field(0, description="Tokens the grading model used (prompt and completion), billed by inference.")


def templates(grader: Any) -> list[tuple[str, str]]:
    """Every template of ``grader`` (a :data:`Grader`), as ``(field path, template)``: ``input``, ``reference``,
    ``input[i].content``, and a ``multi`` grader's parts' under ``graders.<name>.``."""
    if isinstance(grader, MultiGrader):
        return [(f"graders.{name}.{path}", text) for name, part in grader.named().items() for path, text in templates(part)]
    if isinstance(grader, StringCheckGrader | TextSimilarityGrader):
        return [("input", grader.input), ("reference", grader.reference)]
    if isinstance(grader, ScoreModelGrader | LabelModelGrader):
        return [(f"input[{i}].content", message.template()) for i, message in enumerate(grader.input)]
    return []


def sample_namespace(output_text: str) -> dict[str, Any]:
    """What ``{{ sample.… }}`` reads: ``output_text``, and ``output_json`` (the text parsed as JSON, ``None`` if it is not)."""
    try:
        output_json = json.loads(output_text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes ("[" * 100_000)
        output_json = None
    return {"output_text": output_text, "output_json": output_json}


def check_templates(grader: Any, item: dict[str, Any]) -> str | None:
    """``None`` if every template of ``grader`` renders for a row whose fields are ``item`` (with an empty sample), else
    what fails: ``"reference: 'dict object' has no attribute 'answer'"``. Checked when a job is created, so a dataset
    whose rows lack a field the grader reads is refused before any work."""
    for path, text in templates(grader):
        try:
            TEMPLATES.from_string(text).render(sample=sample_namespace(""), item=item)
        except jinja2.UndefinedError as exc:
            return f"{path}: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - a template's own runtime error (a filter on the wrong type, a sandbox refusal)
            return f"{path}: {exc}"
    return None
