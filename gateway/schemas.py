"""Gateway wire models: the benchmark file, runs, the run card, budget and the leaderboard."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from services.common.contracts import TRAINING_FIELDS, AuditSettings, EvaluationLimits, EvaluationSettings, Recipe, SuiteSpec, SystemSpec
from services.ledger.schemas import MAX_BUDGET_USD_MICROS

Editable = Literal["data", "trainer", "harness"]
TRACKS: dict[str, list[str]] = {
    "data": ["data"],
    "trainer": ["trainer"],
    "harness": ["harness"],
    "joint": ["data", "trainer", "harness"],
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
    """One task of a benchmark: a suite with its splits, the initial system and the reference."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_-]*$", examples=["math"])
    suite: SuiteSpec
    initial_system: SystemSpec
    reference: ReferenceSpec
    evaluation: EvaluationSettings | None = Field(None, description="This task's evaluation settings; null: the benchmark's.")

    @field_validator("suite")
    @classmethod
    def _no_test_seed(cls, suite: SuiteSpec) -> SuiteSpec:
        if suite.splits.test.seed is not None:
            raise ValueError("splits.test.seed must not be in the benchmark file: the test seed lives only in the grader's configuration")
        return suite


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
    track: Literal["data", "trainer", "harness", "joint"] = "joint"
    editable: list[Editable] | None = Field(None, description="Defaults to the track's preset.")
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
        if self.editable is None:
            self.editable = list(TRACKS[self.track])  # type: ignore[assignment]
        return self

    def task_list(self) -> list[TaskSpec]:
        """The benchmark's tasks (one called ``main`` for a single-task file), each with its evaluation settings."""
        if self.tasks is not None:
            return [t if t.evaluation else t.model_copy(update={"evaluation": self.evaluation}) for t in self.tasks]
        return [TaskSpec(name=SINGLE_TASK, suite=self.suite, initial_system=self.initial_system, reference=self.reference,  # type: ignore[arg-type]
                         evaluation=self.evaluation)]


class BenchmarkOut(BaseModel):
    id: str
    object: Literal["benchmark"] = "benchmark"
    name: str
    spec: BenchmarkFile
    created_at: dt.datetime
    warnings: list[str] = Field(default_factory=list, description="What the operator should know, on the first load only: e.g. a task whose "
                                "items are few enough to enumerate, so that its test split cannot stay secret.")


class RunCreate(BaseModel):
    """Create a run of a benchmark for one research agent."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {"benchmark": "chain-sum-demo", "agent_name": "baseline"}})

    benchmark: str = Field(description="Benchmark id (`bm_…`) or name.")
    agent_name: str = Field(min_length=1, max_length=200)
    budget_usd: float | None = Field(None, ge=0.000001, le=1_000_000, description="Override the benchmark's budget (USD, at least one micro-USD).")
    wall_clock_hours: float | None = Field(None, gt=0, le=24 * 365, description="Override the benchmark's wall-clock limit (hours).")
    track: Literal["data", "trainer", "harness", "joint"] | None = Field(
        None, description="Run the benchmark on another track than its file's (RSIGym runs the same tasks as Data, Harness and Joint); "
                          "the editable space is then that track's preset.")


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
    gap_closed: float | None = Field(description="(final − initial) / (reference − initial)")
    n: int | None
    final_ci: tuple[float, float] | None = Field(None, description="95% bootstrap confidence interval of the final score (low, high).")
    contaminated: bool | None = Field(None, description="The contamination audit found test items in the run's datasets (null: not audited yet). "
                                      "How many is the operator's to read (the grader's records): a public count would tell a run how many "
                                      "of the items it uploaded are hidden ones.")


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
    gap_closed: float | None = Field(description="mean over tasks of (final − initial) / (reference − initial)")
    rsi_index: float | None = Field(None, description="mean over tasks of (final − initial) / (1 − initial)")
    n: int | None = Field(description="Test items graded, over all tasks.")
    final_ci: tuple[float, float] | None = Field(None, description="95% bootstrap interval of the final score (one-task benchmarks; see each task otherwise).")
    contaminated: bool | None = Field(None, description="The audit flagged test items of some task (null: not audited yet).")
    validation_evaluations: int
    spent_usd: float
    elapsed_hours: float


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
