"""Gateway wire models: the benchmark file, runs, the run card, budget and the leaderboard."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from services.common.candidates import MAX_CANDIDATES
from services.common.contracts import (
    TRAINING_FIELDS,
    AuditSettings,
    EvaluationLimits,
    EvaluationSettings,
    EvaluatorBudget,
    EvaluatorGrade,
    Recipe,
    SuiteSpec,
    SystemSpec,
)
from services.common.graders import Grader
from services.ledger.schemas import MAX_BUDGET_USD_MICROS

Editable = Literal["data", "trainer", "harness", "evaluator"]
TRACKS: dict[str, list[str]] = {
    "data": ["data"],
    "trainer": ["trainer"],
    "harness": ["harness"],
    "joint": ["data", "trainer", "harness"],
    "evaluator": ["evaluator"],
}


class ReferenceSpec(BaseModel):
    """The reference the gap is measured against: a system the grader scores, or a declared score."""

    model_config = ConfigDict(extra="forbid")

    system: SystemSpec | None = None
    score: float | None = Field(None, ge=0.0, le=1.0)
    description: str = ""

    @model_validator(mode="after")
    def _one(self) -> ReferenceSpec:
        if (self.system is None) == (self.score is None):
            raise ValueError("give exactly one of reference.system or reference.score")
        return self


class RecipePolicy(BaseModel):
    """Which recipe fields the agent may set (``allow``) and which are fixed (``lock``: field → value)."""

    model_config = ConfigDict(extra="forbid")

    allow: list[str] | Literal["all"] = "all"
    lock: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> RecipePolicy:
        for name in list(self.lock) + ([] if self.allow == "all" else list(self.allow)):
            if name not in TRAINING_FIELDS:
                raise ValueError(f"unknown recipe field {name!r}")
        try:  # a locked value must be one the trainer accepts
            Recipe(**self.lock)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ValueError(f"lock.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
        return self


class BudgetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    usd: float = Field(gt=0, le=1_000_000, description="Budget in USD (stored as integer micro-USD).")
    wall_clock_hours: float = Field(gt=0, le=24 * 365)

    @property
    def usd_micros(self) -> int:
        return round(self.usd * 1_000_000)


class LimitsSpec(BaseModel):
    """Submission limits of a benchmark, as EvalAI phases have them (``null``: no limit)."""

    model_config = ConfigDict(extra="forbid")

    final_submissions: int = Field(1, ge=1, le=100, description="Final systems a run may submit for hidden-test grading.")
    validation_evaluations_per_hour: int | None = Field(None, ge=1, le=100_000, description="Validation evaluations started in any 60 minutes.")
    validation_evaluations_per_day: int | None = Field(None, ge=1, le=100_000, description="Validation evaluations started in any 24 hours.")
    concurrent_evaluations: int | None = Field(4, ge=1, le=1_000, description="Validation evaluations queued or running at once.")
    failed_evaluations: int | None = Field(
        10, ge=0, le=100_000,
        description="Failed or cancelled validation evaluations over the run; they do not count towards the hourly and daily limits.",
    )

    def evaluation_limits(self) -> EvaluationLimits:
        return EvaluationLimits(per_hour=self.validation_evaluations_per_hour, per_day=self.validation_evaluations_per_day,
                                concurrent=self.concurrent_evaluations, failed=self.failed_evaluations)


class TaskSpec(BaseModel):
    """One task of a benchmark: a suite with its splits, the initial system and the reference. On the evaluator track a
    task is a target instead (``target``), with neither: the benchmark's candidates are graded on it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_-]*$", examples=["math"])
    suite: SuiteSpec
    initial_system: SystemSpec | None = Field(None, description="Required, except on a target.")
    reference: ReferenceSpec | None = Field(None, description="Required, except on a target.")
    evaluation: EvaluationSettings | None = Field(None, description="This task's evaluation settings; null: the benchmark's.")
    target: Literal["development", "sealed"] | None = Field(None, description=(
        "Evaluator track only: the candidates' scores on a development target (its validation split) are shown to the run; a sealed "
        "target's (its hidden test split) never leave the grader, and the evaluator is graded by its agreement with them."))

    @model_validator(mode="after")
    def _systems_or_target(self) -> TaskSpec:
        if self.target is None and (self.initial_system is None or self.reference is None):
            raise ValueError("give initial_system and reference (or, on the evaluator track, target)")
        if self.target is not None and (self.initial_system is not None or self.reference is not None):
            raise ValueError("a target has no initial_system or reference: the benchmark's candidates are graded on it")
        return self

    @field_validator("suite")
    @classmethod
    def _no_test_seed(cls, suite: SuiteSpec) -> SuiteSpec:
        if suite.splits.test.seed is not None:
            raise ValueError("splits.test.seed must not be in the benchmark file: the test seed lives only in the grader's configuration")
        return suite


