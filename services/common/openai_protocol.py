"""OpenAI-compatible wire models: models, chat completions (and their stream chunks), text completions.

The inference service serves them; the gateway documents and proxies exactly them; the grader builds requests
with them. Every parameter of OpenAI's schemas is a declared field, honoured or refused with a 422 naming it —
never ignored: refused here when no engine serves it, by the inference service when the chosen engine lacks the
feature (see ``inference_service.engines.base.Feature``). Fields that only describe a request (``user``,
``metadata``, ``store``, ``service_tier``, …) are accepted. A field outside the schema is ignored, as OpenAI does.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

ModelName = Annotated[str, Field(
    min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$", examples=["smollm2-135m-instruct"],
    description="A served base model's name or a checkpoint id (`ckpt_…`).",
)]

MAX_PROMPT_CHARS = 100_000
MAX_TOOLS = 128
MAX_SCHEMA_DEPTH = 32
MAX_CHOICES = 16
MAX_TOP_LOGPROBS = 20


class ModelOut(BaseModel):
    """OpenAI ``model`` object: a servable base model (``GET /v1/models`` lists them in a ``Page``)."""

    id: str
    object: Literal["model"] = "model"
    owned_by: str = "crucible"


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value: 0 for a scalar, 1 for a flat object or array, and so on."""
    depth, level = 0, [value]
    while containers := [x for x in level if isinstance(x, dict | list)]:
        depth += 1
        level = [v for x in containers for v in (x.values() if isinstance(x, dict) else x)]
    return depth


