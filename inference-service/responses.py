"""Engine results as OpenAI answers: a whole ``chat.completion`` or ``text_completion``, or a stream of server-sent
events (:class:`ChatStream`, :class:`CompletionStream`, framed by :func:`sse`).

Invariants: ``usage`` counts the prompt once per prompt and every generated token of every choice, the prompt tokens
served from a prefix cache in ``prompt_tokens_details.cached_tokens`` (what the ledger is charged, :mod:`.metering`).
Log-probabilities are the engine's, one per generated token whose text is in the answer. A chat choice's tool calls are
read from the whole answer under ``tool_choice`` (:func:`~inference_service.tool_calls.answer_tool_calls`), streamed
or not, and turn its ``finish_reason`` into ``tool_calls``. A stream answers every event of one call with the same
``id`` and ``created``, ends each choice with its ``finish_reason``, sends the usage last if asked
(``stream_options.include_usage``), then :data:`DONE`; a generation that fails once the stream has begun ends it with
one :func:`error_event` (as OpenAI and vLLM report an error inside a stream), then :data:`DONE`.
"""

from __future__ import annotations

import json
import time

from inference_service.engines.base import Choice, Delta, GenerationResult, TokenLogprob
from inference_service.engines.tokens import CharOffsets, shown
from inference_service.tool_calls import ToolCallHoldback, answer_tool_calls, tool_mode
from pydantic import BaseModel

from services.common.openai_protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatTokenLogprob,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    PromptTokensDetails,
    ToolCallDelta,
    TopLogprob,
    Usage,
)

DONE = "data: [DONE]\n\n"


def sse(event: BaseModel) -> str:
    """One server-sent event holding ``event``."""
    return f"data: {event.model_dump_json(exclude_none=False)}\n\n"


def error_event(exc: BaseException) -> str:
    """The event that ends a stream whose generation failed (the exception's type only: no internals)."""
    error = {"message": f"the generation failed: {type(exc).__name__}", "type": "server_error", "code": "generation_failed"}
    return f"data: {json.dumps({'error': error})}\n\n"


def usage(results: list[GenerationResult], billed_prompt_tokens: int | None = None) -> Usage:
    """OpenAI's ``usage`` of a call's results; ``billed_prompt_tokens``: the prompt as billed instead (none cached,
    :class:`~inference_service.metering.Metering`)."""
    prompt = sum(r.prompt_tokens for r in results) if billed_prompt_tokens is None else billed_prompt_tokens
    cached = sum(r.cached_prompt_tokens for r in results) if billed_prompt_tokens is None else 0
    completion = sum(r.completion_tokens for r in results)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


# ---------------------------------------------------------------------- chat completions


def chat_completion(req: ChatCompletionRequest, call_id: str, result: GenerationResult, billed_prompt_tokens: int | None = None) -> ChatCompletion:
    """The whole answer of a chat completion (``billed_prompt_tokens`` as :func:`usage`)."""
    choices = [_chat_choice(req, i, choice) for i, choice in enumerate(result.choices)]
    return ChatCompletion(id=call_id, created=int(time.time()), model=req.model, choices=choices, usage=usage([result], billed_prompt_tokens))


def _token_logprob(entry: TokenLogprob) -> ChatTokenLogprob:
    return ChatTokenLogprob(token=entry.token, logprob=entry.logprob, bytes=entry.bytes,
                            top_logprobs=[TopLogprob(token=t, logprob=lp, bytes=b) for t, lp, b in entry.top])


def _chat_choice(req: ChatCompletionRequest, index: int, choice: Choice) -> ChatChoice:
    content, calls = answer_tool_calls(req, choice.text)
    logprobs = ChoiceLogprobs(content=[_token_logprob(e) for e in choice.logprobs]) if choice.logprobs is not None else None
    return ChatChoice(index=index, message=AssistantMessage(content=content, tool_calls=calls or None),
                      finish_reason="tool_calls" if calls else choice.finish_reason, logprobs=logprobs)


