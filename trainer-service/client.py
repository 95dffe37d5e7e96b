"""The trainer's typed client: the one place that spells the trainer's ``/internal/…`` paths.

One method per route of ``trainer_service.api``, named as the route function; each returns the route's
response model. The gateway calls every route (through :class:`~services.common.http.AsyncServiceClient`),
the grader reads datasets for its audit, inference locates checkpoints. Errors are the transport's:
``UpstreamProblem`` carrying the trainer's problem+json (a 422 naming ``line`` and ``field``, a 404, a
ledger 402 passed through), ``UpstreamUnavailable`` (503) when the trainer cannot be reached in time.
"""

from __future__ import annotations

from typing import Any

from trainer_service.schemas import (
    CheckpointRecord,
    FutureOut,
    LiveModelCreate,
    LiveModelInfo,
    RequestAnswer,
    SamplerCreate,
    SamplerOut,
    SamplerSnapshot,
    SavedWeightsOut,
    SessionCreate,
    SessionOut,
)

from services.common.auth import RunContext
from services.common.contracts import CheckpointOut, DatasetOut, JobEventOut, Page, TrainingJobCreate, TrainingJobOut
from services.common.http import ServiceAPI, ServiceClient, Transport
from services.common.settings import ServiceSettings


class TrainerClient(ServiceAPI):
    """Calls the trainer with this service's token and the run context a route is scoped to.

    With an async transport every method returns an awaitable of its answer.
    """

    @classmethod
    def connect(cls, settings: ServiceSettings, transport: type[Transport] = ServiceClient, **overrides: Any) -> TrainerClient:
        """A client of ``settings.trainer_url`` signed with ``settings.service_token``.

        A call may take ``settings.http_timeout_s`` seconds in all, without retries, unless ``overrides``
        (the transport's keyword arguments: ``timeout_s``, ``retries``, ``connect_timeout_s``, ``backoff_s``)
        say otherwise; the callers' today: the gateway ``timeout_s=120``, the grader ``timeout_s=300,
        retries=3``, inference the default. Retrying is safe: reads are reads, an upload is content-addressed
        and a job creation with an ``Idempotency-Key`` returns the first job.
        """
        options: dict[str, Any] = {"name": "trainer", "timeout_s": settings.http_timeout_s} | overrides
        return cls(transport(settings.trainer_url, settings.service_token, **options))

    # ------------------------------------------------------------------ datasets

    def upload_dataset(self, ctx: RunContext, content: bytes, *, name: str | None = None) -> DatasetOut:
        """Store JSONL ``content`` for the run as ``name`` (the route's default ``dataset.jsonl`` if ``None``).
        422 names the first bad ``line`` and ``field`` (``file`` for the file as a whole)."""
        return self._call("POST", "/internal/datasets", DatasetOut, ctx=ctx, content=content, params={"name": name},
                          headers={"Content-Type": "application/jsonl"})

    def list_datasets(self, ctx: RunContext) -> Page[DatasetOut]:
        return self._call("GET", "/internal/datasets", Page[DatasetOut], ctx=ctx)

    def get_dataset(self, ctx: RunContext, dataset_id: str) -> DatasetOut:
        """404 for another run's or an unknown id."""
        return self._call("GET", f"/internal/datasets/{dataset_id}", DatasetOut, ctx=ctx)

    def dataset_content(self, ctx: RunContext, dataset_id: str) -> bytes:
        """The dataset's JSONL bytes exactly as stored; 404 for another run's or an unknown id."""
        return self._call("GET", f"/internal/datasets/{dataset_id}/content", ctx=ctx, raw=True)

    # ------------------------------------------------------------------ jobs

    def create_job(self, ctx: RunContext, body: TrainingJobCreate, *, idempotency_key: str | None = None) -> TrainingJobOut:
        """Hold the job's estimated cost on the run's budget and queue it (402 if it cannot be covered).
        The same ``idempotency_key`` with the same body returns the first job; with another body, 409."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._call("POST", "/internal/jobs", TrainingJobOut, ctx=ctx, body=body, headers=headers)

    def list_jobs(self, ctx: RunContext) -> Page[TrainingJobOut]:
        return self._call("GET", "/internal/jobs", Page[TrainingJobOut], ctx=ctx)

    def get_job(self, ctx: RunContext, job_id: str) -> TrainingJobOut:
        return self._call("GET", f"/internal/jobs/{job_id}", TrainingJobOut, ctx=ctx)

    def job_events(self, ctx: RunContext, job_id: str, *, after: int = 0, limit: int = 500) -> Page[JobEventOut]:
        """At most ``limit`` events with ``seq > after``, oldest first."""
        return self._call("GET", f"/internal/jobs/{job_id}/events", Page[JobEventOut], ctx=ctx, params={"after": after, "limit": limit})

    def job_checkpoints(self, ctx: RunContext, job_id: str) -> Page[CheckpointOut]:
        return self._call("GET", f"/internal/jobs/{job_id}/checkpoints", Page[CheckpointOut], ctx=ctx)

    def cancel_job(self, ctx: RunContext, job_id: str) -> TrainingJobOut:
        """409 if the job already ended."""
        return self._call("POST", f"/internal/jobs/{job_id}/cancel", TrainingJobOut, ctx=ctx)

    # ------------------------------------------------------------------ checkpoints

    def get_checkpoint(self, ctx: RunContext | None, checkpoint_id: str) -> CheckpointRecord:
        """Where checkpoint ``checkpoint_id`` lives; with ``ctx``, only that run's checkpoints exist (else 404)."""
        return self._call("GET", f"/internal/checkpoints/{checkpoint_id}", CheckpointRecord, ctx=ctx)

    # ------------------------------------------------------------------ Tinker's primitives

    def create_session(self, ctx: RunContext, body: SessionCreate) -> SessionOut:
        return self._call("POST", "/internal/primitives/sessions", SessionOut, ctx=ctx, body=body)

    def session_heartbeat(self, ctx: RunContext, session_id: str) -> SessionOut:
        return self._call("POST", f"/internal/primitives/sessions/{session_id}/heartbeat", SessionOut, ctx=ctx)

    def finish_session(self, ctx: RunContext, session_id: str) -> SessionOut:
        return self._call("POST", f"/internal/primitives/sessions/{session_id}/finish", SessionOut, ctx=ctx)

    def create_live_model(self, ctx: RunContext, body: LiveModelCreate) -> FutureOut:
        """A live model (a fresh adapter, or the state saved at ``body.path``); its training job holds nothing."""
        return self._call("POST", "/internal/primitives/models", FutureOut, ctx=ctx, body=body)

    def live_model_info(self, ctx: RunContext, model_id: str) -> LiveModelInfo:
        return self._call("GET", f"/internal/primitives/models/{model_id}", LiveModelInfo, ctx=ctx)

    def live_model_weights(self, ctx: RunContext, model_id: str) -> Page[SavedWeightsOut]:
        return self._call("GET", f"/internal/primitives/models/{model_id}/weights", Page[SavedWeightsOut], ctx=ctx)

    def forward_backward(self, ctx: RunContext, body: bytes) -> FutureOut:
        """Queue a protobuf ``ForwardBackwardRequest`` (its tokens held: 402 when the budget cannot cover them)."""
        return self._call("POST", "/internal/primitives/forward_backward", FutureOut, ctx=ctx, content=body,
                          headers={"Content-Type": "application/x-protobuf"})

    def training_request(self, ctx: RunContext, kind: str, body: dict[str, Any]) -> FutureOut:
        """Queue an ``optim_step``, ``save_weights``, ``save_weights_for_sampler`` or ``load_weights`` (Tinker's body)."""
        return self._call("POST", f"/internal/primitives/training/{kind}", FutureOut, ctx=ctx, body=body)

    def create_sampler(self, ctx: RunContext, body: SamplerCreate) -> SamplerOut:
        return self._call("POST", "/internal/primitives/samplers", SamplerOut, ctx=ctx, body=body)

    def sampler_snapshot(self, ctx: RunContext, body: SamplerSnapshot) -> FutureOut:
        return self._call("POST", "/internal/primitives/samplers/snapshot", FutureOut, ctx=ctx, body=body)

    def get_sampler(self, ctx: RunContext, sampler_id: str) -> SamplerOut:
        return self._call("GET", f"/internal/primitives/samplers/{sampler_id}", SamplerOut, ctx=ctx)

    def sample(self, ctx: RunContext, sampler_id: str, body: dict[str, Any]) -> FutureOut:
        """Queue a sample (its worst case held: 402 when the budget cannot cover it)."""
        return self._call("POST", f"/internal/primitives/samplers/{sampler_id}/sample", FutureOut, ctx=ctx, body=body)

    def retrieve_request(self, ctx: RunContext, request_id: str, *, wait_s: float = 0.0) -> RequestAnswer:
        """The request's answer, the trainer waiting up to ``wait_s`` seconds for it (``pending`` after that)."""
        return self._call("GET", f"/internal/primitives/requests/{request_id}", RequestAnswer, ctx=ctx, params={"wait_s": wait_s})