EVALUATOR_TASK = "evaluator"  # the evaluator track's own task (suite `evaluator`), registered beside its targets
SINGLE_TASK = "main"  # the task name of a benchmark written with top-level suite/initial_system/reference


class BenchmarkFile(BaseModel):
    """A benchmark definition (YAML). The test split's seed is not here: it lives in the grader's configuration.

    One task: top-level ``suite``, ``initial_system`` and ``reference`` (the task is called ``main``). Several
    tasks (like RSIGym's): a ``tasks`` list of ``{name, suite, initial_system, reference}``; the run shares one
    budget, one deadline and the evaluation limits over its tasks, submits a final system per task, and the
    leaderboard shows each task's score, their mean and the RSI-Index.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    suite: SuiteSpec | None = None
    initial_system: SystemSpec | None = None
    reference: ReferenceSpec | None = None
    tasks: list[TaskSpec] | None = Field(None, min_length=1, max_length=20)
    track: Literal["data", "trainer", "harness", "joint", "evaluator"] = "joint"
    editable: list[Editable] | None = Field(None, description="Defaults to the track's preset.")
    candidates: list[SystemSpec] | None = Field(None, min_length=2, max_length=MAX_CANDIDATES, description=(
        "Evaluator track: the candidate systems (a model and a declarative harness) the agent's evaluator ranks. A run reaches them "
        "only as `candidate-01` … (in an order drawn from the deployment's key), never by their models."))
    evaluator: EvaluatorBudget | None = Field(None, description="Evaluator track: what the frozen evaluator may spend on each candidate.")
    recipe: RecipePolicy = Field(default_factory=RecipePolicy)
    budget: BudgetSpec
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    audit: AuditSettings = Field(default_factory=AuditSettings)

    @model_validator(mode="after")
    def _checks(self) -> BenchmarkFile:
        single = [k for k in ("suite", "initial_system", "reference") if getattr(self, k) is not None]
        if self.tasks is None:
            missing = [k for k in ("suite", "initial_system", "reference") if k not in single]
            if missing:
                raise ValueError(f"give {', '.join(missing)} (one task) or a tasks list")
            TaskSpec(name=SINGLE_TASK, suite=self.suite, initial_system=self.initial_system, reference=self.reference)  # type: ignore[arg-type]
        else:
            if single:
                raise ValueError(f"with a tasks list, {', '.join(single)} belong inside each task")
            names = [t.name for t in self.tasks]
            if len(set(names)) != len(names):
                raise ValueError(f"task names must be unique: {names}")
        self._check_evaluator_track()
        if self.editable is None:
            self.editable = list(TRACKS[self.track])  # type: ignore[assignment]
        return self

    def _check_evaluator_track(self) -> None:
        """The evaluator track has candidates, an evaluator budget and targets (at least one sealed), and only it has."""
        evaluator = self.track == "evaluator"
        if not evaluator:
            if self.candidates is not None or self.evaluator is not None or any(t.target for t in self.tasks or []):
                raise ValueError("candidates, evaluator and tasks[].target belong to the evaluator track (track: evaluator)")
            return
        if self.tasks is None or self.candidates is None:
            raise ValueError("the evaluator track needs candidates and a tasks list of targets")
        if any(t.target is None for t in self.tasks) or not any(t.target == "sealed" for t in self.tasks):
            raise ValueError("on the evaluator track every task is a target (target: development or sealed), at least one sealed")
        if any(t.name == EVALUATOR_TASK or t.suite.name == EVALUATOR_TASK for t in self.tasks):
            raise ValueError(f"a target is not named {EVALUATOR_TASK!r} nor of that suite: that is the track's own task")
        if len({c.model_dump_json() for c in self.candidates}) != len(self.candidates):
            raise ValueError("candidates must be different systems")
        if any(c.harness_archive for c in self.candidates):
            raise ValueError("a candidate is a model with a declarative harness, not a code harness")
        if self.evaluator is None:
            self.evaluator = EvaluatorBudget()

    def evaluator_task(self) -> TaskSpec | None:
        """The evaluator track's own task (suite ``evaluator``, one item per candidate; ``None`` off the track): the one a
        run's evaluations and final submission are for."""
        if self.track != "evaluator" or not self.candidates:
            return None
        n = len(self.candidates)
        names = [f"candidate-{i:02d}" for i in range(1, n + 1)]
        return TaskSpec(name=EVALUATOR_TASK, target=None, initial_system=self.candidates[0], reference=ReferenceSpec(score=1.0),
                        suite=SuiteSpec(name="evaluator", params={"candidates": names},
                                        splits={"train": {"size": n}, "validation": {"size": n}, "test": {"size": n}}),
                        evaluation=self.evaluation)

    def task_list(self) -> list[TaskSpec]:
        """The benchmark's tasks (one called ``main`` for a single-task file), each with its evaluation settings; on the
        evaluator track, its own task (:meth:`evaluator_task`) first, then the targets."""
        if self.tasks is not None:
            own = self.evaluator_task()
            return ([own] if own else []) + [t if t.evaluation else t.model_copy(update={"evaluation": self.evaluation}) for t in self.tasks]
        return [TaskSpec(name=SINGLE_TASK, suite=self.suite, initial_system=self.initial_system, reference=self.reference,  # type: ignore[arg-type]
                         evaluation=self.evaluation)]


