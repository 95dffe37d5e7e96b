"""Chat prompts, the same for every engine.

:class:`ChatRenderer` turns OpenAI messages and tools into the prompt text a base model continues, with the
model's own chat template. Templates that ignore ``tools`` (SmolLM2's does) get them in the system message
(:func:`with_tools_message`); templates that do not render an assistant's ``tool_calls`` get them as the text the
model is asked to produce (:func:`tool_call_text`), and a ``tool`` message's result as its content.

That text is Hermes' format, ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``, the one
:mod:`inference_service.tool_calls` reads back from an answer.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference_service.engines.base import GenerationRequest

TOOLS_HEADER = "Here is a list of functions in JSON format that you can invoke, one per line:"
_PROBE_TOOL = {"type": "function", "function": {"name": "crucible_probe_tool", "description": "", "parameters": {"type": "object", "properties": {}}}}
_PROBE_CALL = {"id": "call_probe", "type": "function", "function": {"name": "crucible_probe_call", "arguments": "{}"}}


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
