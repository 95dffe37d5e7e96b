"""Schemathesis against the gateway's OpenAPI, authorized as a run, on the running stack (real processes).

Every agent-facing operation gets generated requests (valid and invalid by the schema); no answer may be a
5xx, and every error must be an RFC 9457 problem+json body with the status it was sent with.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

os.environ.setdefault("CRUCIBLE_ADMIN_KEY", "schema-only-never-used")  # the app is imported for its OpenAPI document only
from gateway.app import app  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.planes("postgres")]  # production's column types are the stricter (a 4-byte integer overflows where SQLite's does not)
schema = schemathesis.openapi.from_dict(app.openapi()).include(path_regex=r"^/v1/")
# The coverage phase sends hundreds of boundary-value requests per operation; with the real model behind
# /v1/chat/completions on 2 cores that alone takes minutes. Examples and fuzzing phases remain.
schema.config.phases.coverage.enabled = os.environ.get("CRUCIBLE_FUZZ_COVERAGE") == "1"


@pytest.fixture(scope="module")
def fuzz_key(stack, admin, benchmark) -> str:  # noqa: ANN001
    return admin.create_run(benchmark["name"], "schemathesis")["api_key"]


@schema.parametrize()
@settings(max_examples=int(os.environ.get("CRUCIBLE_FUZZ_EXAMPLES", "12")), deadline=None,
          suppress_health_check=list(HealthCheck), derandomize=True)
def test_gateway_answers_every_generated_request_without_5xx_and_with_problem_json(case, stack, fuzz_key) -> None:  # noqa: ANN001
    case.headers = {**(case.headers or {}), "authorization": f"Bearer {fuzz_key}"}  # always as the run
    if isinstance(case.body, dict) and case.method == "POST" and case.path in ("/v1/evaluations", "/v1/submissions"):
        case.body["model"] = "no-such-model"  # no real evaluations: they would queue hundreds of completions (e2e tests run those)
    if isinstance(case.body, dict):  # valid completions run the real model on 2 cores: keep them short
        for name in ("max_tokens", "max_completion_tokens"):
            value = case.body.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 4:
                case.body[name] = 4
        if case.path == "/v1/chat/completions" and case.body.get("max_tokens") is None and case.body.get("max_completion_tokens") is None:
            case.body["max_tokens"] = 4  # the default would be 256 tokens
        for message in case.body.get("messages") or []:
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                message["content"] = message["content"][:64]
    response = case.call(base_url=stack.gateway_url, timeout=180)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}"
    if response.status_code >= 400:
        content_type = response.headers.get("content-type") or [""]
        content_type = content_type[0] if isinstance(content_type, list) else content_type
        assert content_type.startswith("application/problem+json"), response.text[:300]
        body = response.json()
        assert body["status"] == response.status_code and body["title"] and "type" in body, body
