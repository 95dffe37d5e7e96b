"""Tool calls read back from a model's answer, the same for every engine, under the request's ``tool_choice``.

The model calls a tool by answering ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` (one or several;
Hermes' format, which SmolLM2 and Qwen use, and which :func:`inference_service.chat.tool_call_text` writes back into a
prompt); an answer that is only such JSON (an object or a list of objects) counts too. :func:`parse_tool_calls` reads
them back; :func:`tool_call_schema` is the JSON schema a forced call (``tool_choice`` ``required`` or a named function)
is decoded under, as vLLM does.

On top, the OpenAI ``tool_choice`` (:func:`tool_mode`): ``auto`` parses calls out of the answer, ``required`` and a
named function decode under :func:`forced_call_schema` and read the answer as the call(s), ``none`` reads no call.
:func:`answer_tool_calls` is the one reading of a finished answer, streamed or not; a stream holds back the text that
may still become a call (:class:`ToolCallHoldback`) and sends the calls at the choice's end, as parsed for the whole
answer.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from services.common.openai_protocol import ChatCompletionRequest, MessageToolCall, NamedToolChoice, ToolCallFunction

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

ToolMode = Literal["none", "auto", "required", "named"]


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


# ---------------------------------------------------------------------- the OpenAI tool_choice


def tool_mode(req: ChatCompletionRequest) -> ToolMode | None:
    """``None`` without tools; else ``none``, ``auto``, ``required`` or ``named``."""
    if not req.tools:
        return None
    if isinstance(req.tool_choice, NamedToolChoice):
        return "named"
    return req.tool_choice or "auto"


def forced_call_schema(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """The JSON schema the answer is decoded under when ``tool_choice`` forces a call (``required``: at most one call
    without ``parallel_tool_calls``; a named function: its arguments); ``None`` when it does not."""
    mode, tools = tool_mode(req), req.tool_dicts() or []
    if mode == "required":
        schema = tool_call_schema(tools)
        if req.parallel_tool_calls is False:
            schema["maxItems"] = 1
        return schema
    if mode == "named":
        assert isinstance(req.tool_choice, NamedToolChoice)
        return tool_call_schema(tools, req.tool_choice.function.name)
    return None


def answer_tool_calls(req: ChatCompletionRequest, text: str) -> tuple[str | None, list[MessageToolCall]]:
    """Content and tool calls of a finished answer under the request's ``tool_choice``."""
    mode = tool_mode(req)
    if mode in (None, "none"):
        return text, []
    if mode == "named":
        assert isinstance(req.tool_choice, NamedToolChoice)
        try:
            arguments = json.loads(text)
        except ValueError:
            return text, []  # cut short by max_tokens: the text as it is
        wire = json.dumps(arguments, ensure_ascii=False)
        return None, [MessageToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=ToolCallFunction(name=req.tool_choice.function.name, arguments=wire))]
    content, calls = parse_tool_calls(text if mode == "auto" else f"<tool_call>{text}</tool_call>", req.tool_dicts() or [])
    if mode == "required" and not calls:
        return text, []
    if req.parallel_tool_calls is False:
        calls = calls[:1]
    return content, [MessageToolCall(id=c.id, function=ToolCallFunction(name=c.name, arguments=c.arguments)) for c in calls]


class ToolCallHoldback:
    """The streamed text of one choice that may still become a tool call. With tools, text is held back until it
    cannot become one (``auto`` only: then it is released as content and the rest streams as it comes) or the
    choice ends (:attr:`holding` still: the caller reads the whole answer with :func:`answer_tool_calls`)."""

    def __init__(self, mode: ToolMode | None) -> None:
        self.mode = mode
        self.holding = mode in ("auto", "required", "named")
        self.held = ""

    def feed(self, text: str) -> str:
        """The text to stream now, of ``text`` and what was held back before it."""
        if not self.holding:
            return text
        self.held += text
        if self.mode == "auto" and not may_become_tool_call(self.held):
            text, self.held, self.holding = self.held, "", False
            return text
        return ""
