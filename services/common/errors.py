"""One exception hierarchy for every service, rendered as RFC 9457 problem+json by one handler.

Routes raise these; they never format error bodies themselves. Each problem body has ``type``
(``urn:crucible:problem:<code>``), ``title``, ``status``, ``detail``, ``code`` and, where relevant, our own
fields: ``field`` (dotted path of the offending input), ``line`` (1-based JSONL line),
``remaining_usd_micros`` (budget left), ``retry_after_s``.
"""

from __future__ import annotations

from typing import Any, ClassVar

PROBLEM_JSON = "application/problem+json"


class CrucibleError(Exception):
    """Base of every error a Crucible service reports over HTTP."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    title: ClassVar[str] = "Internal error"

    RESERVED: ClassVar[frozenset[str]] = frozenset({"type", "title", "status", "detail", "code"})

    def __init__(self, detail: str, **extra: Any) -> None:
        """``extra``: our own members of the problem body; ``None`` values are left out. The RFC 9457 members and
        ``code`` belong to the error class: naming one raises ``TypeError`` (a hold's state is ``hold_status``,
        never ``status``, which clients read as the HTTP status code)."""
        if clash := self.RESERVED & extra.keys():
            raise TypeError(f"problem members {sorted(clash)} are reserved")
        super().__init__(detail)
        self.detail = detail
        self.extra = {k: v for k, v in extra.items() if v is not None}

    def to_problem(self) -> dict[str, Any]:
        """The problem+json body: ``{type, title, status, detail, code, **extra}`` and OpenAI's ``error`` object
        (:func:`with_openai_error`)."""
        return with_openai_error({
            "type": f"urn:crucible:problem:{self.code}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
            **self.extra,
        })


OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "insufficient_quota", 403: "permission_error",
                      404: "not_found_error", 409: "conflict_error", 429: "rate_limit_error"}
"""OpenAI's error ``type`` by HTTP status (``invalid_request_error`` for another 4xx, ``server_error`` for a 5xx)."""


def with_openai_error(body: dict[str, Any]) -> dict[str, Any]:
    """A problem+json ``body`` with OpenAI's error object beside its own members: ``error: {message, type, param, code}``
    (``message`` the detail, ``param`` the ``field`` or ``None``), which OpenAI's SDKs read for the exception's message,
    ``type``, ``param`` and ``code``. Every error of every service carries it, so an OpenAI client of any route (chat,
    files, fine-tuning) reads the same shape; RFC 9457 lets a problem carry members of its own."""
    status = int(body.get("status", 500))
    kind = OPENAI_ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {**body, "error": {"message": body.get("detail", ""), "type": kind, "param": body.get("field"), "code": body.get("code")}}


class BadRequest(CrucibleError):
    status, code, title = 400, "bad_request", "Bad request"


class Unauthorized(CrucibleError):
    status, code, title = 401, "unauthorized", "Missing, invalid or revoked credentials"


class PaymentRequired(CrucibleError):
    """The run's budget cannot cover the request; carries ``remaining_usd_micros``."""

    status, code, title = 402, "budget_exhausted", "Budget cannot cover this request"


class Forbidden(CrucibleError):
    status, code, title = 403, "forbidden", "Not allowed"


class RunExpired(Forbidden):
    """The run's wall-clock deadline has passed; mutating calls are refused."""

    code, title = "run_expired", "The run's deadline has passed"


class OutsideEditableSpace(Forbidden):
    """The run's track does not allow this operation or this recipe value."""

    code, title = "not_editable", "Outside the run's editable space"


class SubmissionLimitReached(Forbidden):
    """The run has used all of its final submissions."""

    code, title = "submission_limit", "No final submissions left"


class NotFound(CrucibleError):
    status, code, title = 404, "not_found", "Not found"


class Conflict(CrucibleError):
    status, code, title = 409, "conflict", "Conflict with the current state"


class IdempotencyKeyReused(Conflict):
    """The idempotency key was first used with a different request."""

    code, title = "idempotency_key_reused", "Idempotency key already used with a different request"


class BenchmarkNotReady(Conflict):
    """A run of a benchmark whose splits are still being built (retry after ``retry_after_s``) or whose build failed."""

    code, title = "benchmark_not_ready", "Benchmark not ready"


class PayloadTooLarge(CrucibleError):
    status, code, title = 413, "payload_too_large", "Request body too large"


class Unprocessable(CrucibleError):
    """Input that parses but is invalid; names the ``field`` (and ``line`` for JSONL)."""

    status, code, title = 422, "invalid_input", "Invalid input"


class TooManyRequests(CrucibleError):
    status, code, title = 429, "rate_limited", "Too many requests"


class EvaluationRateLimited(TooManyRequests):
    """A validation-evaluation limit of the benchmark (per hour, per day, concurrent) is reached for now."""

    code, title = "evaluation_limit", "Validation evaluation limit reached"


class FailedEvaluationLimit(Forbidden):
    """The run used up its allowance of failed or cancelled validation evaluations."""

    code, title = "failed_evaluation_limit", "No failed evaluations left"


class UpstreamUnavailable(CrucibleError):
    """A service this one depends on did not answer; the call may be retried."""

    status, code, title = 503, "upstream_unavailable", "A dependency is unavailable; retry later"

    def __init__(self, detail: str, retry_after_s: int = 5, **extra: Any) -> None:
        super().__init__(detail, retry_after_s=retry_after_s, **extra)


class NotReady(CrucibleError):
    """``GET /readyz``: this service, or one it needs, cannot serve yet (starting, warming up, or down); ``unready``
    names each part that is not (part → why). Retry after ``retry_after_s`` seconds."""

    status, code, title = 503, "not_ready", "Not ready"

    def __init__(self, detail: str, unready: dict[str, str] | None = None, retry_after_s: int = 5) -> None:
        super().__init__(detail, unready=unready or {"service": detail}, retry_after_s=retry_after_s)


class UpstreamProblem(CrucibleError):
    """A problem+json answer from another service, passed through unchanged."""

    def __init__(self, problem: dict[str, Any]) -> None:
        super().__init__(str(problem.get("detail", "")))
        self.problem = problem
        self.status = int(problem.get("status", 502))  # type: ignore[misc]
        self.code = str(problem.get("code", "upstream_error"))  # type: ignore[misc]

    def to_problem(self) -> dict[str, Any]:
        return dict(self.problem)


def problem_responses(*errors: type[CrucibleError]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries documenting each error class a route may raise."""
    out: dict[int | str, dict[str, Any]] = {}
    for err in errors:
        example = err("…").to_problem()
        entry = out.setdefault(err.status, {"description": err.title, "content": {PROBLEM_JSON: {"examples": {}}}})
        entry["content"][PROBLEM_JSON]["examples"][err.code] = {"summary": err.title, "value": example}
    return out
