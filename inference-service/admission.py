"""What a call must pass before anything is held or generated: the engine serves what its requests need, their JSON
schemas decode, their prompts render and fit the context.

Every refusal is a 422 naming the wire field at fault: a feature the engine lacks names the field that asked for it (a
full-weight checkpoint on an engine that serves none: ``model``), a schema the engine cannot decode under the same, a
prompt that does not render its prompt field (or the field a token id came from), and a prompt too long
:class:`ContextExceeded` on the prompt's field or on the completion's limit (the prompt alone fits, the limit does
not). The context is the smallest of the engine's window, the model card's and the benchmark's (``X-Crucible-Context-
Tokens``); an omitted ``max_tokens`` runs to its end.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from inference_service.engine_requests import Refusal
from inference_service.engines.base import Engine, Feature, GenerationRequest, SchemaNotServed

from services.common.errors import Unprocessable
from services.common.llms import ModelCard


class ContextExceeded(Unprocessable):
    """The prompt and ``max_tokens`` do not fit the context window."""

    code, title = "context_exceeded", "The prompt and max_tokens exceed the context length"


def check_features(engine: Engine, engine_name: str, model: str, model_needs: set[Feature], requests: list[GenerationRequest],
                   refused: Refusal) -> None:
    """``Unprocessable`` unless ``engine`` (of kind ``engine_name``) serves ``model`` (what it needs: ``model_needs``)
    and every feature of ``requests``."""
    if Feature.full_weights in model_needs - engine.features:
        raise Unprocessable(f"{model} is a full-weight checkpoint, which this deployment's engine ({engine_name}) does not serve: "
                            "full checkpoints are served by the transformers engine (CRUCIBLE_ENGINE=transformers); LoRA checkpoints by "
                            "every engine", field="model")
    for request in requests:
        missing = sorted(request.needs() - engine.features)
        if missing:
            name = refused(missing[0])
            raise Unprocessable(f"{name}: this deployment's engine does not serve it ({missing[0].value})", field=name)


async def check_schemas(engine: Engine, requests: list[GenerationRequest], refused: Refusal) -> None:
    """``Unprocessable`` naming the schema's field for a JSON schema the engine cannot decode under."""
    for request in requests:
        if request.json_schema is not None:
            try:
                await asyncio.to_thread(engine.check_schema, request.json_schema)
            except SchemaNotServed as exc:
                name = refused(Feature.guided_json)
                raise Unprocessable(f"{name}: {exc}", field=name) from exc


async def prompt_ids(engine: Engine, requests: list[GenerationRequest], field: str) -> list[list[int]]:
    """Each request's prompt rendered to token ids; ``Unprocessable`` naming ``field`` (or the field the engine's
    error names) for one that cannot be."""
    try:
        return [await asyncio.to_thread(engine.prompt_ids, r) for r in requests]
    except ValueError as exc:
        raise Unprocessable(str(exc), field=getattr(exc, "field", field)) from exc


def context_window(engine: Engine, card: ModelCard | None, context_tokens: int | None) -> int:
    """The context a call runs in: the engine's window, capped by the model card's and the benchmark's."""
    return min(engine.context_tokens, (card and card.context_tokens) or engine.context_tokens, context_tokens or engine.context_tokens)


def fit_context(requests: list[GenerationRequest], prompts: list[list[int]], context: int, *, field: str,
                limit_field: str) -> list[GenerationRequest]:
    """The requests as the engine gets them: the rendered prompt's token ids (chat messages and tools are in them) and
    ``max_tokens`` set (to the context's end if omitted). :class:`ContextExceeded` for one that does not fit, on the
    prompt's ``field`` or, when the prompt alone fits, on ``limit_field``."""
    fitted = []
    for request, ids in zip(requests, prompts, strict=True):
        tokens = len(ids)
        limit = request.max_tokens if request.max_tokens is not None else context - tokens
        if tokens + limit > context or (request.max_tokens is None and limit < 1):
            asked = "" if request.max_tokens is None else f"; with max_tokens {limit}"
            at_fault = limit_field if request.max_tokens is not None and tokens < context else field  # the prompt alone fits
            raise ContextExceeded(f"the prompt is {tokens} tokens{asked} it exceeds the context of {context} tokens",
                                  field=at_fault, prompt_tokens=tokens, context_tokens=context)
        fitted.append(replace(request, max_tokens=limit, prompt=ids, messages=None, tools=None))
    return fitted