class ChatStream:
    """Turns engine deltas into ``chat.completion.chunk`` events. Content streams as it comes; with tools, text that
    may still become a tool call is held back (:class:`~inference_service.tool_calls.ToolCallHoldback`) until it
    cannot (then streamed as content) or the choice ends (then sent as one ``tool_calls`` delta, as parsed for the
    whole answer)."""

    def __init__(self, req: ChatCompletionRequest, call_id: str, billed_prompt_tokens: int | None = None) -> None:
        self.req, self.id, self.created, self.billed = req, call_id, int(time.time()), billed_prompt_tokens
        self.held = [ToolCallHoldback(tool_mode(req)) for _ in range(req.n)]

    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.req.model, choices=choices, usage=usage)

    def opening(self) -> list[ChatCompletionChunk]:
        """The assistant's role, for every choice."""
        return [self._chunk([ChunkChoice(index=i, delta=ChunkDelta(role="assistant", content="")) for i in range(self.req.n)])]

    def delta(self, delta: Delta) -> list[ChatCompletionChunk]:
        """Content as it comes (the choice's end is sent by :meth:`closing`: its calls need the whole text)."""
        logprobs = ChoiceLogprobs(content=[_token_logprob(e) for e in delta.logprobs]) if delta.logprobs else None
        text = self.held[delta.index].feed(delta.text)
        if not text and logprobs is None:
            return []
        return [self._chunk([ChunkChoice(index=delta.index, delta=ChunkDelta(content=text), logprobs=logprobs)])]

    def closing(self, result: GenerationResult) -> list[ChatCompletionChunk]:
        """Each choice's end (with what was held back, read as content and tool calls), then the usage if asked."""
        events = []
        for i, choice in enumerate(result.choices):
            if self.held[i].holding:
                content, calls = answer_tool_calls(self.req, choice.text)
                tool_deltas = [ToolCallDelta(index=k, id=c.id, type="function", function=c.function) for k, c in enumerate(calls)] or None
                events.append(self._chunk([ChunkChoice(index=i, delta=ChunkDelta(content=content, tool_calls=tool_deltas),
                                                       finish_reason="tool_calls" if calls else choice.finish_reason)]))
            else:
                events.append(self._chunk([ChunkChoice(index=i, delta=ChunkDelta(), finish_reason=choice.finish_reason)]))
        if self.req.stream_options and self.req.stream_options.include_usage:
            events.append(self._chunk([], usage([result], self.billed)))
        return events


# ---------------------------------------------------------------------- text completions


def completion(req: CompletionRequest, call_id: str, results: list[GenerationResult]) -> Completion:
    """The whole answer of a text completion: ``n`` choices per prompt, in the prompts' order."""
    choices = [_completion_choice(req, prompt_i * req.n + j, result, choice)
               for prompt_i, result in enumerate(results) for j, choice in enumerate(result.choices)]
    return Completion(id=call_id, created=int(time.time()), model=req.model, choices=choices, usage=usage(results))


def _completion_logprobs(entries: list[TokenLogprob | None], first: bytes = b"", offsets: CharOffsets | None = None) -> CompletionLogprobs:
    """Per entry: token, log-probability, alternatives, character offset in the choice's text (:class:`CharOffsets`
    over the tokens' own bytes, so an offset indexes the text even where tokens split a character; ``offsets`` carries
    a stream's count across its deltas). A missing entry (the first prompt token, which has no log-probability) is
    the token of bytes ``first``."""
    out = CompletionLogprobs()
    offsets = offsets or CharOffsets()
    for entry in entries:
        out.tokens.append(entry.token if entry else shown(first))
        out.token_logprobs.append(entry.logprob if entry else None)
        out.top_logprobs.append({t: lp for t, lp, _ in entry.top} if entry else None)
        out.text_offset.append(offsets.add(entry.bytes if entry else first))
    return out


def _completion_choice(req: CompletionRequest, index: int, result: GenerationResult, choice: Choice) -> CompletionChoice:
    """Choice ``index``: with ``echo``, the prompt before the text (and its log-probabilities before the text's)."""
    prefix = ""
    logprobs = None
    if req.echo:
        prompt = req.prompts()[index // req.n]
        prefix = prompt if isinstance(prompt, str) else (result.prompt_text or "")
    if req.logprobs is not None:
        entries: list[TokenLogprob | None] = []
        if req.echo:
            entries.extend(result.prompt_logprobs or [])
        entries.extend(choice.logprobs or [])
        logprobs = _completion_logprobs(entries, _first_token_bytes(prefix, result) if req.echo else b"")
    return CompletionChoice(index=index, text=prefix + choice.text, logprobs=logprobs, finish_reason=choice.finish_reason)


def _first_token_bytes(prefix: str, result: GenerationResult) -> bytes:
    """The echoed prompt's first token's bytes: what the other prompt tokens' bytes leave of ``prefix``'s."""
    whole = prefix.encode("utf-8")
    rest = sum(len(e.bytes) for e in (result.prompt_logprobs or [])[1:] if e)
    return whole[: max(0, len(whole) - rest)]


class CompletionStream:
    """Turns engine deltas into streamed ``text_completion`` events (one prompt)."""

    def __init__(self, req: CompletionRequest, call_id: str) -> None:
        self.req, self.id, self.created = req, call_id, int(time.time())
        self.offsets = [CharOffsets() for _ in range(req.n)]  # each choice's tokens so far (``text_offset`` counts from its start)

    def _event(self, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.req.model, choices=choices, usage=usage)

    def opening(self) -> list[Completion]:
        """Nothing: echo is not streamed (refused when the request is read)."""
        return []

    def delta(self, delta: Delta) -> list[Completion]:
        """The new text, its log-probabilities and, on a choice's last delta, its ``finish_reason``."""
        logprobs = _completion_logprobs(list(delta.logprobs), offsets=self.offsets[delta.index]) if delta.logprobs else None
        return [self._event([CompletionChoice(index=delta.index, text=delta.text, logprobs=logprobs, finish_reason=delta.finish_reason)])]

    def closing(self, result: GenerationResult) -> list[Completion]:
        """The usage, if asked."""
        if self.req.stream_options and self.req.stream_options.include_usage:
            return [self._event([], usage([result]))]
        return []