def _shallow(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """``schema`` if it is a JSON schema (JSON Schema 2020-12's meta-schema, which every draft's common keywords
    satisfy) nested at most :data:`MAX_SCHEMA_DEPTH` levels; ``ValueError`` naming the first fault otherwise. A valid
    schema the engine still cannot decode under (an unresolvable ``$ref``, an unsatisfiable range) is refused when
    the request is admitted."""
    if schema is None:
        return None
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        raise ValueError(f"the schema is nested more than {MAX_SCHEMA_DEPTH} levels")
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    fault = best_match(Draft202012Validator(Draft202012Validator.META_SCHEMA).iter_errors(schema))
    if fault is not None:
        where = "/".join(str(p) for p in fault.absolute_path)
        raise ValueError(f"not a JSON schema{f' at {where}' if where else ''}: {fault.message}")
    return schema


StrictInt = Annotated[int, Strict()]  # JSON numbers only: "3", 3.0 and true are refused, not coerced
StrictBool = Annotated[bool, Strict()]  # JSON true/false only


# ----------------------------------------------------------------- messages and tools


class ToolCallFunction(BaseModel):
    """The function a tool call names and its arguments, a JSON object as a string (OpenAI's form)."""

    name: str = Field(max_length=64)
    arguments: str = Field(max_length=MAX_PROMPT_CHARS)


class MessageToolCall(BaseModel):
    """One tool call of an assistant message."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(max_length=200)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    """One chat message, as in the OpenAI API.

    Accepted as OpenAI sends them: ``content`` as a string or an array of text parts (their texts joined; any other
    part type — image, audio, file — is a 422 naming it); the ``developer`` role is read as ``system``, which it
    replaces in OpenAI's newer models; an assistant message may carry ``tool_calls`` with ``content`` null; a ``tool``
    message gives a call's result (``tool_call_id``). ``name`` (a participant's name) is accepted and not shown.
    """

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    name: str | None = Field(None, max_length=64)
    tool_calls: list[MessageToolCall] | None = Field(None, max_length=MAX_TOOLS)
    tool_call_id: str | None = Field(None, max_length=200)

    @field_validator("role", mode="before")
    @classmethod
    def _developer_is_system(cls, role: Any) -> Any:
        return "system" if role == "developer" else role

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, content: Any) -> Any:
        if not isinstance(content, list):
            return content
        if not content:
            raise PydanticCustomError("content_parts", "content as an array needs at least one part")
        texts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind not in ("text", "refusal"):
                raise PydanticCustomError("content_part", "content part {i} is of type {kind}: only text parts are served", {"i": i, "kind": str(kind)})
            text = part.get(kind)
            if not isinstance(text, str):
                raise PydanticCustomError("content_part", "content part {i} has no {kind}", {"i": i, "kind": kind})
            texts.append(text)
        return "".join(texts)

    @model_validator(mode="after")
    def _content_or_calls(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise PydanticCustomError("missing_content", "content is required (it may be null only in an assistant message with tool_calls)")
        if self.tool_calls and self.role != "assistant":
            raise PydanticCustomError("tool_calls_role", "only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise PydanticCustomError("tool_call_id", "a tool message needs tool_call_id (the call it answers)")
        return self

    def chars(self) -> int:
        """Characters the message adds to the prompt (its content and its calls' names and arguments)."""
        calls = sum(len(c.function.name) + len(c.function.arguments) for c in self.tool_calls or [])
        return len(self.content or "") + calls

    def as_dict(self) -> dict[str, Any]:
        """The message as the chat template reads it (``role``, ``content`` and, if any, ``tool_calls``/``tool_call_id``)."""
        return self.model_dump(exclude_none=True, exclude={"name"}) | {"content": self.content}


class FunctionDefinition(BaseModel):
    """A function the model may call (OpenAI ``tools[].function``); ``parameters`` is a JSON-schema object
    (``{"type": "object", "properties": {...}, "required": [...]}``) nested at most 32 levels. ``strict`` is
    accepted: arguments of a forced call (``tool_choice``) always follow the schema."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema_object(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        if parameters is not None and parameters.get("type") != "object":
            raise ValueError('parameters must be a JSON-schema object: {"type": "object", "properties": {...}}')
        return _shallow(parameters)


class ChatTool(BaseModel):
    """One entry of ``tools`` (OpenAI): a function tool."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str = Field(max_length=64)


class NamedToolChoice(BaseModel):
    """``tool_choice`` naming one function: the model must call it."""

    type: Literal["function"]
    function: NamedFunction


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    """JSON mode: the answer is a JSON object."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["json_object"]


class JsonSchemaSpec(BaseModel):
    """A named JSON schema the answer must follow (``strict`` accepted: decoding always follows the schema)."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _check_depth(cls, schema: dict[str, Any]) -> dict[str, Any]:
        return _shallow(schema) or {}


class JsonSchemaFormat(BaseModel):
    """Structured outputs: the answer follows ``json_schema.schema``."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class StreamOptions(BaseModel):
    """``include_usage``: one last chunk with the usage and no choices. ``include_obfuscation`` (random padding
    against length side channels) is not served: omit it or send false."""

    model_config = ConfigDict(extra="forbid")

    include_usage: bool | None = None
    include_obfuscation: Literal[False] | None = None


LogitBias = Annotated[dict[str, Annotated[float, Field(ge=-100, le=100)]], Field(max_length=300)]


def _check_logit_bias(bias: dict[str, float] | None) -> dict[str, float] | None:
    for key in bias or {}:
        if not (key.isascii() and key.isdigit() and len(key) <= 10):
            raise ValueError(f"logit_bias keys are token ids (decimal digits); {key!r} is not")
    return bias


class _Sampling(BaseModel):
    """Parameters shared by chat and text completions. A field not in the request model is a 422 naming it (OpenAI
    refuses unknown parameters too; vLLM's extensions such as ``top_k`` are not served), as is a value of the wrong
    JSON type (no coercion of ``"3"`` to 3)."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 decodes greedily.")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: StrictInt = Field(1, ge=1, le=MAX_CHOICES, description="Choices to generate, each charged.")
    stop: str | list[str] | None = Field(None, description="Up to 4 strings; the text ends before the first.")
    seed: StrictInt | None = Field(None, ge=0, le=2**63 - 1, description="Reproducible sampling (for the same batch).")
    stream: StrictBool = Field(False, description="Server-sent events (`data: {chunk}` … `data: [DONE]`).")
    stream_options: StreamOptions | None = None
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias | None = Field(None, description="Token id (as a string) → bias in [-100, 100], added to its logit.")
    user: str | None = Field(None, max_length=256, description="Accepted and not used (an end-user id).")

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        return _check_logit_bias(bias)

    @field_validator("stop")
    @classmethod
    def _four_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop strings")
        if stop == "" or (isinstance(stop, list) and "" in stop):
            raise ValueError("a stop string must not be empty")
        return stop

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, options: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if options is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed with stream: true")
        return options

    def stop_list(self) -> list[str] | None:
        return [self.stop] if isinstance(self.stop, str) else self.stop

    def bias_by_id(self) -> dict[int, float] | None:
        return {int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None


# ----------------------------------------------------------------- chat completions


class ChatCompletionRequest(_Sampling):
    """OpenAI ``POST /v1/chat/completions`` request; ``model`` is a base model name or a ``ckpt_…``.

    ``tools`` are shown to the model in the prompt: through the model's chat template when it renders tools,
    otherwise as JSON lines appended to the system message (``inference_service.chat.TOOLS_HEADER``); their tokens
    are prompt tokens. ``tool_choice``: ``auto`` (the default with tools) parses calls out of the answer
    (``<tool_call>{…}</tool_call>`` blocks, or an answer that is only JSON calls); ``none`` returns the answer as
    text; ``required`` and a named function decode the call under its JSON schema. ``response_format``
    ``json_object``/``json_schema`` decode the answer under the schema. ``max_tokens`` omitted: the answer may run to
    the end of the context.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {
        "model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is 12 + 30?"}], "max_tokens": 16, "temperature": 0}})

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1, description="Deprecated by OpenAI for max_completion_tokens; same meaning.")
    max_completion_tokens: StrictInt | None = Field(None, ge=1, description="Cap on generated tokens per choice; omitted: the context's end.")
    tools: list[ChatTool] | None = Field(None, min_length=1, max_length=MAX_TOOLS, description="Functions the model may call (OpenAI format).")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = Field(None, description="false: at most one call per answer.")
    logprobs: StrictBool | None = Field(None, description="Return each generated token's log-probability.")
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description="With logprobs: the most likely alternatives per token.")
    response_format: ResponseFormat | None = None
    modalities: list[Literal["text"]] | None = Field(None, description="Only text is served.")
    audio: None = Field(None, description="Audio output is not served; omit.")
    prediction: None = Field(None, description="Predicted outputs are not served; omit.")
    web_search_options: None = Field(None, description="Web search is not served; omit.")
    reasoning_effort: None = Field(None, description="Not served: thinking is a benchmark's evaluation setting; omit.")
    functions: None = Field(None, description="Deprecated by OpenAI and not served: use `tools`.")
    function_call: None = Field(None, description="Deprecated by OpenAI and not served: use `tool_choice`.")
    metadata: dict[str, str] | None = Field(None, max_length=16, description="Accepted and not used.")
    store: bool | None = Field(None, description="Accepted and not used (completions are logged per run regardless).")
    service_tier: str | None = Field(None, max_length=32, description="Accepted and not used.")
    safety_identifier: str | None = Field(None, max_length=256, description="Accepted and not used (an end-user id).")
    prompt_cache_key: str | None = Field(None, max_length=256, description="Accepted and not used: the engine's prefix cache keys on the prompt itself.")
    prompt_cache_retention: Literal["in_memory", "24h"] | None = Field(None, description="Accepted and not used (a cache-lifetime hint).")
    prompt_cache_options: dict[str, Any] | None = Field(None, description="Accepted and not used (a cache-lifetime hint).")
    verbosity: None = Field(None, description="Not served; omit.")
    moderation: None = Field(None, description="Moderation is not served; omit.")

    @field_validator("messages")
    @classmethod
    def _chars(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if sum(m.chars() for m in messages) > MAX_PROMPT_CHARS:
            raise ValueError(f"the messages total more than {MAX_PROMPT_CHARS} characters")
        return messages

    @model_validator(mode="after")
    def _tools_chars(self) -> ChatCompletionRequest:
        if self.tools and sum(m.chars() for m in self.messages) + len(json.dumps(self.tool_dicts())) > MAX_PROMPT_CHARS:
            raise ValueError(f"the messages and tools (as JSON) total more than {MAX_PROMPT_CHARS} characters")
        return self

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return top

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_limit(cls, limit: int | None, info: ValidationInfo) -> int | None:
        other = info.data.get("max_tokens")
        if limit is not None and other is not None and other != limit:
            raise ValueError(f"max_tokens ({other}) and max_completion_tokens ({limit}) differ; send one")
        return limit

    @field_validator("parallel_tool_calls")
    @classmethod
    def _parallel_needs_tools(cls, parallel: bool | None, info: ValidationInfo) -> bool | None:
        if parallel is not None and not info.data.get("tools"):
            raise ValueError("parallel_tool_calls is only allowed with tools")
        return parallel

    @field_validator("tool_choice")
    @classmethod
    def _choice_needs_tools(cls, choice: Any, info: ValidationInfo) -> Any:
        names = {t.function.name for t in info.data.get("tools") or []}
        if choice is not None and not names:
            raise ValueError(f"tool_choice {json.dumps(_plain(choice))} is only allowed with tools")
        if (choice == "required" or isinstance(choice, NamedToolChoice)) and not names:
            raise ValueError(f"tool_choice {json.dumps(_plain(choice))} needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not one of the tools")
        return choice

    @field_validator("response_format")
    @classmethod
    def _one_constraint(cls, response_format: Any, info: ValidationInfo) -> Any:
        choice = info.data.get("tool_choice")
        if response_format is not None and response_format.type != "text" and (choice == "required" or isinstance(choice, NamedToolChoice)):
            raise ValueError("a forced tool call and a JSON response_format cannot both constrain the answer")
        return response_format

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """``tools`` as plain JSON objects (unset fields left out), as the engine renders them."""
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def completion_limit(self) -> int | None:
        """Max completion tokens requested (``max_completion_tokens`` wins over ``max_tokens``); ``None``: to the
        context's end."""
        return self.max_completion_tokens or self.max_tokens


def _plain(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    """A generated token's log-probability (natural log, the model's own) and its most likely alternatives."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None


class AssistantMessage(BaseModel):
    """The answer: text ``content``, or ``tool_calls`` (then ``content`` is whatever text came with them, often null)."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[MessageToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


class PromptTokensDetails(BaseModel):
    """How many prompt tokens were served from the engine's prefix cache (charged at the cached price)."""

    cached_tokens: int = 0


class Usage(BaseModel):
    """Token counts of one call (units: tokens), as OpenAI reports them: prompt tokens once, completion tokens
    summed over the choices."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class ChatCompletion(BaseModel):
    """OpenAI ``chat.completion`` object."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallFunction | None = None


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat completion (OpenAI ``chat.completion.chunk``). With
    ``stream_options.include_usage`` every chunk has ``usage: null`` and a last one has the usage and no choices."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


# ----------------------------------------------------------------- text completions (legacy, for log-likelihood tools)


class CompletionRequest(_Sampling):
    """OpenAI ``POST /v1/completions`` request: the model continues ``prompt`` as given (no chat template).

    ``prompt``: a string, a list of strings (a batch: choice ``i * n + j`` is prompt ``i``'s ``j``-th), token ids, or
    a list of token-id lists. ``echo``: the answer starts with the prompt (with ``logprobs``, the prompt tokens'
    log-probabilities too: what log-likelihood evaluation reads). ``max_tokens`` defaults to 16 as OpenAI's; 0 with
    ``echo`` scores the prompt alone.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {
        "model": "smollm2-135m-instruct", "prompt": "The capital of France is", "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}})

    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]] = Field(description="Text, texts, token ids, or lists of token ids.")
    echo: StrictBool = Field(False, description="Return the prompt before the completion (not with `stream`).")
    max_tokens: StrictInt | None = Field(16, ge=0, description="Cap on generated tokens per choice; null: the context's end.")
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description="Log-probabilities of each token and this many alternatives.")
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES, description="Only equal to n (or omitted) is served: candidates are not ranked.")
    suffix: None = Field(None, description="Insertion (text after the completion) is not served; omit.")

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, prompt: Any) -> Any:
        prompts = [prompt] if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)) else prompt
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("the prompt must not be empty")
        if len(prompts) > 64:
            raise ValueError("at most 64 prompts per request")
        if sum(len(p) if isinstance(p, str) else len(p) * 4 for p in prompts) > MAX_PROMPT_CHARS * 4:
            raise ValueError(f"the prompts total more than {MAX_PROMPT_CHARS * 4} characters")
        return prompt

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, best_of: int | None, info: ValidationInfo) -> int | None:
        if best_of is not None and best_of != info.data.get("n"):
            raise ValueError("only best_of equal to n is served (candidates are not ranked)")
        return best_of

    @field_validator("echo")
    @classmethod
    def _echo_not_streamed(cls, echo: bool, info: ValidationInfo) -> bool:
        if echo and info.data.get("stream"):
            raise ValueError("echo is not served with stream: true (send stream: false; the prompt's log-probabilities come with the result)")
        return echo

    @field_validator("max_tokens")
    @classmethod
    def _zero_needs_echo(cls, max_tokens: int | None, info: ValidationInfo) -> int | None:
        if max_tokens == 0 and not info.data.get("echo"):
            raise ValueError("max_tokens 0 needs echo: true")
        return max_tokens

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the batch, each text or token ids."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class CompletionLogprobs(BaseModel):
    """Per token of the returned text: its text, log-probability (``null`` for the first prompt token), its most likely
    alternatives (token → log-probability), and its character offset in the returned text."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class Completion(BaseModel):
    """OpenAI ``text_completion`` object (also each streamed event, with partial ``text``)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
