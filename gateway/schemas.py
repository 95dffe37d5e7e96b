"""Gateway wire models: the benchmark file, runs, the run card, budget and the leaderboard."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.common.contracts import TRAINING_FIELDS, EvaluationLimits, EvaluationSettings, SuiteSpec, SystemSpec

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


class BenchmarkFile(BaseModel):
    """A benchmark definition (YAML). The test split's seed is not here: it lives in the grader's configuration."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    suite: SuiteSpec
    initial_system: SystemSpec
    reference: ReferenceSpec
    track: Literal["data", "trainer", "harness", "joint"] = "joint"
    editable: list[Editable] | None = Field(None, description="Defaults to the track's preset.")
    recipe: RecipePolicy = Field(default_factory=RecipePolicy)
    budget: BudgetSpec
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)

    @field_validator("suite")
    @classmethod
    def _no_test_seed(cls, suite: SuiteSpec) -> SuiteSpec:
        if suite.splits.test.seed is not None:
            raise ValueError("splits.test.seed must not be in the benchmark file: the test seed lives only in the grader's configuration")
        return suite

    @model_validator(mode="after")
    def _checks(self) -> BenchmarkFile:
        if self.editable is None:
            self.editable = list(TRACKS[self.track])  # type: ignore[assignment]
        return self


class BenchmarkOut(BaseModel):
    id: str
    object: Literal["benchmark"] = "benchmark"
    name: str
    spec: BenchmarkFile
    created_at: dt.datetime


class RunCreate(BaseModel):
    """Create a run of a benchmark for one research agent."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {"benchmark": "chain-sum-demo", "agent_name": "baseline"}})

    benchmark: str = Field(description="Benchmark id (`bm_…`) or name.")
    agent_name: str = Field(min_length=1, max_length=200)
    budget_usd: float | None = Field(None, gt=0, description="Override the benchmark's budget (USD).")
    wall_clock_hours: float | None = Field(None, gt=0, description="Override the benchmark's wall-clock limit (hours).")


class RefundRequest(BaseModel):
    """An operator's refund of (part of) one of a run's charges (see the run's ledger entries)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {
        "entry_id": "ent_01jd3k5n8q2x7v4w9z6y3t1r0s", "reason": "steps lost to a worker crash", "idempotency_key": "refund-incident-42"}})

    entry_id: str = Field(min_length=1, max_length=40, description="The charge entry to refund.")
    amount_usd_micros: int | None = Field(None, ge=1, description="Micro-USD to give back; omitted: all of the charge not refunded yet.")
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


class LeaderboardRow(BaseModel):
    """One graded (or pending) final submission. Scores are in [0, 1]."""

    rank: int | None
    run_id: str
    benchmark: str
    agent_name: str
    submission_id: str
    status: str
    initial_score: float | None
    final_score: float | None
    reference_score: float | None
    gap_closed: float | None = Field(description="(final − initial) / (reference − initial)")
    n: int | None
    final_ci: tuple[float, float] | None = Field(None, description="95% bootstrap confidence interval of the final score (low, high).")
    validation_evaluations: int
    spent_usd: float
    elapsed_hours: float