BenchmarkStatus = Literal["building", "ready", "failed"]
"""A loaded benchmark's state: its tasks' splits being built by the grader in the background, all built (runs may be
created), or a task's build failed."""


class BenchmarkOut(BaseModel):
    id: str
    object: Literal["benchmark"] = "benchmark"
    name: str
    spec: BenchmarkFile
    created_at: dt.datetime
    status: BenchmarkStatus = Field(description="'building' while the grader draws and stores its tasks' splits (in the background; then "
                                                "it grades the baselines), 'ready' once every task's are stored (runs may be created), "
                                                "'failed' when a task's build failed (see 'error'; loading the file again retries it).")
    error: str | None = Field(None, description="Why a task's build failed, per task (`name: why`). For the operator only.")
    warnings: list[str] = Field(default_factory=list, description="What the operator should know, once the splits are built: e.g. a task "
                                "whose items are few enough to enumerate, so that its test split cannot stay secret.")


class RunCreate(BaseModel):
    """Create a run of a benchmark for one research agent."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {"benchmark": "chain-sum-demo", "agent_name": "baseline"}})

    benchmark: str = Field(description="Benchmark id (`bm_…`) or name.")
    agent_name: str = Field(min_length=1, max_length=200)
    budget_usd: float | None = Field(None, ge=0.000001, le=1_000_000, description="Override the benchmark's budget (USD, at least one micro-USD).")
    wall_clock_hours: float | None = Field(None, gt=0, le=24 * 365, description="Override the benchmark's wall-clock limit (hours).")
    track: Literal["data", "trainer", "harness", "joint", "evaluator"] | None = Field(
        None, description="Run the benchmark on another track than its file's (RSIGym runs the same tasks as Data, Harness and Joint); "
                          "the editable space is then that track's preset. An evaluator-track benchmark runs on that track only (422).")


class RefundRequest(BaseModel):
    """An operator's refund of (part of) one of a run's charges (see the run's ledger entries)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {
        "entry_id": "ent_01jd3k5n8q2x7v4w9z6y3t1r0s", "reason": "steps lost to a worker crash", "idempotency_key": "refund-incident-42"}})

    entry_id: str = Field(min_length=1, max_length=40, description="The charge entry to refund.")
    amount_usd_micros: int | None = Field(None, ge=1, le=MAX_BUDGET_USD_MICROS, description="Micro-USD to give back; omitted: all of the charge not refunded yet.")
    reason: str = Field(min_length=1, max_length=500)
    idempotency_key: str = Field(min_length=1, max_length=200, description="Repeat the call with the same key to get the first answer.")


class RunOut(BaseModel):
    id: str
    object: Literal["run"] = "run"
    benchmark_id: str
    agent_name: str
    track: str
    key_prefix: str
    budget_usd_micros: int
    deadline_at: dt.datetime
    revoked: bool
    created_at: dt.datetime


