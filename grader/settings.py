"""Grader settings. The test-store URL and the test seed exist here and in the grader's environment only."""

from __future__ import annotations

from pydantic import Field

from grader.sandboxes import SandboxSettings
from services.common.settings import ServiceSettings


class GraderSettings(ServiceSettings, SandboxSettings):
    """``CRUCIBLE_GRADER_TEST_STORE_URL`` and ``CRUCIBLE_GRADER_TEST_SEED`` are given to the grader process alone;
    ``sandbox_backend`` is :class:`~grader.sandboxes.SandboxSettings`'."""

    grader_test_store_url: str | None = Field(None, description="The hidden test-set store; default a separate SQLite file.")
    grader_test_seed: int = Field(..., description="Seed of every hidden test split (mixed with the benchmark's suite).")
    inference_concurrency: int = Field(
        64, ge=1, le=1024,
        description="Inference calls one evaluation keeps in flight. The transformers engine generates batches of up to its "
                    "`max_batch_size` (32 by default) calls, one batch at a time: twice that keeps the next batch waiting while one "
                    "runs, so the engine never idles between them (vLLM batches continuously and takes what comes).")
    scoring_concurrency: int = Field(
        8, ge=1, le=256,
        description="Answers one evaluation scores at once. For suites that run the answer as a program (human-eval) each is a sandboxed "
                    "process with its own CPU limit, so this bounds how many such programs one evaluation runs side by side.")
    inference_timeout_s: float = Field(
        1800.0, gt=0,
        description="Seconds a grading call may wait for its completion (queued behind other batches included). A call that times out "
                    "is sent again while the first still runs, so this is long.")
    upstream_retry_backoff_s: float = Field(
        2.0, gt=0, le=60,
        description="An evaluation's calls to inference and the ledger are tried again while that service is unavailable (restarting): "
                    "5 more tries, this many seconds × the try's number apart (2 + 4 + 6 + 8 + 10 = 30 s by default); after that the "
                    "evaluation is requeued, not failed.")

    rollout_concurrency: int = Field(4, ge=1, le=256, description="Code-harness rollouts (sandboxes) one evaluation runs at once.")
    rollout_wall_s: float = Field(600.0, gt=0, le=7200, description="Cap on a harness's wall-clock seconds per rollout (its manifest may ask for less).")
    rollout_memory_mb: int = Field(2048, ge=64, description="Cap on a rollout's memory (MiB).")
    rollout_processes: int = Field(128, ge=4, description="Cap on a rollout's processes and threads alive at once.")
    rollout_disk_mb: int = Field(512, ge=16, description="Cap on what a rollout's working directory holds (MiB).")
    verifier_wall_s: float = Field(120.0, gt=0, le=3600, description="Cap on a task's set-up and verifier, wall-clock seconds each.")

    def test_store_url(self) -> str:
        if self.grader_test_store_url:
            return self.grader_test_store_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.data_dir / 'grader-teststore.sqlite').resolve()}"
