"""Chat prompts and tool calls, the same for every engine.

:class:`ChatRenderer` turns OpenAI messages and tools into the prompt text a base model continues, with the
model's own chat template. Templates that ignore ``tools`` (SmolLM2's does) get them in the system message
(:func:`with_tools_message`); templates that do not render an assistant's ``tool_calls`` get them as the text the
model is asked to produce (:func:`tool_call_text`), and a ``tool`` message's result as its content.

The model calls a tool by answering ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` (one or several;
Hermes' format, which SmolLM2 and Qwen use); an answer that is only such JSON (an object or a list of objects)
counts too. :func:`parse_tool_calls` reads them back; :func:`tool_call_schema` is the JSON schema a forced call
(``tool_choice`` ``required`` or a named function) is decoded under, as vLLM does.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference_service.engines.base import GenerationRequest

TOOLS_HEADER = "Here is a list of functions in JSON format that you can invoke, one per line:"
_PROBE_TOOL = {"type": "function", "function": {"name": "crucible_probe_tool", "description": "", "parameters": {"type": "object", "properties": {}}}}
_PROBE_CALL = {"id": "call_probe", "type": "function", "function": {"name": "crucible_probe_call", "arguments": "{}"}}
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def with_tools_message(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with ``tools`` described in the system message, for chat templates that ignore tools.

    The description is :data:`TOOLS_HEADER` followed by one line per tool, ``json.dumps(tool, ensure_ascii=False)``
    (keys in the order given), appended to the first message after a blank line if it is a system message,
    else sent as a new first system message. Deterministic; ``messages`` is not modified.
    """
    text = "\n".join([TOOLS_HEADER, *(json.dumps(tool, ensure_ascii=False) for tool in tools)])
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def tool_call_text(tool_calls: list[dict[str, Any]]) -> str:
    """An assistant's ``tool_calls`` as the text the model produces for them: one ``<tool_call>`` block per call,
    ``{"name", "arguments"}`` with the arguments parsed back from their JSON string when they are JSON."""
    blocks = []
    for call in tool_calls:
        arguments: Any = call["function"].get("arguments", "{}")
        try:
            arguments = json.loads(arguments)
        except (TypeError, ValueError):
            pass
        blocks.append(f"<tool_call>{json.dumps({'name': call['function']['name'], 'arguments': arguments}, ensure_ascii=False)}</tool_call>")
    return "\n".join(blocks)


class TokenIdOutOfRange(ValueError):
    """A token id the model's vocabulary does not have, in the request field ``field``."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def end_of_turn_ids(model_dir: Path, tokenizer: Any) -> list[int]:
    """Token ids that end the model's turn, sorted: the tokenizer's end of sequence and ``eos_token_id`` of the
    folder's ``generation_config.json`` (where a model card's ``stop_tokens`` are written when the model is prepared,
    :mod:`services.common.llms`; Gemma's ``<end_of_turn>`` is one). Every engine stops a choice at these, and none
    of them counts as text."""
    from transformers import GenerationConfig

    ids = {tokenizer.eos_token_id}
    if (Path(model_dir) / "generation_config.json").exists():
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
        ids.update(eos if isinstance(eos, list | tuple) else [eos])
    return sorted(i for i in ids if i is not None)


class ChatRenderer:
    """Renders chat prompts with one tokenizer's chat template (probed once for what it shows)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._lock = threading.Lock()  # a fast tokenizer may not be used from two threads at once
        probe = [{"role": "user", "content": "hi"}]
        self.renders_tools = "crucible_probe_tool" in self._apply(probe, [_PROBE_TOOL])
        try:
            self.renders_tool_calls = "crucible_probe_call" in self._apply(
                [*probe, {"role": "assistant", "content": None, "tool_calls": [_PROBE_CALL]}, {"role": "user", "content": "ok"}], None)
        except Exception:  # noqa: BLE001 - a template may fail on messages it does not know; then we render them
            self.renders_tool_calls = False

    def _apply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text: ``messages`` (and ``tools``) with the chat template, plus the assistant header that
        generation starts from."""
        if not self.renders_tool_calls:
            messages = [self._plain(m) for m in messages]
        if tools and not self.renders_tools:
            messages, tools = with_tools_message(messages, tools), None
        return self._apply(messages, tools)

    def prompt_ids(self, request: GenerationRequest, vocab_size: int) -> list[int]:
        """Token ids of a request's prompt, the same for every engine: chat messages rendered (:meth:`render`) and
        tokenized without special tokens (the template writes them), a text prompt tokenized with them (as vLLM and
        OpenAI do), token ids as given. Raises ``ValueError`` for a token id outside ``[0, vocab_size)``
        (:class:`TokenIdOutOfRange`, naming the field, for one in ``logit_bias``)."""
        if request.logit_bias and max(request.logit_bias) >= vocab_size:
            raise TokenIdOutOfRange(f"logit_bias: token id {max(request.logit_bias)} is not in [0, {vocab_size})", "logit_bias")
        if isinstance(request.prompt, list):
            if any(not 0 <= t < vocab_size for t in request.prompt):
                raise ValueError(f"prompt token ids must be in [0, {vocab_size})")
            return list(request.prompt)
        text = request.prompt if request.prompt is not None else self.render(request.messages or [], request.tools)
        with self._lock:
            return self.tokenizer(text, add_special_tokens=request.prompt is not None)["input_ids"]

    @staticmethod
    def _plain(message: dict[str, Any]) -> dict[str, Any]:
        """A message as ``{"role", "content"}`` text for templates that only show content."""
        content = message.get("content") or ""
        if message.get("tool_calls"):
            content = "\n".join(part for part in [content, tool_call_text(message["tool_calls"])] if part)
        return {"role": message["role"], "content": content}


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the function's name and its arguments as a JSON string (as OpenAI sends them)."""

    id: str
    name: str
    arguments: str


