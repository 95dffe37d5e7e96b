"""Internal routes of the inference service (OpenAI-compatible), reached through the gateway or by the grader.

Thin routes over :class:`inference_service.service.Inference` (``app.state.inference``). Every route needs the
token of a service inference trusts; a run context is optional, but a metered completion needs one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import StreamingResponse
from inference_service.metering import Metering
from inference_service.schemas import ModelDetail, PromptTokens, PromptTokensRequest
from inference_service.service import Inference

from services.common.auth import ServiceCaller
from services.common.contracts import Page
from services.common.errors import Conflict, NotFound, PaymentRequired, Unauthorized, Unprocessable, problem_responses
from services.common.llms import ModelCard, ModelConflict, ModelPreparationError, registry
from services.common.openai_protocol import ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest, ModelOut


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


@router.post("/base-models", status_code=201, summary="Register a base model", responses=problem_responses(Unprocessable, Conflict))
async def register_base_model(card: ModelCard, _ctx: ServiceCaller, inference: InferenceDep) -> ModelCard:
    """Prepare the model card's weights into the models folder (once; a GGUF is dequantized, which takes minutes for a
    large one) and serve it from now on, without a restart. Registering the same card again changes nothing; a card
    differing only in description, context cap, thinking or prices replaces the stored one. 422 naming the card's field
    (a source that is missing or cannot be loaded, a stop token not in the vocabulary); 409 (field ``name``) when the
    name is registered from another source, chat template or stop tokens."""
    try:
        return await asyncio.to_thread(inference.register_model, card)
    except ModelPreparationError as exc:
        raise Unprocessable(str(exc), field=exc.field) from exc
    except ModelConflict as exc:
        raise Conflict(str(exc), field="name") from exc


@router.get("/base-models", summary="List the served base models' cards")
def list_base_models(_ctx: ServiceCaller, inference: InferenceDep) -> Page[ModelCard]:
    """The cards (``services.common.llms.ModelCard``) of the base models served, by name: those registered in the models
    folder (a replica that has not loaded one yet loads it on first use)."""
    return Page[ModelCard](data=list(registry(inference.settings.models_dir).values()))


def metering(
    x_crucible_hold: str | None = Header(None, description="Charge the tokens against this existing ledger hold."),
    x_crucible_unmetered: str | None = Header(None, description="`grading`: official test grading, not charged to the run."),
    idempotency_key: str | None = Header(None, max_length=150, description="With `X-Crucible-Hold`: the ledger charge's key, so a repeated call is charged once."),
    x_crucible_context_tokens: int | None = Header(None, ge=1, description="Run the model with this context length (a benchmark's setting) "
                                                                          "instead of its own window, if smaller."),
    x_crucible_billed_prompt_tokens: int | None = Header(None, ge=0, description="Hold, charge and report the prompt as this many tokens "
                                                                               "(none cached): a candidate's call, billed for the caller's own messages."),
    x_crucible_billed_model: str | None = Header(None, max_length=200, description="Price the call's tokens as this model's (a candidate's call)."),
) -> Metering:
    """How the call is paid, from its headers."""
    return Metering(hold_id=x_crucible_hold, metered=x_crucible_unmetered != "grading", idempotency_key=idempotency_key,
                    context_tokens=x_crucible_context_tokens, billed_prompt_tokens=x_crucible_billed_prompt_tokens,
                    billed_model=x_crucible_billed_model)


MeteringDep = Annotated[Metering, Depends(metering)]
STREAMED = {200: {"content": {"text/event-stream": {"schema": {"type": "string"}, "example": 'data: {"object": "chat.completion.chunk", …}\n\ndata: [DONE]\n\n'}},
                  "description": "The answer; with `stream: true`, server-sent events ending with `data: [DONE]`."}}


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    """Server-sent events, not buffered by proxies."""
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.post("/chat/completions", summary="Create a chat completion", responses=STREAMED | problem_responses(Unprocessable, PaymentRequired))
async def chat_completions(req: ChatCompletionRequest, ctx: ServiceCaller, inference: InferenceDep, paid: MeteringDep) -> ChatCompletion:
    """OpenAI-compatible chat completion; prompt and completion tokens are charged to the run. 422 ``context_exceeded``
    (field ``messages``) when the prompt and ``max_tokens`` do not fit the context; 422 naming a field the engine
    does not serve. With ``stream``, errors come before the first event, as problem+json."""
    if req.stream:
        return event_stream(await inference.chat_completion_stream(ctx, req, paid))  # type: ignore[return-value]
    return await inference.chat_completion(ctx, req, paid)


@router.post("/chat/prompt-tokens", summary="Count chat prompts' tokens", responses=problem_responses(Unprocessable))
async def chat_prompt_tokens(body: PromptTokensRequest, ctx: ServiceCaller, inference: InferenceDep, paid: MeteringDep) -> PromptTokens:
    """Each request's prompt tokens as its model renders it (chat template, tools) and the context it would run in
    (``X-Crucible-Context-Tokens`` applies); nothing is generated or charged. 422 naming ``model`` or the field a prompt
    cannot render from."""
    return await inference.chat_prompt_tokens(ctx, body.requests, paid)


@router.post("/completions", summary="Create a text completion", responses=STREAMED | problem_responses(Unprocessable, PaymentRequired))
async def completions(req: CompletionRequest, ctx: ServiceCaller, inference: InferenceDep, paid: MeteringDep) -> Completion:
    """OpenAI-compatible text completion (no chat template; ``echo`` and ``logprobs`` for log-likelihoods); charged as
    chat completions are. 422 ``context_exceeded`` naming ``prompt``."""
    if req.stream:
        return event_stream(await inference.completion_stream(ctx, req, paid))  # type: ignore[return-value]
    return await inference.completion(ctx, req, paid)
