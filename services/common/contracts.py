"""Wire models shared by the gateway (public API) and the service that owns each noun.

The gateway documents and returns exactly what the owning service returns, so both import these
models from here; models only one service uses live in that service's ``schemas.py``.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from services.common import extraction

TRAINING_FIELDS = (
    "method", "adapter", "lora_r", "lora_alpha", "lora_dropout", "target_modules", "learning_rate",
    "batch_size", "max_steps", "warmup_steps", "lr_scheduler", "max_seq_len", "seed", "checkpoint_every",
)



ModelName = Annotated[str, Field(
    min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$", examples=["smollm2-135m-instruct"],
    description="A served base model's name or a checkpoint id (`ckpt_…`).",
)]

class Recipe(BaseModel):
    """How to train: method, adapter and hyper-parameters (names as in transformers/PEFT)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra={"example": {"method": "sft", "lora_r": 16, "learning_rate": 1e-3, "max_steps": 100}})

    method: Literal["sft", "dpo", "grpo"] = "sft"
    adapter: Literal["lora", "full"] = "lora"
    lora_r: int = Field(16, ge=1, le=256)
    lora_alpha: int = Field(32, ge=1, le=1024)
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: Literal["all-linear"] | Annotated[list[Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]],
                                                      Field(min_length=1, max_length=7)] = Field(
        "all-linear", description="`all-linear` or a non-empty list of the model's projection layers.")
    learning_rate: float = Field(1e-3, gt=0, le=1.0)
    batch_size: int = Field(8, ge=1, le=256)
    max_steps: int = Field(100, ge=1, le=100_000)
    warmup_steps: int = Field(10, ge=0)
    lr_scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    max_seq_len: int = Field(256, ge=16, le=4096)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    checkpoint_every: int = Field(50, ge=1, description="Write a checkpoint every this many steps (and at the end).")


class DatasetOut(BaseModel):
    """An uploaded dataset: immutable, content-addressed by ``sha256``."""

    id: str = Field(examples=["ds_01jd3k4m5n6p7q8r9s0t1v2w3x"])
    object: Literal["dataset"] = "dataset"
    name: str
    format: Literal["messages", "prompt_completion", "preference"]
    rows: int
    bytes: int
    sha256: str
    created_at: dt.datetime