def _calls_in(value: Any, names: set[str]) -> list[ToolCall] | None:
    """Calls in a decoded JSON value (an object or a list of objects with a known ``name`` and object
    ``arguments``/``parameters``); ``None`` if it is anything else."""
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        calls.append(ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=item["name"], arguments=json.dumps(arguments, ensure_ascii=False)))
    return calls or None


def parse_tool_calls(text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[ToolCall]]:
    """Split a model's answer into content and tool calls.

    Calls are ``<tool_call>…</tool_call>`` blocks (an unterminated last block counts: the answer may end at
    ``max_tokens``) each holding a JSON object or list of calls, or an answer that is only such JSON. A call must
    name one of ``tools`` and give its arguments as an object, else the answer is plain content. Returns
    ``(content, calls)``: the text outside the blocks (``None`` if empty) and the calls in order.
    """
    names = {t["function"]["name"] for t in tools}
    blocks = _TOOL_CALL_BLOCK.findall(text)
    if blocks:
        calls: list[ToolCall] = []
        for block in blocks:
            try:
                found = _calls_in(json.loads(block), names)
            except ValueError:
                found = None
            if found is None:
                return text, []
            calls.extend(found)
        content = _TOOL_CALL_BLOCK.sub("", text).strip()
        return content or None, calls
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            found = _calls_in(json.loads(stripped), names)
        except ValueError:
            found = None
        if found:
            return None, found
    return text, []


def may_become_tool_call(text: str) -> bool:
    """Whether a partial answer could still turn out to be a tool call (a stream holds it back until it knows)."""
    stripped = text.lstrip()
    return not stripped or stripped[0] in "{[" or "<tool_call>".startswith(stripped[:11])


def tool_call_schema(tools: list[dict[str, Any]], name: str | None = None) -> dict[str, Any]:
    """JSON schema of a forced call: for ``name``, that function's arguments object; otherwise a non-empty list
    of ``{"name": <one of tools>, "arguments": <its parameters>}`` (vLLM's schema for ``tool_choice: required``)."""
    def parameters(tool: dict[str, Any]) -> dict[str, Any]:
        return tool["function"].get("parameters") or {"type": "object", "properties": {}}

    if name is not None:
        return parameters(next(t for t in tools if t["function"]["name"] == name))
    return {"type": "array", "minItems": 1, "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]}, "arguments": parameters(t)},
         "required": ["name", "arguments"]} for t in tools]}}
