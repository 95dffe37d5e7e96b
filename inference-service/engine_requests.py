"""OpenAI requests as engine requests (:class:`~inference_service.engines.base.GenerationRequest`), and the wire field
to name when the engine cannot serve one.

A chat request keeps its messages and tools (the engine renders them); ``tool_choice`` ``required`` or a named
function, and ``response_format``, become the JSON schema the answer is decoded under (a forced call's schema wins).
A text completion becomes one engine request per prompt. ``max_tokens`` is passed as asked, ``None`` when omitted
(the service sets it to the context's end once the prompt is rendered). A refusal names the field the client set:
:data:`FEATURE_FIELDS` by default, ``tool_choice`` for a forced call's schema, ``presence_penalty`` when only it asks
for penalties.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inference_service.engines.base import Feature, GenerationRequest
from inference_service.tool_calls import forced_call_schema, tool_mode

from services.common.openai_protocol import ChatCompletionRequest, CompletionRequest, JsonObjectFormat, JsonSchemaFormat

# the wire field that asks for each optional engine feature (chat, then text completions)
FEATURE_FIELDS = {
    Feature.logprobs: "logprobs", Feature.prompt_logprobs: "echo", Feature.guided_json: "response_format",
    Feature.penalties: "frequency_penalty", Feature.logit_bias: "logit_bias", Feature.seed: "seed", Feature.full_weights: "model",
}

Refusal = Callable[[Feature], str]  # the wire field that asked for a feature the engine lacks


def chat_request(req: ChatCompletionRequest) -> GenerationRequest:
    """The engine request of a chat completion."""
    schema = forced_call_schema(req)
    if schema is None:
        schema = _response_format_schema(req)
    top = req.top_logprobs or 0
    return GenerationRequest(
        messages=[m.as_dict() for m in req.messages], tools=req.tool_dicts(), max_tokens=req.completion_limit(), n=req.n,
        temperature=req.temperature, top_p=req.top_p, seed=req.seed, stop=req.stop_list(), logprobs=top if req.logprobs else None,
        json_schema=schema, presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty, logit_bias=req.bias_by_id(),
        stream=req.stream,
    )


def _response_format_schema(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """The schema ``response_format`` asks for: any object for ``json_object``, the given one for ``json_schema``."""
    if isinstance(req.response_format, JsonObjectFormat):
        return {"type": "object"}
    if isinstance(req.response_format, JsonSchemaFormat):
        return req.response_format.json_schema.schema_
    return None


def chat_limit_field(req: ChatCompletionRequest) -> str:
    """The field that set the completion's limit: ``max_completion_tokens`` if given, else ``max_tokens``."""
    return "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"


def chat_refusal(req: ChatCompletionRequest) -> Refusal:
    """The field of a chat request that asked for a feature."""
    def name(feature: Feature) -> str:
        if feature is Feature.guided_json and tool_mode(req) in ("required", "named"):
            return "tool_choice"
        if feature is Feature.penalties and not req.frequency_penalty:
            return "presence_penalty"
        return FEATURE_FIELDS[feature]
    return name


def completion_requests(req: CompletionRequest) -> list[GenerationRequest]:
    """The engine requests of a text completion, one per prompt."""
    top = req.logprobs
    return [GenerationRequest(
        prompt=prompt, max_tokens=req.max_tokens, n=req.n, temperature=req.temperature, top_p=req.top_p, seed=req.seed, stop=req.stop_list(),
        logprobs=top, prompt_logprobs=top if req.echo and top is not None else None, presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty, logit_bias=req.bias_by_id(), stream=req.stream,
    ) for prompt in req.prompts()]


def completion_refusal(req: CompletionRequest) -> Refusal:
    """The field of a text completion request that asked for a feature."""
    def name(feature: Feature) -> str:
        if feature is Feature.penalties and not req.frequency_penalty:
            return "presence_penalty"
        return FEATURE_FIELDS[feature]
    return name