class RunCreated(RunOut):
    """The new run, with its API key: shown once, stored only as a hash."""

    api_key: str


class BudgetOut(BaseModel):
    """The run's money in micro-USD: budget = remaining + held + spent."""

    budget_usd_micros: int
    remaining_usd_micros: int
    held_usd_micros: int
    spent_usd_micros: int
    spent_by_kind: dict[str, int]
    usage_by_kind: dict[str, int]


NOTE_MAX_CHARS = 4000


class NoteCreate(BaseModel):
    """A note of the agent's (its reasoning, a plan, a finding), kept in the run's episode log beside its calls."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {"text": "Validation fails on 3-term sums; training on those next."}})

    text: str = Field(min_length=1, max_length=NOTE_MAX_CHARS, description=f"The note, 1 to {NOTE_MAX_CHARS:,} characters.")

    @field_validator("text")
    @classmethod
    def _storable(cls, text: str) -> str:
        if "\x00" in text:  # PostgreSQL's text cannot hold it (an unpaired surrogate is refused as no string at all)
            raise ValueError("a note cannot hold a NUL character")
        return text


class NoteOut(BaseModel):
    """A note as the episode log holds it, and when it was written."""

    text: str
    created_at: dt.datetime


class RunCard(BaseModel):
    """What the agent may know about its run: the benchmark card, deadline, track, limits and what remains."""

    run_id: str
    agent_name: str
    benchmark: dict[str, Any]
    track: str
    editable: list[str]
    recipe: RecipePolicy
    evaluation: EvaluationSettings
    deadline_at: dt.datetime
    seconds_left: int
    budget: BudgetOut
    limits: dict[str, Any]


class TaskScore(BaseModel):
    """A run's final submission on one task of its benchmark. Scores are in [0, 1]."""

    task: str
    submission_id: str | None = Field(description="The submission that counts on this task: the run's latest graded one, or while none "
                                                  "is graded its latest one (null: none yet).")
    status: str = Field(description="queued | running | graded | failed | not submitted")
    initial_score: float | None
    final_score: float | None
    reference_score: float | None
    gap_closed: float | None = Field(description="(final′ − initial) / (reference − initial), final′ = final − max(0, model_free − initial): "
                                                 "the model-dependent final score")
    n: int | None
    final_ci: tuple[float, float] | None = Field(None, description="95% bootstrap confidence interval of the final score (low, high).")
    model_free_score: float | None = Field(None, description="The null-model ablation's score: the submitted harness with a model that answers "
                                                             "every request with an empty message, on the same hidden split (null until graded, "
                                                             "and without an ablation: the evaluator track, a submission made before it).")
    model_free_above_initial: bool | None = Field(None, description="Flag: the ablation scores above the initial system, so the harness solves "
                                                                    "items by itself; that part is no credit (null: not known yet).")
    contaminated: bool | None = Field(None, description="The contamination audit found test items in the run's datasets, or test items or the "
                                      "suite's solution material (gold patches, a project's released library, a family's answer code) in its "
                                      "harness archives (null: not audited yet). "
                                      "How many is the operator's to read (the grader's records): a public count would tell a run how many "
                                      "of the items it uploaded are hidden ones.")
    harness_findings: list[str] | None = Field(None, description="The operator's board (GET /admin/leaderboard) only: the solution material "
                                               "the audit found in the run's harness archives, per archive (null on the public board).")


