"""Fixtures of the suite tests that run scripted harnesses (no model called) in a real sandbox (:mod:`tests.unit.grader.scripted`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from grader.model_endpoint import ModelEndpoint


@pytest.fixture(scope="module")
def endpoint() -> Iterator[ModelEndpoint]:
    """A rollout model endpoint that no harness of these tests calls (a test module with a model defines its own)."""
    endpoint = ModelEndpoint(None)  # type: ignore[arg-type]
    endpoint.start()
    yield endpoint
    endpoint.stop()


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.slow])])
def backend(request: pytest.FixtureRequest) -> str:
    """The sandbox backend: bubblewrap in `make test`, Docker in `make test-slow`."""
    return request.param
