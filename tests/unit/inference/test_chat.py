"""Chat prompts and tool calls, the same for every engine (:mod:`inference_service.chat`, :mod:`inference_service.tool_calls`)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from inference_service.chat import TOOLS_HEADER, ChatRenderer
from inference_service.tool_calls import may_become_tool_call, parse_tool_calls, tool_call_schema
from transformers import AutoTokenizer

from tests.conftest import prepared_models

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}


@pytest.fixture
def tokenizer() -> object:
    return AutoTokenizer.from_pretrained(prepared_models() / "smollm2-135m-instruct")


def test_a_template_that_ignores_tools_gets_them_in_the_system_message(tokenizer: object) -> None:
    renderer = ChatRenderer(tokenizer)
    assert not renderer.renders_tools and not renderer.renders_tool_calls  # SmolLM2's ChatML template shows content only
    text = renderer.render([{"role": "user", "content": "Weather in Oslo?"}], [WEATHER])
    assert TOOLS_HEADER in text and json.dumps(WEATHER) in text and text.index(TOOLS_HEADER) < text.index("Weather in Oslo?")


def test_a_template_that_renders_tools_and_calls_gets_them(tokenizer: object, monkeypatch: pytest.MonkeyPatch) -> None:
    template = ("{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}"
                "{% for m in messages %}<{{ m.role }}>{{ m.content or '' }}{% for c in m.tool_calls or [] %}[{{ c.function.name }}]{% endfor %}"
                "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    monkeypatch.setattr(tokenizer, "chat_template", template)
    renderer = ChatRenderer(tokenizer)
    assert renderer.renders_tools and renderer.renders_tool_calls
    assert renderer.render([{"role": "user", "content": "hi"}], [WEATHER]) == "<tools>get_weather;</tools><user>hi<assistant>"
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    assert renderer.render([{"role": "assistant", "content": None, "tool_calls": [call]}]) == "<assistant>[get_weather]<assistant>"


def test_an_assistants_tool_calls_and_the_results_are_shown_to_a_plain_template(tokenizer: object) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    text = ChatRenderer(tokenizer).render([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3}'},
    ], [WEATHER])
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>' in text
    assert "<|im_start|>tool\n{\"temp\": 3}<|im_end|>" in text and "None" not in text


@pytest.mark.parametrize(("text", "content", "calls"), [
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>', None, [("get_weather", {"city": "Oslo"})]),
    ('Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
     "Let me check.", [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    ('<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "parameters": {"zone": "CET"}}]</tool_call>',
     None, [("get_weather", {"city": "Oslo"}), ("get_time", {"zone": "CET"})]),
    ('  {"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}  ', None, [("get_weather", {"city": "Rome"})]),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}', None, [("get_weather", {"city": "Oslo"})]),  # cut at max_tokens
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Os', '<tool_call>{"name": "get_weather", "arguments": {"city": "Os', []),
    ('<tool_call>{"name": "launch_missiles", "arguments": {}}</tool_call>', '<tool_call>{"name": "launch_missiles", "arguments": {}}</tool_call>', []),
    ('{"name": "get_weather", "arguments": [1]}', '{"name": "get_weather", "arguments": [1]}', []),
    ('{"city": "Oslo"}', '{"city": "Oslo"}', []),
    ("The weather is fine.", "The weather is fine.", []),
])
def test_tool_calls_are_parsed_only_when_they_name_a_tool_with_object_arguments(text: str, content: str | None, calls: list) -> None:
    got_content, got_calls = parse_tool_calls(text, [WEATHER, TIME])
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls
    assert len({c.id for c in got_calls}) == len(got_calls)


@pytest.mark.parametrize(("partial", "may"), [("", True), ("  ", True), ("{", True), ("[{", True), ("<tool", True), ("<tool_call>{", True),
                                              ("The", False), ("<b>", False), ("1 + 1", False)])
def test_a_stream_holds_back_only_what_may_become_a_call(partial: str, may: bool) -> None:
    assert may_become_tool_call(partial) is may


def test_forced_call_schemas() -> None:
    required = tool_call_schema([WEATHER, TIME])
    jsonschema.validate([{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}], required)
    for bad in ([], [{"name": "get_weather", "arguments": {}}], [{"name": "other", "arguments": {}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, required)
    assert tool_call_schema([WEATHER, TIME], "get_time") == TIME["function"]["parameters"]