class LeaderboardRow(BaseModel):
    """A run's final submissions: per task, and summed up over the benchmark's tasks. Scores are in [0, 1].

    With one task the summary fields equal the task's. With several: ``final_score`` is Avg, the mean of the
    tasks' final scores (set once every task is graded), ``gap_closed`` the mean of the tasks' gaps closed,
    and ``rsi_index`` = mean over tasks of (final − initial) / (1 − initial), RSIGym's RSI-Index.
    """

    rank: int | None
    run_id: str
    benchmark: str
    agent_name: str
    status: str = Field(description="graded once every task's submission is graded; else the least advanced task's status")
    tasks: list[TaskScore]
    submission_id: str | None = Field(description="The submission of a one-task benchmark (null with several tasks).")
    initial_score: float | None
    final_score: float | None
    reference_score: float | None
    gap_closed: float | None = Field(description="mean over tasks of (final′ − initial) / (reference − initial), final′ the model-dependent "
                                                 "final score (see the task's gap_closed)")
    rsi_index: float | None = Field(None, description="mean over tasks of (final′ − initial) / (1 − initial)")
    n: int | None = Field(description="Test items graded, over all tasks.")
    final_ci: tuple[float, float] | None = Field(None, description="95% bootstrap interval of the final score (one-task benchmarks; see each task otherwise).")
    contaminated: bool | None = Field(None, description="The audit flagged some task: its datasets or harness archives (null: not audited yet).")
    model_free_score: float | None = Field(None, description="Mean over tasks of the null-model ablation's score (null until every task's is graded).")
    model_free_above_initial: bool | None = Field(None, description="Flag: on some task the null-model ablation scores above the initial system.")
    validation_evaluations: int
    spent_usd: float
    elapsed_hours: float
    evaluator: EvaluatorGrade | None = Field(None, description=(
        "The evaluator track: the frozen evaluator's grade (its final score is the mean pairwise agreement with the sealed targets): per "
        "sealed target the agreement with its 95% interval over candidate pairs, Kendall's tau, concordance and ceiling; its cost; its "
        "failure modes (budget exhausted, answers truncated, a few items carrying a score)."))
    sealed_withheld: bool | None = Field(None, description=(
        "The evaluator track: true while the public board withholds the figures derived from the sealed targets' scores beyond the "
        "headline agreement (Kendall's tau, concordance, ceiling, the per-target rows), until no run of the benchmark is open; the "
        "operator's board (GET /admin/leaderboard) shows them. Null on other tracks."))


# --------------------------------------------------------------------------- the run report (gateway.reports)


class ActivityTime(BaseModel):
    """Seconds of one activity in the run. ``wall_s``: time at least one ran (overlaps once); ``busy_s``: their summed
    durations (job-seconds); ``exclusive_s``: its part of the run's span (the parts sum to ``wall_s`` of the run);
    ``count``: intervals (the agent's: its calls)."""

    activity: Literal["training", "evaluating", "final_grading", "queued", "agent"]
    wall_s: float
    busy_s: float
    exclusive_s: float
    count: int


class SpendPoint(BaseModel):
    """Spend so far (micro-USD, charges less refunds) at ``at``, in all and by usage kind."""

    at: dt.datetime
    spent_usd_micros: int
    by_kind: dict[str, int]


class DesignTried(BaseModel):
    """One design the run tried: a ``dataset`` (``ds_…``), ``recipe`` (its JSON as submitted), ``harness`` (its JSON, or
    ``har_…``), ``checkpoint`` or base ``model``; ``uses``: jobs or evaluations that used it; its validation ``evaluations``,
    best validation score among them, and ``cost_usd_micros`` (its jobs' or evaluations' charges)."""

    kind: Literal["dataset", "recipe", "harness", "checkpoint", "model"]
    key: str
    uses: int
    evaluations: int
    best_validation_score: float | None
    cost_usd_micros: int


class ValidationPoint(BaseModel):
    """A finished validation evaluation: when it finished, the system's model (``checkpoint``: one of the run's), its score."""

    eval_id: str
    at: dt.datetime
    task: str
    model: str
    checkpoint: bool
    score: float
    ci_low: float | None
    ci_high: float | None
    items: int


class RunReport(BaseModel):
    """Where a run's time and money went and what it tried (``gateway.reports`` states how each figure is made).

    ``wall_s``: from the run's creation to the last thing that happened; ``waiting_and_grading_share``: the part of it
    in which the run waited on a queue or on grading and no training ran (0–1)."""

    run_id: str
    started_at: dt.datetime
    ended_at: dt.datetime
    wall_s: float
    time: list[ActivityTime]
    waiting_and_grading_s: float
    waiting_and_grading_share: float
    agent_calls: int
    budget_usd_micros: int
    spent_usd_micros: int
    spend: list[SpendPoint]
    tried: dict[str, int] = Field(description="Distinct datasets, recipes, harnesses and checkpoints the run tried.")
    designs: list[DesignTried]
    validation: list[ValidationPoint]
    submissions: list[dict[str, Any]] = Field(description="Each submission's id, task, model, status, aggregate score and times.")


# --------------------------------------------------------------------------- OpenAI's files and fine-tuning API (gateway.finetuning)

