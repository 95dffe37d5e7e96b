"""Internal routes of the inference service (OpenAI-compatible), reached through the gateway or by the grader."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Header
from inference_service import service

from services.common.auth import InternalAuth, RunContext
from services.common.contracts import ChatCompletion, ChatCompletionRequest
from services.common.errors import NotFound, PaymentRequired, Unauthorized, Unprocessable, problem_responses

auth = InternalAuth(lambda: service.runtime().settings.trusted_tokens)
router = APIRouter(prefix="/internal", responses=problem_responses(Unauthorized))


@router.get("/models", summary="List servable base models")
def list_models(_ctx: RunContext | None = Depends(auth.caller)) -> dict:
    """OpenAI-style ``{"object": "list", "data": [{"id", "object": "model", "owned_by"}]}``."""
    return {"object": "list", "data": service.list_models()}


@router.get("/models/{model}", summary="Resolve a model name", responses=problem_responses(NotFound))
def get_model(model: str, ctx: RunContext | None = Depends(auth.caller)) -> dict:
    """``{"id", "object": "model", "base_model", "adapter"}`` for a served base model or one of the run's checkpoints."""
    return service.describe_model(ctx, model)


@router.post("/chat/completions", summary="Create a chat completion", responses=problem_responses(Unprocessable, PaymentRequired))
async def chat_completions(
    req: ChatCompletionRequest,
    ctx: RunContext | None = Depends(auth.caller),
    x_crucible_hold: str | None = Header(None, description="Charge the tokens against this existing ledger hold."),
    x_crucible_unmetered: str | None = Header(None, description="`grading`: official test grading, not charged to the run."),
    idempotency_key: str | None = Header(None, max_length=150, description="With `X-Crucible-Hold`: the ledger charge's key, so a repeated call is charged once."),
    x_crucible_context_tokens: int | None = Header(None, ge=1, description="Run the model with this context length (a benchmark's setting) "
                                                                          "instead of its own window, if smaller."),
) -> ChatCompletion:
    """OpenAI-compatible chat completion; prompt and completion tokens are charged to the run. 422 ``context_exceeded``
    (field ``messages``) when the prompt and ``max_tokens`` do not fit the context."""
    return await service.chat_completion(ctx, req, hold_id=x_crucible_hold, metered=x_crucible_unmetered != "grading",
                                         idempotency_key=idempotency_key, context_tokens=x_crucible_context_tokens)
