"""Grader settings. The test-store URL and the test seed exist here and in the grader's environment only."""

from __future__ import annotations

from pydantic import Field

from services.common.settings import ServiceSettings


class GraderSettings(ServiceSettings):
    """``CRUCIBLE_GRADER_TEST_STORE_URL`` and ``CRUCIBLE_GRADER_TEST_SEED`` are given to the grader process alone."""

    grader_test_store_url: str | None = Field(None, description="The hidden test-set store; default a separate SQLite file.")
    grader_test_seed: int = Field(..., description="Seed of every hidden test split (mixed with the benchmark's suite).")
    eval_concurrency: int = Field(32, ge=1, le=256, description="Concurrent inference calls per evaluation.")

    def test_store_url(self) -> str:
        if self.grader_test_store_url:
            return self.grader_test_store_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.data_dir / 'grader-teststore.sqlite').resolve()}"