T = TypeVar("T")
Auto = Literal["auto"]


class CursorPage(BaseModel, Generic[T]):
    """A page of an OpenAI list: ``has_more`` says whether ``after=<last_id>`` gives more."""

    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class FileObject(BaseModel):
    """A file uploaded with ``purpose: fine-tune``: the run's dataset of the same id (``ds_…``), validated on upload."""

    id: str = Field(examples=["ds_01jd3k4m5n6p7q8r9s0t1v2w3x"])
    object: Literal["file"] = "file"
    bytes: int
    created_at: int = Field(description="Unix seconds.")
    filename: str
    purpose: Literal["fine-tune"] = "fine-tune"
    status: Literal["processed"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class _OpenAIParams(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SupervisedHyperparameters(_OpenAIParams):
    """``"auto"`` (or leaving one out) takes the benchmark's recipe: its default, or the value its track locks."""

    batch_size: Auto | Annotated[int, Field(ge=1, le=256)] | None = Field(None, description="Examples per step (`recipe.batch_size`).")
    learning_rate_multiplier: Auto | Annotated[float, Field(gt=0, le=100)] | None = Field(
        None, description="Times the recipe's default learning rate (`recipe.learning_rate`).")
    n_epochs: Auto | Annotated[int, Field(ge=1, le=50)] | None = Field(
        None, description="Passes over the training file: `recipe.max_steps` = ⌈n_epochs × rows / batch_size⌉.")


class DpoHyperparameters(SupervisedHyperparameters):
    beta: Auto | Annotated[float, Field(gt=0, le=10)] | None = Field(None, description="`recipe.dpo_beta`.")


class ReinforcementHyperparameters(SupervisedHyperparameters):
    compute_multiplier: Auto | Annotated[float, Field(ge=0.5, le=16)] | None = Field(
        None, description="Completions sampled per prompt: `recipe.grpo_group_size` = round(4 × compute_multiplier).")
    eval_interval: Auto | None = Field(None, description="Only `auto`: the run's validation split is graded by `POST /v1/evaluations`.")
    eval_samples: Auto | None = Field(None, description="Only `auto`, as `eval_interval`.")
    reasoning_effort: Literal["default"] | None = Field(None, description="Only `default`: the served models do not reason on request.")


class SupervisedMethod(_OpenAIParams):
    hyperparameters: SupervisedHyperparameters | None = None


class DpoMethod(_OpenAIParams):
    hyperparameters: DpoHyperparameters | None = None


class ReinforcementMethod(_OpenAIParams):
    grader: Grader = Field(description="Rewards each sampled answer against its row's other fields (`services.common.graders`); "
                                       "`label_model` only inside a `multi` grader.")
    hyperparameters: ReinforcementHyperparameters | None = None
    response_format: None = Field(None, description="Refused when set: the served models' structured outputs are chat's `response_format`.")

    @field_validator("grader")
    @classmethod
    def _not_label_model(cls, grader: Any) -> Any:
        if getattr(grader, "type", None) == "label_model":
            raise ValueError("a label_model grader scores inside a multi grader only (as OpenAI's API has it)")
        return grader


class FineTuningMethod(_OpenAIParams):
    """``type`` and its own settings (the other two left out)."""

    type: Literal["supervised", "dpo", "reinforcement"]
    supervised: SupervisedMethod | None = None
    dpo: DpoMethod | None = None
    reinforcement: ReinforcementMethod | None = None

    @model_validator(mode="after")
    def _only_its_own(self) -> FineTuningMethod:
        for other in {"supervised", "dpo", "reinforcement"} - {self.type}:
            if getattr(self, other) is not None:
                raise PydanticCustomError("method_mismatch", "method.{other} is set but method.type is {type}", {"other": other, "type": self.type})
        if self.type == "reinforcement" and self.reinforcement is None:
            raise PydanticCustomError("missing_grader", "method.reinforcement.grader is required for reinforcement fine-tuning")
        return self

    def settings(self) -> SupervisedMethod | DpoMethod | ReinforcementMethod:
        """The settings of ``type`` (empty ones when left out)."""
        return getattr(self, self.type) or {"supervised": SupervisedMethod, "dpo": DpoMethod}[self.type]()


class FineTuningJobCreate(_OpenAIParams):
    """OpenAI's ``fine_tuning.jobs.create``. ``method.type``: ``supervised`` trains `sft`, ``dpo`` `dpo`, ``reinforcement``
    `grpo` with its grader; each field is honoured or refused (400 naming it), never ignored."""

    model_config = ConfigDict(json_schema_extra={"example": {
        "model": "smollm2-135m-instruct", "training_file": "ds_01jd3k4m5n6p7q8r9s0t1v2w3x",
        "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2, "batch_size": 8}}}, "suffix": "arith"}})

    model: Annotated[str, Field(min_length=1, max_length=200, description="A base model, or a checkpoint (`ckpt_…`) to continue from.")]
    training_file: Annotated[str, Field(pattern=r"^ds_[0-9a-z]{26}$", description="A file (`ds_…`) uploaded with purpose `fine-tune`.")]
    method: FineTuningMethod | None = Field(None, description="Default: `supervised`.")
    hyperparameters: SupervisedHyperparameters | None = Field(None, description="Deprecated: `method.supervised.hyperparameters`.")
    suffix: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        None, description="Kept and shown as `user_provided_suffix`; a fine-tuned model is named by its checkpoint id (`ckpt_…`).")
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = Field(None, description="`recipe.seed` (default: the recipe's).")
    metadata: Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    validation_file: None = Field(None, description="Refused when set: the run's validation split is graded by `POST /v1/evaluations`.")
    integrations: Annotated[list[Any], Field(max_length=0)] | None = Field(None, description="Refused when not empty (no outside service is reached).")

    @model_validator(mode="after")
    def _one_place_for_hyperparameters(self) -> FineTuningJobCreate:
        if self.hyperparameters is not None and self.method is not None:
            raise PydanticCustomError("hyperparameters_twice", "give hyperparameters in method.<type>.hyperparameters, not also at the top level")
        return self

    def resolved_method(self) -> FineTuningMethod:
        """``method``, or ``supervised`` with the deprecated top-level ``hyperparameters``."""
        if self.method is not None:
            return self.method
        return FineTuningMethod(type="supervised", supervised=SupervisedMethod(hyperparameters=self.hyperparameters))


class FineTuningJobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class FineTuningJobOut(BaseModel):
    """OpenAI's ``fine_tuning.job``: the trainer's job (same id) as that API shows it."""

    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    error: FineTuningJobError | None = None
    fine_tuned_model: str | None = Field(None, description="The job's last checkpoint (`ckpt_…`) once it succeeded: a model name for "
                                                           "chat, evaluations and submissions.")
    finished_at: int | None = None
    hyperparameters: dict[str, Any]
    method: dict[str, Any]
    model: str
    organization_id: str = Field(description="The run.")
    result_files: list[str] = Field(default_factory=list)
    seed: int
    status: Literal["validating_files", "queued", "running", "paused", "succeeded", "failed", "cancelled"]
    trained_tokens: int | None = None
    training_file: str
    validation_file: str | None = None
    estimated_finish: int | None = None
    integrations: list[Any] = Field(default_factory=list)
    metadata: dict[str, str] | None = None
    user_provided_suffix: str | None = None


class FineTuningEventOut(BaseModel):
    """OpenAI's ``fine_tuning.job.event``: one of the job's events; a training step is ``type: metrics``."""

    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    data: dict[str, Any] = Field(default_factory=dict)
    type: Literal["message", "metrics"]


class FineTuningCheckpointOut(BaseModel):
    """OpenAI's ``fine_tuning.job.checkpoint``: one of the job's checkpoints, a model name (``ckpt_…``) of its own."""

    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: dict[str, float]
    step_number: int


class GraderRunParams(_OpenAIParams):
    """OpenAI's ``fine_tuning.alpha.graders.run``: grade one answer (``model_sample``) against one row (``item``)."""

    grader: Grader
    model_sample: Annotated[str, Field(max_length=200_000)]
    item: dict[str, Any] = Field(default_factory=dict)


class GraderRunOut(BaseModel):
    """The reward, a ``multi`` grader's parts, and what went wrong (OpenAI's ``metadata.errors`` flags)."""

    reward: float
    sub_rewards: dict[str, float]
    metadata: dict[str, Any]
    model_grader_token_usage_per_model: dict[str, Any]


class GraderValidateParams(_OpenAIParams):
    grader: Grader


class GraderValidateOut(BaseModel):
    grader: dict[str, Any]