class TrainingJobCreate(BaseModel):
    """Start a training job on uploaded datasets, from a base model or a parent checkpoint."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {"model": "smollm2-135m-instruct", "datasets": ["ds_01jd3k4m5n6p7q8r9s0t1v2w3x"], "recipe": {"method": "sft", "max_steps": 100}}})

    model: ModelName = Field(description="Base model name, or a `ckpt_…` to continue training from (LoRA parent).")
    datasets: list[str] = Field(min_length=1, max_length=16)
    recipe: Recipe = Field(default_factory=Recipe)


class TrainingJobOut(BaseModel):
    """A training job. ``status``: validating → queued → running → succeeded | failed | cancelled."""

    id: str
    object: Literal["training.job"] = "training.job"
    status: Literal["validating", "queued", "running", "paused", "succeeded", "failed", "cancelled"]
    model: str
    base_model: str
    datasets: list[str]
    recipe: Recipe
    steps_done: int
    estimated_tokens: int
    trained_tokens: int
    latest_checkpoint: str | None = None
    attempts: int = Field(0, description="Times a worker started the job; above 1 after a worker was lost and the job resumed.")
    error: str | None = None
    created_at: dt.datetime
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None


class JobEventOut(BaseModel):
    """A job event; training steps carry ``data`` = {step, loss, learning_rate, tokens, tokens_per_s}."""

    seq: int
    level: Literal["info", "warn", "error"]
    type: str
    message: str
    data: dict[str, Any] = Field(default_factory=dict)
    created_at: dt.datetime


class CheckpointOut(BaseModel):
    """A LoRA adapter written at ``step``; pass its ``id`` as ``model`` to inference or evaluation."""

    id: str
    object: Literal["checkpoint"] = "checkpoint"
    job_id: str
    step: int
    base_model: str
    kind: Literal["lora", "full"]
    metrics: dict[str, Any] = Field(default_factory=dict)
    created_at: dt.datetime


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """A list answer: ``{"object": "list", "data": [...]}`` as in the OpenAI API."""

    object: Literal["list"] = "list"
    data: list[T]


# ----------------------------------------------------------------- OpenAI-compatible models and chat completions


class ModelOut(BaseModel):
    """OpenAI ``model`` object: a servable base model (``GET /v1/models`` lists them in a :class:`Page`)."""

    id: str
    object: Literal["model"] = "model"
    owned_by: str = "crucible"


MAX_PROMPT_CHARS = 100_000
MAX_TOOLS = 128
MAX_SCHEMA_DEPTH = 32


class ChatMessage(BaseModel):
    """One chat message, as in the OpenAI API.

    Accepted as OpenAI sends them and kept in one form: ``content`` given as an array of text parts
    (``[{"type": "text", "text": …}]``) is their texts joined, as OpenAI reads it; any other part type (image, audio,
    file) is a 422 naming it. The ``developer`` role is read as ``system``, which it replaces in OpenAI's newer models.
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str

    @field_validator("role", mode="before")
    @classmethod
    def _developer_is_system(cls, role: Any) -> Any:
        return "system" if role == "developer" else role

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, content: Any) -> Any:
        if not isinstance(content, list):
            return content
        texts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text":
                raise PydanticCustomError("content_part", "content part {i} is of type {kind}: only text parts are served", {"i": i, "kind": str(kind)})
            if not isinstance(part.get("text"), str):
                raise PydanticCustomError("content_part", "content part {i} has no text", {"i": i})
            texts.append(part["text"])
        return "".join(texts)


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value: 0 for a scalar, 1 for a flat object or array, and so on."""
    depth, level = 0, [value]
    while containers := [x for x in level if isinstance(x, dict | list)]:
        depth += 1
        level = [v for x in containers for v in (x.values() if isinstance(x, dict) else x)]
    return depth


class FunctionDefinition(BaseModel):
    """A function the model may call (OpenAI ``tools[].function``); ``parameters`` is a JSON-schema object
    (``{"type": "object", "properties": {...}, "required": [...]}``) nested at most 32 levels."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None

    @field_validator("parameters")
    @classmethod
    def _schema_object(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        if parameters is not None and parameters.get("type") != "object":
            raise ValueError('parameters must be a JSON-schema object: {"type": "object", "properties": {...}}')
        if parameters is not None and _depth(parameters) > MAX_SCHEMA_DEPTH:
            raise ValueError(f"parameters are nested more than {MAX_SCHEMA_DEPTH} levels")
        return parameters


class ChatTool(BaseModel):
    """One entry of ``tools`` (OpenAI): a function tool."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionDefinition


class _TextFormat(BaseModel):
    """``response_format`` as plain text, the only format served."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]


class ChatCompletionRequest(BaseModel):
    """OpenAI ``POST /v1/chat/completions`` request; ``model`` is a base model name or a ``ckpt_…``.

    ``tools`` are shown to the model in the prompt: through the model's chat template when it renders tools,
    otherwise as JSON lines appended to the system message (see ``inference_service.engine.TOOLS_HEADER``);
    their tokens are prompt tokens. The model's calls are not parsed: the answer is the message content.

    Every parameter of OpenAI's chat schema is honoured or refused, never ignored: one the engine does not serve
    (``logprobs``, ``top_logprobs``, a ``response_format`` other than text, a ``tool_choice`` other than ``auto``,
    non-zero penalties, ``logit_bias``, audio, predictions, web search, …) is a 422 naming it when set to anything
    but its no-op value; fields that only describe the request (``user``, ``metadata``, ``store``, ``service_tier``)
    are accepted. A field outside the schema is ignored, as OpenAI's own API does.
    """

    model_config = ConfigDict(extra="ignore", json_schema_extra={"example": {
        "model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is 12 + 30?"}], "max_tokens": 16, "temperature": 0}})

    model: ModelName
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=1, description="Only n=1 is served.")
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stream: Literal[False] = Field(False, description="Streaming is not served; omit or send false.")
    tools: list[ChatTool] | None = Field(None, min_length=1, max_length=MAX_TOOLS, description="Functions the model may call (OpenAI format).")
    tool_choice: Literal["auto"] | None = Field(None, description="Only `auto` is served (the model sees the tools and may call one or answer).")
    parallel_tool_calls: Literal[True] | None = Field(None, description="Only true is served (the model's calls are not restricted).")
    logprobs: Literal[False] | None = Field(None, description="Log probabilities are not served; omit or send false.")
    top_logprobs: None = Field(None, description="Log probabilities are not served; omit.")
    response_format: _TextFormat | None = Field(None, description="Only `{\"type\": \"text\"}` is served (no guided decoding).")
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0, description="Only 0 is served.")
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0, description="Only 0 is served.")
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = Field(None, description="Not served; omit or send {}.")
    stream_options: None = Field(None, description="Streaming is not served; omit.")
    modalities: list[Literal["text"]] | None = Field(None, description="Only text is served.")
    audio: None = Field(None, description="Audio output is not served; omit.")
    prediction: None = Field(None, description="Predicted outputs are not served; omit.")
    web_search_options: None = Field(None, description="Web search is not served; omit.")
    reasoning_effort: None = Field(None, description="Not served: thinking is a benchmark's evaluation setting; omit.")
    functions: None = Field(None, description="Deprecated by OpenAI and not served: use `tools`.")
    function_call: None = Field(None, description="Deprecated by OpenAI and not served: use `tools`.")
    user: str | None = Field(None, max_length=256, description="Accepted and not used (an end-user id).")
    metadata: dict[str, str] | None = Field(None, max_length=16, description="Accepted and not used.")
    store: bool | None = Field(None, description="Accepted and not used (completions are logged per run regardless).")
    service_tier: str | None = Field(None, max_length=32, description="Accepted and not used.")
    safety_identifier: str | None = Field(None, max_length=256, description="Accepted and not used (an end-user id).")
    prompt_cache_key: str | None = Field(None, max_length=256, description="Accepted and not used: the engine's prefix cache keys on the prompt itself.")
    prompt_cache_retention: Literal["in_memory", "24h"] | None = Field(None, description="Accepted and not used (a cache-lifetime hint).")
    prompt_cache_options: dict[str, Any] | None = Field(None, description="Accepted and not used (a cache-lifetime hint).")
    verbosity: None = Field(None, description="Not served; omit.")
    moderation: None = Field(None, description="Moderation is not served; omit.")

    @field_validator("messages")
    @classmethod
    def _chars(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if sum(len(m.content) for m in messages) > MAX_PROMPT_CHARS:
            raise ValueError(f"the messages total more than {MAX_PROMPT_CHARS} characters")
        return messages

    @model_validator(mode="after")
    def _tools_chars(self) -> ChatCompletionRequest:
        if self.tools and sum(len(m.content) for m in self.messages) + len(json.dumps(self.tool_dicts())) > MAX_PROMPT_CHARS:
            raise ValueError(f"the messages and tools (as JSON) total more than {MAX_PROMPT_CHARS} characters")
        return self

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """``tools`` as plain JSON objects (unset fields left out), as the engine renders them."""
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def completion_limit(self, default: int = 256) -> int:
        """Max completion tokens requested (``max_completion_tokens`` wins over ``max_tokens``)."""
        return self.max_completion_tokens or self.max_tokens or default

    def stop_list(self) -> list[str] | None:
        return [self.stop] if isinstance(self.stop, str) else self.stop


class ChatChoice(BaseModel):
    index: int
    message: ChatMessage
    finish_reason: Literal["stop", "length"]


class PromptTokensDetails(BaseModel):
    """How many prompt tokens were served from the engine's prefix cache (charged at the cached price)."""

    cached_tokens: int = 0


class Usage(BaseModel):
    """Token counts of one call (units: tokens), as OpenAI reports them."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class ChatCompletion(BaseModel):
    """OpenAI ``chat.completion`` object."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


# ----------------------------------------------------------------- harnesses, benchmarks, evaluations


class Harness(BaseModel):
    """A declarative harness: how the system turns a task into a prompt and a completion into an answer.

    ``user_template`` is a Jinja2 template (sandboxed) with ``question`` in scope. ``answer_extraction`` names a
    mode of :mod:`services.common.extraction` (the field's schema lists them, each with what it reads).
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {
        "system_prompt": "Answer with the final number only.", "user_template": "{{ question }}", "answer_extraction": "first_line"}})

    system_prompt: str | None = Field(None, max_length=8000)
    user_template: str = Field("{{ question }}", max_length=8000)
    max_tokens: int = Field(32, ge=1, le=4096, description="Completion tokens per call.")
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: list[str] | None = Field(None, max_length=4)
    answer_extraction: str = Field("first_line", json_schema_extra=lambda schema: schema.update(extraction.json_schema()))
    answer_regex: str | None = Field(None, max_length=500)
    max_turns: int = Field(1, ge=1, le=1, description="Single-turn harnesses only in this version.")

    @field_validator("answer_extraction", mode="before")
    @classmethod
    def _registered_mode(cls, value: Any) -> Any:
        """Accept the name of a registered mode (:data:`services.common.extraction.MODES`) only, failing as a
        ``Literal`` of the names would (``literal_error``, "Input should be 'strip', … or 'boxed'")."""
        if isinstance(value, str) and value in extraction.MODES:
            return value
        *names, last = (repr(name) for name in extraction.MODES)
        expected = f"{', '.join(names)} or {last}" if names else last
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})


class SystemSpec(BaseModel):
    """A system = model (base name or ``ckpt_…``) + harness (``None``: the suite's default harness)."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName
    harness: Harness | None = None


class SplitSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int | None = Field(None, description="Generator seed; the test split's seed lives only in the grader's configuration.")
    size: int = Field(ge=1, le=100_000)


class SuiteSplits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train: SplitSpec
    validation: SplitSpec
    test: SplitSpec


class SuiteSpec(BaseModel):
    """Which suite, with which parameters (passed to its generator), and its split sizes and seeds."""

    model_config = ConfigDict(extra="forbid")

    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    splits: SuiteSplits


class EvaluationSettings(BaseModel):
    """How systems are evaluated (VibeTraining-Bench's Table 6 lists the same knobs): turns, context length,
    caps on the harness, thinking mode, samples per item and the metric."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(1, ge=1)
    context_tokens: int | None = Field(
        None, ge=128, le=131_072,
        description="Context length (prompt + completion tokens) the model runs with; an item whose prompt and max_tokens do not fit "
                    "scores 0. Null: the model's own context window.")
    max_tokens: int = Field(64, ge=1, le=4096, description="Cap on the harness's max_tokens (output tokens per call).")
    temperature: float | None = Field(0.0, ge=0.0, le=2.0, description="Fixed temperature; null lets the harness choose.")
    thinking: bool | None = Field(None, description="Thinking mode on or off, for models that have one; null: the model's default.")
    samples: int = Field(1, ge=1, le=64, description="k: samples per item.")
    metric: Literal["avg@k", "pass@k"] = "avg@k"


class AuditSettings(BaseModel):
    """Contamination audit at final submission: n-gram overlap of the run's datasets with the test split."""

    model_config = ConfigDict(extra="forbid")

    ngram: int = Field(13, ge=4, le=50, description="n of the n-grams compared (tokens after normalization).")
    min_overlap: float = Field(0.5, gt=0.0, le=1.0, description="A test item is flagged when this share of its n-grams occurs in one dataset row.")


class GradingSpec(BaseModel):
    """What the grader needs to know about a benchmark (sent by the gateway when it is registered)."""

    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(description="The grader's id of this task (one benchmark of several tasks has one per task).")
    task: str = Field("main", description="The task's name in its benchmark.")
    suite: SuiteSpec
    initial_system: SystemSpec
    reference_system: SystemSpec | None = None
    reference_score: float | None = Field(None, ge=0.0, le=1.0)
    evaluation: EvaluationSettings
    audit: AuditSettings = Field(default_factory=AuditSettings)


class EvaluationCreate(BaseModel):
    """Evaluate a system on the validation split."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {"model": "ckpt_01jd3k4m5n6p7q8r9s0t1v2w3x", "split": "validation"}})

    model: ModelName = Field(description="Base model name or `ckpt_…`.")
    harness: Harness | None = Field(None, description="Omit for the suite's default harness.")
    split: Literal["validation"] = "validation"
    limit: int | None = Field(None, ge=1, description="Evaluate only the first `limit` validation items.")


class EvaluationLimits(BaseModel):
    """A run's allowance of validation evaluations, as EvalAI phases limit submissions; ``None``: no limit.

    Failed or cancelled evaluations do not count towards ``per_hour``/``per_day`` but have their own cap,
    so failing on purpose cannot buy extra feedback.
    """

    model_config = ConfigDict(extra="forbid")

    per_hour: int | None = Field(None, ge=0, description="Validation evaluations started in any 60-minute window.")
    per_day: int | None = Field(None, ge=0, description="Validation evaluations started in any 24-hour window.")
    concurrent: int | None = Field(4, ge=1, description="Validation evaluations queued or running at once.")
    failed: int | None = Field(10, ge=0, description="Failed or cancelled validation evaluations over the whole run.")


class EvaluationUsage(BaseModel):
    """How much of its evaluation allowance a run has used (counts of validation evaluations)."""

    last_hour: int = Field(description="Started in the last 60 minutes (not failed or cancelled).")
    last_day: int = Field(description="Started in the last 24 hours (not failed or cancelled).")
    active: int = Field(description="Queued or running now.")
    failed: int = Field(description="Failed or cancelled, ever.")
    total: int = Field(description="All validation evaluations of the run.")


class Score(BaseModel):
    """An aggregate score in [0, 1] over ``n`` items with its metric and a 95% bootstrap confidence interval
    (percentile bootstrap over items, 2,000 resamples, fixed seed: the same scores give the same interval)."""

    value: float
    n: int
    metric: str
    k: int
    ci_low: float | None = Field(None, description="Lower end of the 95% bootstrap confidence interval (null for n = 0).")
    ci_high: float | None = Field(None, description="Upper end of the 95% bootstrap confidence interval (null for n = 0).")


class EvaluationOut(BaseModel):
    """An evaluation of a system on a split. Per-item trajectories exist for validation only."""

    id: str
    object: Literal["evaluation"] = "evaluation"
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    task: str = Field("main", description="The benchmark's task evaluated.")
    split: Literal["validation", "test"]
    model: str
    harness: Harness
    items_total: int
    items_done: int
    score: Score | None = None
    attempts: int = Field(0, description="Times a worker started the evaluation; above 1 after a worker was lost and it resumed.")
    error: str | None = None
    created_at: dt.datetime
    finished_at: dt.datetime | None = None


class TrajectoryOut(BaseModel):
    """One validation item's trajectory: the prompt sent, the completion, the extracted answer, its score."""

    item_id: str
    sample: int
    question: str
    messages: list[ChatMessage]
    completion: str
    answer: str | None
    expected: str
    score: float
    score_error: str | None = Field(None, description="Why the suite's scorer could not score the answer (it raised, ran past its time "
                                                      "limit, or its process died), as '<error type>: <message>'; the score is then 0. "
                                                      "Null when the answer was scored.")
    prompt_tokens: int
    completion_tokens: int


class SubmissionCreate(BaseModel):
    """Submit the final system; it is graded once on the hidden test split."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {"model": "ckpt_01jd3k4m5n6p7q8r9s0t1v2w3x"}})

    model: ModelName
    harness: Harness | None = None
    note: str | None = Field(None, max_length=2000)


class SubmissionOut(BaseModel):
    """A final submission. ``score`` is the aggregate on the hidden test split (no per-item results, ever).

    A failed grading says whose fault it was (``failure_cause``): ``agent`` when the submitted system cannot be
    evaluated (inference refuses its model or the requests its harness makes), ``platform`` otherwise (an error
    in the grader, a worker lost past its retries, grading past its time limit). Only a platform failure gives
    the submission back (``counted`` false).
    """

    id: str
    object: Literal["submission"] = "submission"
    status: Literal["queued", "running", "graded", "failed"]
    task: str = Field("main", description="The benchmark's task this system is submitted for.")
    model: str
    harness: Harness
    score: Score | None = None
    error: str | None = Field(None, description="Why grading failed (never a test item or a per-item result).")
    failure_cause: Literal["agent", "platform"] | None = Field(
        None, description="Whose fault a failed grading is: 'agent' (the submitted system) or 'platform'; null unless failed.")
    counted: bool = Field(True, description="Uses up one of the task's final submissions: every submission except one whose grading "
                                            "failed by the platform's fault.")
    created_at: dt.datetime
    graded_at: dt.datetime | None = None


class SuiteItemOut(BaseModel):
    """A visible suite item (train sample or validation): its question and reference answer."""

    id: str
    question: str
    answer: str


class GradingTaskStatus(BaseModel):
    """The grader's view of one task of a benchmark: its split sizes, and its initial (and reference) system's
    aggregate score on the hidden test split with the state of that grading. Scores are in [0, 1]."""

    task_id: str = Field(description="The grader's id of the task (the benchmark's id for a one-task benchmark).")
    validation_items: int = Field(description="Visible validation items.")
    test_items: int = Field(description="Hidden test items.")
    initial: Score | None = Field(None, description="The initial system's test score; null until graded.")
    initial_status: Literal["queued", "running", "succeeded", "failed", "cancelled"] | None = Field(
        None, description="State of the initial system's grading.")
    reference: Score | None = Field(None, description="The reference system's test score, or the declared reference score (n = 0).")
    reference_status: Literal["queued", "running", "succeeded", "failed", "cancelled", "declared"] | None = Field(
        None, description="State of the reference system's grading; 'declared' for a declared score, null without a reference.")
    initial_system: SystemSpec = Field(description="The initial system, its harness with the task's evaluation settings applied.")


class BenchmarkBaselines(BaseModel):
    """An operator's view of a benchmark's baselines: each task's :class:`GradingTaskStatus` under ``tasks`` (by task
    name), and the states summed up over the tasks: ``succeeded`` once all have, ``failed`` if one has, else
    ``running``; a reference only declared (a score, no system graded) is ``declared``, and ``null`` when no task has
    a reference."""

    benchmark_id: str = Field(examples=["bm_01jd3k4m5n6p7q8r9s0t1v2w3x"])
    tasks: dict[str, GradingTaskStatus]
    initial_status: Literal["running", "succeeded", "failed"]
    reference_status: Literal["running", "succeeded", "failed", "declared"] | None
