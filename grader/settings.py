"""Grader settings. The test-store URL and the test seed exist here and in the grader's environment only."""

from __future__ import annotations

from pydantic import Field

from services.common.settings import ServiceSettings


class GraderSettings(ServiceSettings):
    """``CRUCIBLE_GRADER_TEST_STORE_URL`` and ``CRUCIBLE_GRADER_TEST_SEED`` are given to the grader process alone."""

    grader_test_store_url: str | None = Field(None, description="The hidden test-set store; default a separate SQLite file.")
    grader_test_seed: int = Field(..., description="Seed of every hidden test split (mixed with the benchmark's suite).")
    eval_concurrency: int = Field(
        8, ge=1, le=256,
        description="Concurrent inference calls per evaluation. Evaluations run side by side (the eval worker's threads), and inference "
                    "generates one batch at a time: more calls in flight than a batch holds only wait longer.")
    inference_timeout_s: float = Field(
        1800.0, gt=0,
        description="Seconds a grading call may wait for its completion (queued behind other batches included). A call that times out "
                    "is sent again while the first still runs, so this is long.")

    def test_store_url(self) -> str:
        if self.grader_test_store_url:
            return self.grader_test_store_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.data_dir / 'grader-teststore.sqlite').resolve()}"
