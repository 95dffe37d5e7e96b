"""Wire models shared by the gateway (public API) and the service that owns each noun.

The gateway documents and returns exactly what the owning service returns, so both import these
models from here; models only one service uses live in that service's ``schemas.py``.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from services.common import extraction, recipes
from services.common.graders import Grader
from services.common.openai_protocol import ChatMessage, ModelName

Recipe = recipes.recipe_model()
"""How to train: ``method``, ``adapter`` and hyper-parameters, derived from the registered methods
(:mod:`services.common.recipes`)."""


TRAINING_FIELDS: tuple[str, ...] = tuple(Recipe.model_fields)
"""Every recipe field, each under the benchmark's allow/lock policy (the gateway's ``apply_recipe_policy``)."""


class DatasetOut(BaseModel):
    """An uploaded dataset: immutable, content-addressed by ``sha256``."""

    id: str = Field(examples=["ds_01jd3k4m5n6p7q8r9s0t1v2w3x"])
    object: Literal["dataset"] = "dataset"
    name: str
    format: Literal["messages", "prompt_completion", "preference", "prompt_only"]
    rows: int
    bytes: int
    sha256: str
    created_at: dt.datetime


class MergeSpec(BaseModel):
    """How a merge job (``recipe.method: merge``) combines checkpoints of one base model, all LoRA or all full weights.

    With ``τ_i`` checkpoint ``i``'s change to the base (full weights) or its LoRA factors (adapters, through PEFT's
    ``add_weighted_adapter``), ``linear`` is ``Σ w_i τ_i`` (weights summing to 1: a model soup, Wortsman et al. 2022;
    LoRA factors combined with √w_i each, PEFT's definition); ``ties`` trims each ``τ_i`` to its ``density`` largest
    entries, elects a sign per entry and averages the agreeing ones (Yadav et al. 2023); ``dare_linear`` and
    ``dare_ties`` first drop entries at random with probability ``1 - density`` and rescale the rest (Yu et al. 2024).
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, json_schema_extra={
        "example": {"checkpoints": ["ckpt_01jd3k4m5n6p7q8r9s0t1v2w3x", "ckpt_01jd3k4m5n6p7q8r9s0t1v2w3y"], "weights": [0.5, 0.5], "combination": "linear"}})

    checkpoints: list[str] = Field(min_length=1, max_length=8, description="The run's checkpoints to combine, all of the job's base model.")
    weights: list[Annotated[float, Field(ge=-10, le=10)]] | None = Field(
        None, description="One weight per checkpoint (default: equal weights summing to 1).")
    combination: Literal["linear", "ties", "dare_linear", "dare_ties"] = "linear"
    density: float = Field(0.5, gt=0, le=1, description="`ties`, `dare_*`: the share of each checkpoint's entries kept.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="`dare_*`: the seed of the random drop (the same seed gives the same checkpoint).")

    @field_validator("checkpoints")
    @classmethod
    def _each_once(cls, checkpoints: list[str]) -> list[str]:
        if len(set(checkpoints)) != len(checkpoints):
            raise PydanticCustomError("duplicate_checkpoint", "a checkpoint is named twice; give it a larger weight instead")
        return checkpoints

    @field_validator("weights")
    @classmethod
    def _one_weight_each(cls, weights: list[float] | None, info: ValidationInfo) -> list[float] | None:
        checkpoints = info.data.get("checkpoints")
        if weights is not None and checkpoints is not None and len(weights) != len(checkpoints):
            raise PydanticCustomError("weights_length", "{weights} weights for {checkpoints} checkpoints: give one weight per checkpoint",
                                      {"weights": len(weights), "checkpoints": len(checkpoints)})
        return weights

    def resolved_weights(self) -> list[float]:
        """The weights, or equal ones summing to 1."""
        return list(self.weights) if self.weights is not None else [1 / len(self.checkpoints)] * len(self.checkpoints)


class TrainingJobCreate(BaseModel):
    """Start a training job on uploaded datasets, from a base model or a parent checkpoint."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {"model": "smollm2-135m-instruct", "datasets": ["ds_01jd3k4m5n6p7q8r9s0t1v2w3x"], "recipe": {"method": "sft", "max_steps": 100}}})

    model: ModelName = Field(description=(
        "Base model name, or a `ckpt_…` to continue training from: a LoRA parent continues as LoRA (or is merged into the base for "
        "`adapter: full`); a full parent continues as full weights."))
    datasets: list[str] = Field(default_factory=list, max_length=16, description=(
        f"The datasets to train on: at least one for {recipes.names(m for m in recipes.METHODS.values() if m.trains and not m.rewarded)}; "
        "for `grpo`, `prompt_only` datasets (prompts of training-pool items) or none (the run's training pool, rendered by `harness`); "
        "none for a merge."))
    recipe: Recipe = Field(default_factory=Recipe)
    merge: MergeSpec | None = Field(None, description="`recipe.method: merge` only: the checkpoints to combine and how.")
    harness: Harness | None = Field(None, description=(
        "`recipe.method: grpo` only: the declarative harness that renders the training pool's prompts and extracts the answer the "
        "suite's scorer rewards (default: the task's initial system's harness)."))
    grader: Grader | None = Field(None, description=(
        "`recipe.method: grpo` only: reward each completion with this grader (OpenAI's grader spec: `string_check`, `text_similarity`, "
        "`python`, `score_model`, `label_model`, `multi`; `services.common.graders`) against its `prompt_only` row's other fields "
        "(`{{ item.<field> }}`), instead of the suite's scorer. Needs datasets and no harness."))


class TrainingJobOut(BaseModel):
    """A training job. ``status``: validating → queued → running → succeeded | failed | cancelled."""

    id: str
    object: Literal["training.job"] = "training.job"
    status: Literal["validating", "queued", "running", "paused", "succeeded", "failed", "cancelled"]
    model: str
    base_model: str
    datasets: list[str]
    recipe: Recipe
    merge: MergeSpec | None = None
    harness: Harness | None = None
    grader: Grader | None = None
    steps_done: int
    estimated_tokens: int
    trained_tokens: int
    prefill_tokens: int = Field(0, description="`grpo`: prompt tokens its rollouts computed (billed as `prefill_tokens`).")
    decode_tokens: int = Field(0, description="`grpo`: tokens its rollouts generated (billed as `decode_tokens`).")
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
    """A checkpoint written at ``step``: a LoRA adapter (``kind`` ``lora``) or full weights (``full``); pass its ``id`` as
    ``model`` to inference or evaluation, or to a new training job to continue from it."""

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


HarnessArchiveId = Annotated[str, Field(pattern=r"^har_[0-9a-z]{26}$", examples=["har_01jd3k4m5n6p7q8r9s0t1v2w3x"])]


class _OneHarness(BaseModel):
    """A system names a declarative ``harness`` or a ``harness_archive`` (a code harness), not both."""

    @field_validator("harness_archive", check_fields=False)
    @classmethod
    def _one_harness(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("harness") is not None:
            raise ValueError("give either harness (declarative) or harness_archive (code), not both")
        return value


class HarnessArchiveOut(BaseModel):
    """A code harness archive (``POST /v1/harnesses``): immutable, content-addressed by ``sha256``. ``platform``: a
    suite's own harness (every run may read it and use it, and download it to start an edited copy)."""

    id: str = Field(examples=["har_01jd3k4m5n6p7q8r9s0t1v2w3x"])
    object: Literal["harness"] = "harness"
    name: str
    sha256: str
    bytes: int
    entry: str = Field(description="The manifest's entry command.")
    install: str | None = Field(None, description="The manifest's install command.")
    platform: bool = False
    created_at: dt.datetime


class SystemSpec(_OneHarness):
    """A system = model (base name or ``ckpt_…``) + harness (``None``: the suite's default harness)."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName
    harness: Harness | None = None
    harness_archive: HarnessArchiveId | None = Field(None, description="A code harness (`har_…`) instead of `harness`.")


COLLECTION_NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"
CollectionName = Annotated[str, Field(pattern=COLLECTION_NAME, examples=["acme-hidden"],
                                      description="A collection of imported tasks: 1-63 of a-z 0-9 . _ -, starting with a letter or digit.")]
IMPORTED_TASK_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$"
ImportedTaskName = Annotated[str, Field(pattern=IMPORTED_TASK_NAME, description="A task's folder name or SWE-bench instance_id.")]


class ImportedTaskOut(BaseModel):
    """One task of an imported collection and where its validation stands."""

    name: ImportedTaskName
    status: Literal["pending", "accepted", "refused"] = Field(description="pending: not validated yet; accepted: its oracle resolved it "
                                                                         "and doing nothing did not; refused: see `reason`.")
    reason: str | None = Field(None, description="Why it was refused (the verifier's output tail where it ran).")


class TaskCollectionOut(BaseModel):
    """A collection of tasks an operator imported (``crucible admin import-tasks``), held in the grader's test store
    for hidden test splits (``suite.splits.test.collection``). Its tasks' content never leaves the grader."""

    name: CollectionName
    suite: Literal["terminal", "swe"]
    status: Literal["validating", "done"] = Field(description="done once every task is accepted or refused.")
    accepted: int
    refused: int
    pending: int
    tasks: list[ImportedTaskOut]
    created_at: dt.datetime


CANDIDATE_NAME = r"^candidate-[0-9]{2}$"
CandidateName = Annotated[str, Field(pattern=CANDIDATE_NAME, examples=["candidate-01"],
                                     description="A candidate system's opaque name in an evaluator-track run.")]


class SplitSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int | None = Field(None, description="Generator seed; the test split's seed lives only in the grader's configuration.")
    size: int = Field(ge=1, le=100_000)
    collection: CollectionName | None = Field(None, description="The test split only: drawn (by the grader's secret seed) from the accepted tasks "
                                                                "of this collection, imported with `crucible admin import-tasks`, instead of "
                                                                "generated by the suite.")


class SuiteSplits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train: SplitSpec
    validation: SplitSpec
    test: SplitSpec

    @field_validator("train", "validation")
    @classmethod
    def _public_split_generated(cls, split: SplitSpec, info: ValidationInfo) -> SplitSpec:
        if split.collection is not None:
            raise PydanticCustomError("collection_public", f"only the test split is drawn from an imported collection, not {info.field_name}")
        return split


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


class TargetRef(BaseModel):
    """One target of an evaluator-track benchmark as its evaluator task knows it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    task_id: str = Field(description="The target's grading task.")
    sealed: bool


class EvaluatorBudget(BaseModel):
    """What a frozen evaluator may spend on each candidate it scores (the benchmark sets it): model calls, tokens
    (prompt and completion, over all its calls), completion tokens per call, and wall-clock seconds in its sandbox.
    A call made once calls or tokens are spent is a 429; at ``wall_s`` the sandbox is ended."""

    model_config = ConfigDict(extra="forbid")

    calls: int = Field(200, ge=1, le=100_000, description="Model calls per candidate.")
    tokens: int = Field(200_000, ge=1, le=100_000_000, description="Prompt and completion tokens per candidate.")
    max_tokens: int = Field(256, ge=1, le=4096, description="Completion tokens per call at most.")
    wall_s: float = Field(600.0, gt=0, le=86_400, description="Seconds per candidate in the sandbox.")


class EvaluatorTask(BaseModel):
    """The evaluator track's own task: its targets (development and sealed) and the evaluator's budget per candidate."""

    model_config = ConfigDict(extra="forbid")

    targets: list[TargetRef] = Field(min_length=1)
    budget: EvaluatorBudget = Field(default_factory=lambda: EvaluatorBudget())


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
    target: Literal["development", "sealed"] | None = Field(None, description=(
        "An evaluator-track target: each of `candidates` is graded on it instead of the initial system, on its validation split "
        "(development: the scores are shown to the run) or its hidden test split (sealed: they never leave the grader)."))
    candidates: dict[CandidateName, SystemSpec] = Field(default_factory=dict, description=(
        "The evaluator track's candidate systems by opaque name (a target's, and the evaluator task's)."))
    evaluator: EvaluatorTask | None = Field(None, validate_default=True, description=(
        "The evaluator track's own task (suite `evaluator`, one item per candidate): the targets its evaluators are graded "
        "against and what an evaluator may spend per candidate."))

    @field_validator("evaluator")
    @classmethod
    def _track_has_candidates(cls, evaluator: EvaluatorTask | None, info: ValidationInfo) -> EvaluatorTask | None:
        track = info.data.get("target") is not None or evaluator is not None
        if track != bool(info.data.get("candidates")):
            raise PydanticCustomError("target_candidates", "a target or an evaluator task needs candidates, and only they have them")
        return evaluator


Ablation = Literal["null_model"]
"""An ablation of an evaluated system: ``null_model`` replaces its model by the null model, an endpoint that answers every
request with an empty assistant message, without an inference call and with zero tokens (``grader.model_endpoint``)."""


class EvaluationCreate(_OneHarness):
    """Evaluate a system on the validation split."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {"model": "ckpt_01jd3k4m5n6p7q8r9s0t1v2w3x", "split": "validation"}})

    model: ModelName | None = Field(None, description="Base model name or `ckpt_…` (required, except for the evaluator track's own task, "
                                                      "whose `harness_archive` is an evaluator run on the candidates).")
    harness: Harness | None = Field(None, description="A declarative harness; omit both harness fields for the suite's default.")
    harness_archive: HarnessArchiveId | None = Field(None, description="A code harness (`har_…`, `POST /v1/harnesses`) instead of `harness`.")
    split: Literal["validation"] = "validation"
    limit: int | None = Field(None, ge=1, description="Evaluate only the first `limit` validation items.")
    ablation: Ablation | None = Field(
        None, description="`null_model`: evaluate the system with its model replaced by a null model, which answers every request with an "
                          "empty assistant message (no inference call, zero tokens); what the harness scores without the model. Metered as "
                          "any evaluation (sandbox seconds; no model tokens). Not on the evaluator track.")
    candidates: list[CandidateName] | None = Field(
        None, min_length=2, max_length=99,
        description="The evaluator track's pilot on chosen candidates: run the evaluator on these (two or more, distinct) and grade it on "
                    "their pairs; default every candidate. Only the task `evaluator` takes it, and not with `limit`.")

    @field_validator("candidates")
    @classmethod
    def _distinct(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("each candidate at most once")
        return value


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
    harness: Harness | None = Field(description="The declarative harness evaluated, with the benchmark's settings applied; null for a code harness.")
    harness_archive: str | None = Field(None, description="The code harness evaluated (`har_…`); null for a declarative harness.")
    ablation: Ablation | None = Field(None, description="`null_model`: the system was evaluated with the null model in place of its model.")
    items_total: int
    items_done: int
    score: Score | None = None
    score_so_far: float | None = Field(None, description="While it runs: the mean score of the samples graded so far (their trajectories "
                                                         "are readable as they are graded); null before the first and once it ends.")
    attempts: int = Field(0, description="Times a worker started the evaluation; above 1 after a worker was lost and it resumed.")
    error: str | None = None
    created_at: dt.datetime
    started_at: dt.datetime | None = Field(None, description="When a worker first began it (null while queued).")
    finished_at: dt.datetime | None = None


class RolloutStep(BaseModel):
    """One turn of a rollout, as Harbor's ATIF (Agent Trajectory Interchange Format) records a step: who spoke
    (``system``/``user`` prompts the harness sent, ``agent`` the model's answer, ``environment`` a tool's or
    command's output the harness sent back), what was said, the model's tool calls, and the call's tokens."""

    step_id: int = Field(description="1, 2, … in order.")
    timestamp: str | None = Field(None, description="ISO 8601 UTC, for the agent's steps: when the answer came back.")
    source: Literal["system", "user", "agent", "environment"]
    message: str
    tool_calls: list[dict[str, Any]] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class RolloutRun(BaseModel):
    """How one sandboxed program of a rollout ended (the harness, or the task's verifier): exit status (``128 + n``
    when signal ``n`` ended it, ``-9`` when the sandbox was killed), the limit that ended it, seconds, output tails."""

    exit_code: int
    limit: Literal["wall", "cpu", "memory", "processes", "disk"] | None = None
    elapsed_s: float
    stdout: str = Field("", description="The last 16 KiB of standard output.")
    stderr: str = Field("", description="The last 16 KiB of standard error.")


class RolloutTrajectory(BaseModel):
    """A multi-turn rollout of one task (schema ``crucible-rollout/1``, modelled on Harbor's ATIF v1): a code harness's
    in its sandbox, or a conversation the grader drives (BFCL multi-turn). The model calls turned into steps, how the
    harness and the verifier ended, the reward and, for a failed rollout, why."""

    schema_version: Literal["crucible-rollout/1"] = "crucible-rollout/1"
    harness: str | None = Field(None, description="The harness archive (`har_…`); null for a conversation the grader drives.")
    model: str
    sandbox: str | None = Field(None, description="The sandbox backend (`bwrap` or `docker`); null for a conversation the grader drives.")
    steps: list[RolloutStep]
    harness_run: RolloutRun | None = None
    verifier_run: RolloutRun | None = None
    reward: float = Field(description="What the verifier wrote (reward.txt / reward.json), in [0, 1]; 0 for a failed rollout.")
    failure: str | None = Field(None, description="Why the rollout failed (a limit, a crash, a verifier with no reward); null otherwise.")
    model_calls: int
    prompt_tokens: int
    completion_tokens: int


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
    rollout: RolloutTrajectory | None = Field(None, description="A code harness's rollout, turn by turn; null for a declarative harness.")


class SubmissionCreate(_OneHarness):
    """Submit the final system; it is graded once on the hidden test split."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {"model": "ckpt_01jd3k4m5n6p7q8r9s0t1v2w3x"}})

    model: ModelName | None = Field(None, description="Base model name or `ckpt_…` (required, except for the evaluator track's own task, "
                                                      "whose `harness_archive` is the evaluator to freeze).")
    harness: Harness | None = None
    harness_archive: HarnessArchiveId | None = Field(None, description="A code harness (`har_…`) instead of `harness`.")
    note: str | None = Field(None, max_length=2000)


class SubmissionOut(BaseModel):
    """A final submission. ``score`` is the aggregate on the hidden test split (no per-item results, ever).

    A failed grading says whose fault it was (``failure_cause``): ``agent`` when the submitted system cannot be
    evaluated (inference refuses its model or the requests its harness makes), ``platform`` otherwise (an error
    in the grader, a worker lost past its retries, grading past its time limit). Only a platform failure gives
    the submission back (``counted`` false). A submission is graded twice, as submitted and with the null model in
    place of its model (``model_free_score``): it is ``graded`` once both are, with both scores, and ``failed`` once
    either failed.
    """

    id: str
    object: Literal["submission"] = "submission"
    status: Literal["queued", "running", "graded", "failed"]
    task: str = Field("main", description="The benchmark's task this system is submitted for.")
    model: str
    harness: Harness | None = Field(description="The declarative harness submitted; null for a code harness.")
    harness_archive: str | None = Field(None, description="The code harness submitted (`har_…`); null for a declarative harness.")
    score: Score | None = None
    model_free_score: Score | None = Field(None, description="The null-model ablation's score on the hidden test split: the submitted "
                                                             "harness with an empty-answering model in place of its model (null until graded).")
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


class PoolPromptsRequest(BaseModel):
    """Ask for the training pool's prompts as a harness renders them (GRPO's prompts; the trainer asks for a run)."""

    model_config = ConfigDict(extra="forbid")

    harness: Harness | None = Field(None, description="Default: the task's initial system's declarative harness.")


class PoolPrompt(BaseModel):
    """One training-pool item's prompt: the chat ``messages`` the harness renders for it."""

    item_id: str
    messages: list[dict[str, str]]


class PoolCompletion(BaseModel):
    """A completion the policy generated for a training-pool item."""

    model_config = ConfigDict(extra="forbid")

    item_id: str = Field(max_length=200)
    completion: str = Field(max_length=200_000)


class RewardRequest(BaseModel):
    """Score completions of training-pool items with the suite's scorer (GRPO's rewards). Validation and test items
    are never scored here."""

    model_config = ConfigDict(extra="forbid")

    harness: Harness | None = Field(None, description="Extracts the answer (default: the task's initial system's declarative harness).")
    completions: list[PoolCompletion] = Field(min_length=1, max_length=4096)


class Reward(BaseModel):
    """One completion's reward in [0, 1]: the suite's score of the ``answer`` the harness extracted (``None``: none was
    found), and why it is 0 when the scorer could not score it (``reason``)."""

    item_id: str
    reward: float
    answer: str | None = None
    reason: str | None = None


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
    splits: Literal["building", "ready", "failed"] = Field(
        "ready", description="The build of the task's splits, in the background: 'building' until they are drawn and stored (then "
                             "the baselines are queued), 'failed' with the reason in 'splits_error'. Validation items are 0 until ready.")
    splits_error: str | None = Field(None, description="Why the build failed, or why it is being retried (for the operator only: it may "
                                                       "speak of the hidden split).")
    warnings: list[str] = Field(default_factory=list, description="For the operator, once the splits are built: e.g. a task whose items are "
                                                                  "few enough to enumerate. Depends on public inputs only.")


class BenchmarkBaselines(BaseModel):
    """An operator's view of a benchmark's baselines: each task's :class:`GradingTaskStatus` under ``tasks`` (by task
    name), and the states summed up over the tasks: ``succeeded`` once all have, ``failed`` if one has, else
    ``running``; a reference only declared (a score, no system graded) is ``declared``, and ``null`` when no task has
    a reference."""

    benchmark_id: str = Field(examples=["bm_01jd3k4m5n6p7q8r9s0t1v2w3x"])
    tasks: dict[str, GradingTaskStatus]
    initial_status: Literal["running", "succeeded", "failed"]
    reference_status: Literal["running", "succeeded", "failed", "declared"] | None


# ----------------------------------------------------------------- the evaluator track


class CandidateEvaluation(BaseModel):
    """One run of an evaluator on one candidate: the score it printed (or the weighted mean of the items it finished,
    ``partial``), its per-domain scores, what it spent, and the seed's failure modes: ``exhausted`` (which of its
    budgets ran out), ``truncated_calls`` (answers cut at the token limit: ``finish_reason`` ``length``) and
    ``top_items_share`` (the largest share of a domain's score, or the score's, that its 3 most influential items
    carry). ``failure``: why it gave no score."""

    candidate: CandidateName
    score: float | None = Field(None, ge=0.0, le=1.0)
    domains: dict[str, float] = Field(default_factory=dict)
    items: int = Field(0, description="Item results it printed.")
    partial: bool = Field(False, description="It printed no final score: the score is the weighted mean of the items it finished.")
    exhausted: list[Literal["calls", "tokens", "wall"]] = Field(default_factory=list)
    truncated_calls: int = 0
    top_items_share: float | None = None
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    sandbox_s: int = 0
    failure: str | None = None


class CandidateScore(BaseModel):
    """A development target's score of one candidate (``None`` until graded): what the run may compare its evaluator
    with. A sealed target's never leave the grader."""

    candidate: CandidateName
    score: Score | None = None


class TargetAgreement(BaseModel):
    """How an evaluator's scores of the candidates agree with one target's (:mod:`grader.agreement`): the share of
    candidate pairs ordered alike with its 95 % bootstrap interval over pairs, Kendall's τ-b, Lin's concordance, and
    the ceiling (the other targets' agreement with this one)."""

    target: str
    pairwise_agreement: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    kendall_tau: float | None = None
    concordance: float | None = None
    ceiling: float | None = None


class EvaluatorGrade(BaseModel):
    """A frozen evaluator's grade: its agreement with each sealed target and their mean (``pairwise_agreement`` is the
    headline), the ceiling's mean, what it cost over every candidate, and its diagnostics. No per-candidate target
    score ever appears here."""

    pairwise_agreement: float | None = Field(description="Mean over the sealed targets.")
    kendall_tau: float | None = None
    concordance: float | None = None
    ceiling: float | None = None
    targets: list[TargetAgreement]
    candidates: int
    model_calls: int
    prompt_tokens: int
    completion_tokens: int
    sandbox_s: int
    exhausted: int = Field(description="Candidates on which a budget ran out.")
    partial: int = Field(description="Candidates scored from the items finished (no final score printed).")
    failed: int = Field(description="Candidates it gave no score (ranked lowest).")
    truncated_share: float | None = Field(None, description="Share of its model calls whose answer was cut at the token limit.")
    top_items_share: float | None = Field(None, description="Largest share of a score its 3 most influential items carry, over candidates.")
