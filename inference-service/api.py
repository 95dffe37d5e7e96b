"""Internal routes of the inference service (OpenAI-compatible), reached through the gateway or by the grader.

Thin routes over :class:`inference_service.service.Inference` (``app.state.inference``). Every route needs the
token of a service inference trusts; a run context is optional, but a metered completion needs one.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from inference_service.schemas import ModelDetail
from inference_service.service import Inference

from services.common.auth import ServiceCaller
from services.common.contracts import ChatCompletion, ChatCompletionRequest, ModelOut, Page
from services.common.errors import NotFound, PaymentRequired, Unauthorized, Unprocessable, problem_responses


def get_inference(request: Request) -> Inference:
    return request.app.state.inference


InferenceDep = Annotated[Inference, Depends(get_inference)]

router = APIRouter(prefix="/internal", responses=problem_responses(Unauthorized))


@router.get("/models", summary="List servable base models")
def list_models(_ctx: ServiceCaller, inference: InferenceDep) -> Page[ModelOut]:
    """OpenAI-style ``{"object": "list", "data": [{"id", "object": "model", "owned_by"}]}``."""
    return Page[ModelOut](data=inference.list_models())


@router.get("/models/{model}", summary="Resolve a model name", responses=problem_responses(NotFound))
def get_model(model: str, ctx: ServiceCaller, inference: InferenceDep) -> ModelDetail:
    """``{"id", "object": "model", "owned_by", "base_model", "adapter"}`` for a served base model or one of the run's checkpoints."""
    return inference.describe_model(ctx, model)


@router.post("/chat/completions", summary="Create a chat completion", responses=problem_responses(Unprocessable, PaymentRequired))
async def chat_completions(
    req: ChatCompletionRequest,
    ctx: ServiceCaller,
    inference: InferenceDep,
    x_crucible_hold: str | None = Header(None, description="Charge the tokens against this existing ledger hold."),
    x_crucible_unmetered: str | None = Header(None, description="`grading`: official test grading, not charged to the run."),
    idempotency_key: str | None = Header(None, max_length=150, description="With `X-Crucible-Hold`: the ledger charge's key, so a repeated call is charged once."),
    x_crucible_context_tokens: int | None = Header(None, ge=1, description="Run the model with this context length (a benchmark's setting) "
                                                                          "instead of its own window, if smaller."),
) -> ChatCompletion:
    """OpenAI-compatible chat completion; prompt and completion tokens are charged to the run. 422 ``context_exceeded``
    (field ``messages``) when the prompt and ``max_tokens`` do not fit the context."""
    return await inference.chat_completion(ctx, req, hold_id=x_crucible_hold, metered=x_crucible_unmetered != "grading",
                                           idempotency_key=idempotency_key, context_tokens=x_crucible_context_tokens)
