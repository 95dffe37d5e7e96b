"""The inference service's typed client: the only code that spells inference's ``/internal/…`` paths.

Methods are named as the routes in :mod:`inference_service.api`, take ``ctx`` (the run the call is for) and
the route's pydantic body, and return its response model. Errors are the transport's: ``UpstreamProblem``
carrying inference's problem+json (404 unknown model, 422 ``context_exceeded`` or a refused field, the ledger's
402 passed through) and ``UpstreamUnavailable`` (503) when inference cannot be reached in time. Calls are not
retried: a completion is charged when it is served.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from inference_service.schemas import ModelDetail, PromptTokens, PromptTokensRequest

from services.common.auth import RunContext
from services.common.contracts import Page
from services.common.http import ServiceAPI, ServiceClient, Transport
from services.common.llms import ModelCard
from services.common.openai_protocol import ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest, ModelOut
from services.common.settings import ServiceSettings

DEFAULT_TIMEOUT_S = 300.0  # a completion queues behind the batches in flight


class InferenceClient(ServiceAPI):
    """Inference's internal API; with an :class:`AsyncServiceClient` transport every method returns an awaitable."""

    @classmethod
    def connect(cls, settings: ServiceSettings, transport: type[Transport] = ServiceClient, **overrides: Any) -> InferenceClient:
        """A client of ``settings.inference_url`` with this service's token, no retries, a call taking 300 s at most;
        ``overrides`` go to the transport (e.g. the grader's ``timeout_s``: its calls wait behind other evaluations')."""
        options = {"name": "inference", "timeout_s": DEFAULT_TIMEOUT_S} | overrides
        return cls(transport(settings.inference_url, settings.service_token, **options))

    def list_models(self, ctx: RunContext | None = None) -> Page[ModelOut]:
        """The servable base models (OpenAI model list); checkpoints are served too but not listed."""
        return self._call("GET", "/internal/models", Page[ModelOut], ctx=ctx)

    def get_model(self, ctx: RunContext | None, model: str) -> ModelDetail:
        """What ``model`` (a base model name or one of ``ctx``'s run's ``ckpt_…``) resolves to; 404 for anything else."""
        return self._call("GET", f"/internal/models/{quote(model, safe='')}", ModelDetail, ctx=ctx)

    def register_base_model(self, card: ModelCard) -> ModelCard:
        """Prepare and serve base model ``card`` (no restart); 422 naming the card's field, 409 (``name``) when the name is
        registered from another source. Waits for the preparation (a large GGUF takes minutes)."""
        return self._call("POST", "/internal/base-models", ModelCard, body=card.model_dump(mode="json"))

    def list_base_models(self) -> Page[ModelCard]:
        """The cards of the base models served now."""
        return self._call("GET", "/internal/base-models", Page[ModelCard])

    def chat_completions(self, ctx: RunContext | None, body: ChatCompletionRequest, *, hold_id: str | None = None,
                         unmetered: bool = False, idempotency_key: str | None = None, context_tokens: int | None = None,
                         billed_prompt_tokens: int | None = None, billed_model: str | None = None) -> ChatCompletion:
        """Serve one chat completion for ``ctx``'s run (``body.stream`` false; see :meth:`chat_completions_stream`).

        By default its worst case is held on the run's budget and the actual tokens settled (402 when the budget
        cannot cover it). ``hold_id``: charge the tokens against this existing ledger hold instead (an
        evaluation's), once per ``idempotency_key``; ``unmetered``: official test grading, not charged;
        ``context_tokens``: run the model with this context length (tokens) if smaller than its own;
        ``billed_prompt_tokens``: hold, charge and report the prompt as this many tokens, none cached, and
        ``billed_model``: price the tokens as this model's (a candidate's call, billed for the caller's own messages). 422 ``context_exceeded`` (field ``messages``) when the prompt and
        ``max_tokens`` do not fit; 422 naming a field the engine does not serve.
        """
        return self._call("POST", "/internal/chat/completions", ChatCompletion, ctx=ctx, body=body,
                          headers=_metering(hold_id, unmetered, idempotency_key, context_tokens, billed_prompt_tokens, billed_model))

    def chat_completions_stream(self, ctx: RunContext | None, body: ChatCompletionRequest, *, context_tokens: int | None = None,
                                billed_prompt_tokens: int | None = None, billed_model: str | None = None,
                                ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """A streamed chat completion (``body.stream`` true; async transport): ``async with`` it for the server-sent
        events' bytes; errors as :meth:`chat_completions`, raised on entering. Leaving early stops the generation
        (charged for the tokens generated until then). ``context_tokens``, ``billed_prompt_tokens`` and
        ``billed_model`` as for :meth:`chat_completions`."""
        return self._stream("POST", "/internal/chat/completions", ctx=ctx, body=body,
                            headers=_metering(None, False, None, context_tokens, billed_prompt_tokens, billed_model))

    def chat_prompt_tokens(self, ctx: RunContext | None, requests: list[ChatCompletionRequest], *, context_tokens: int | None = None) -> PromptTokens:
        """Each chat request's prompt tokens (chat template and tools rendered by its model) and the context it would
        run in (``context_tokens`` as for :meth:`chat_completions`); free. 422 naming ``model`` or a prompt's field."""
        return self._call("POST", "/internal/chat/prompt-tokens", PromptTokens, ctx=ctx,
                          body=PromptTokensRequest(requests=requests), headers=_metering(None, False, None, context_tokens))

    def completions(self, ctx: RunContext | None, body: CompletionRequest, *, hold_id: str | None = None, unmetered: bool = False,
                    idempotency_key: str | None = None, context_tokens: int | None = None) -> Completion:
        """Serve one text completion (``/v1/completions``: no chat template; ``echo`` and ``logprobs``); metered as
        :meth:`chat_completions`; 422 ``context_exceeded`` naming ``prompt``."""
        return self._call("POST", "/internal/completions", Completion, ctx=ctx, body=body,
                          headers=_metering(hold_id, unmetered, idempotency_key, context_tokens))

    def completions_stream(self, ctx: RunContext | None, body: CompletionRequest) -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """A streamed text completion, as :meth:`chat_completions_stream`."""
        return self._stream("POST", "/internal/completions", ctx=ctx, body=body)


def _metering(hold_id: str | None, unmetered: bool, idempotency_key: str | None, context_tokens: int | None,
              billed_prompt_tokens: int | None = None, billed_model: str | None = None) -> dict[str, str]:
    headers = {"X-Crucible-Hold": hold_id, "X-Crucible-Unmetered": "grading" if unmetered else None,
               "Idempotency-Key": idempotency_key, "X-Crucible-Context-Tokens": str(context_tokens) if context_tokens else None,
               "X-Crucible-Billed-Prompt-Tokens": str(billed_prompt_tokens) if billed_prompt_tokens is not None else None,
               "X-Crucible-Billed-Model": billed_model}
    return {k: v for k, v in headers.items() if v is not None}
