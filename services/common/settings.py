"""Settings shared by every service, read from ``CRUCIBLE_*`` environment variables (pydantic-settings).

Each service subclasses :class:`ServiceSettings`; anything only one service may know (the grader's
test-store URL and test seed) lives in that service's own settings class and environment prefix alone.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.jobs import ReconcilePolicy


class ServiceSettings(BaseSettings):
    """Settings every service reads. URLs are base URLs without a trailing slash."""

    model_config = SettingsConfigDict(env_prefix="CRUCIBLE_", extra="ignore")

    data_dir: Path = Field(Path(".crucible"), description="Root of SQLite files, artifacts and prepared models.")
    service_token: str = Field(
        "dev-service-token",
        description="This service's own token: sent on every call it makes to another service and used to sign the run "
                    "context it forwards. Every service has a different one.",
    )
    trusted_tokens: dict[str, str] = Field(
        default_factory=dict,
        description="The callers this service accepts, name → their service token (JSON in CRUCIBLE_TRUSTED_TOKENS), "
                    "e.g. the ledger trusts the gateway, trainer, inference and grader. A token not listed is refused with 401.",
    )
    gateway_url: str = "http://127.0.0.1:8000"
    ledger_url: str = "http://127.0.0.1:8001"
    trainer_url: str = "http://127.0.0.1:8002"
    inference_url: str = "http://127.0.0.1:8003"
    grader_url: str = "http://127.0.0.1:8004"
    broker_url: str | None = Field(None, description="Celery broker; default is the embedded SQLite broker in data_dir.")
    database_url: str | None = Field(None, description="This service's database; default is a SQLite file in data_dir.")
    http_timeout_s: float = Field(30.0, gt=0, description="Seconds a call to another service may take by default, retries included.")
    ledger_timeout_s: float = Field(
        10.0, gt=0, description="Seconds a call to the ledger may take in all: retries while it is unreachable, then 503.")
    job_heartbeat_s: float = Field(10.0, gt=0, description="Seconds between a worker's heartbeats on the job it runs.")
    worker_metrics_port: int | None = Field(None, ge=1, le=65535, description=(
        "A Celery worker of this service serves its Prometheus metrics (e.g. the rollout model endpoint's calls, sockets and "
        "refused connections) on this port, at worker_metrics_host; unset: not served. Sandboxes have no network to reach it."))
    worker_metrics_host: str = Field("127.0.0.1", description="The address a worker's metrics port listens on (0.0.0.0 for a scraper on another host).")
    job_lease_s: float = Field(60.0, gt=0, description="A running job whose heartbeat is older than this (seconds) lost its worker.")
    job_resend_after_s: float = Field(120.0, gt=0, description="Seconds a job may stay queued before its message is sent again (doubling each time).")
    job_max_attempts: int = Field(5, ge=1, description="A job whose worker was lost this many times fails.")
    reconcile_interval_s: float = Field(15.0, gt=0, description="Seconds between reconciler rounds in the trainer and grader.")
    train_time_limit_s: float = Field(24 * 3600.0, gt=0, description="A training job running longer than this (seconds) fails.")
    primitives_max_tokens: int = Field(65_536, ge=1, description=(
        "Tokens one forward_backward or sample of Tinker's primitives may compute at most (its data's tokens; a sample's "
        "prompt and max_tokens times its samples): a larger one is a 400, so no request can take a train worker's memory."))
    primitives_sample_s: float = Field(120.0, gt=0, description=(
        "Seconds one sample request of Tinker's primitives may decode: its sequences not finished by then end there, with stop "
        "reason `length`, and are charged for the tokens decoded (a large sample once held the only train worker for minutes)."))
    primitives_idle_s: float = Field(30.0, gt=0, description=(
        "Seconds a train worker keeps a live model of Tinker's primitives (trainer_service.live) without a request before it "
        "writes its state and lets it go (the next request brings it back)."))
    train_devices: int = Field(1, ge=1, le=64, description=(
        "Devices one training job's step loop spreads over on a train worker: its CUDA devices 0…N-1 (of CUDA_VISIBLE_DEVICES), "
        "or N processes sharing the CPUs. More than 1: a LoRA adapter trains with DDP, full weights with FSDP2 (torch.distributed, "
        "launched as torchrun launches). A job whose batch_size is smaller uses batch_size devices."))
    train_recipe_devices: bool = Field(False, description=(
        "Whether a recipe may choose its own `devices` (1 to train_devices); otherwise setting recipe.devices is a 422."))
    train_memory_mb: int | None = Field(None, gt=0, description=(
        "Memory one training job may use on each of its devices on a train worker (MiB): a GPU's memory on a GPU pool, RAM on CPU workers. A job whose "
        "estimate exceeds it is refused with a 422 before it is queued. Default: 80% of this machine's RAM."))
    eval_time_limit_s: float = Field(6 * 3600.0, gt=0, description="An evaluation running longer than this (seconds) fails.")
    log_level: str = "INFO"

    def reconcile_policy(self, time_limit_s: float) -> ReconcilePolicy:
        """The reconciler's settings for jobs limited to ``time_limit_s`` seconds."""
        return ReconcilePolicy(lease_s=self.job_lease_s, time_limit_s=time_limit_s, max_attempts=self.job_max_attempts,
                               resend_after_s=self.job_resend_after_s)

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"

    def database_url_for(self, service: str) -> str:
        """This service's SQLAlchemy URL (``database_url`` or ``sqlite:///<data_dir>/<service>.sqlite``)."""
        if self.database_url:
            return self.database_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.data_dir / f'{service}.sqlite').resolve()}"

    def broker(self) -> str:
        """The Celery broker URL (embedded default: kombu's SQLAlchemy transport on a SQLite file)."""
        if self.broker_url:
            return self.broker_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqla+sqlite:///{(self.data_dir / 'broker.sqlite').resolve()}"
