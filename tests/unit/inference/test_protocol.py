"""The OpenAI protocol, honoured or refused — never ignored — driven by the unmodified ``openai`` SDK (sync, async,
streaming, tools) against the inference app of ``conftest.py`` (the real ledger; the test-only model, and the real one where a check reads
what the model says).

The rule test takes every parameter the SDK declares for chat completions and checks it either has its documented
effect (a check per parameter) or is a 422 naming it; a parameter the SDK gains without a case here fails the test.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from typing import Any

import jsonschema
import openai
import pytest
from fastapi.testclient import TestClient
from inference_service.models import CompletionLog
from sqlalchemy import select

from services.common.auth import run_headers
from services.ledger.client import LedgerClient
from services.ledger.schemas import HoldStatus
from tests.unit.inference.conftest import GATEWAY_TOKEN, MODEL, REAL_MODEL, run

Q = [{"role": "user", "content": "What is 3 + 4?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"], "additionalProperties": False}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}}, "required": ["name", "age"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def client(served: TestClient, ledger: LedgerClient) -> openai.OpenAI:
    """The SDK, unmodified, on a run with a budget (through the in-process app; the gateway's token and run headers)."""
    ctx = run(ledger, "run_protocol", budget_usd_micros=10_000_000)
    return openai.OpenAI(base_url="http://inference/internal", api_key=GATEWAY_TOKEN, http_client=served,
                         default_headers=run_headers(ctx, GATEWAY_TOKEN), max_retries=0)


def create(client: openai.OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(**{"model": MODEL, "messages": Q, "max_tokens": 8, "temperature": 0, **kw})


def text(out: Any, i: int = 0) -> str:
    return out.choices[i].message.content


@functools.cache
def plain(client: openai.OpenAI) -> Any:
    """The plain request's answer (greedy, so the same every time it is asked: computed once per client)."""
    return create(client)


# ---------------------------------------------------------------------------- one check per parameter


def same_as_plain(param: str, value: Any) -> Callable[[openai.OpenAI], None]:
    """A parameter that only describes the request: accepted, and the answer is the plain one."""
    def check(client: openai.OpenAI) -> None:
        assert text(create(client, **{param: value})) == text(plain(client))
    return check


def refused(param: str, value: Any) -> Callable[[openai.OpenAI], None]:
    def check(client: openai.OpenAI) -> None:
        with pytest.raises(openai.UnprocessableEntityError) as exc:
            create(client, **{param: value})
        assert exc.value.param.split(".")[0] == param, exc.value.body
    return check


def check_max(param: str) -> Callable[[openai.OpenAI], None]:
    def check(client: openai.OpenAI) -> None:
        out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Write a long story."}], temperature=0, **{param: 3})
        assert (out.usage.completion_tokens, out.choices[0].finish_reason) == (3, "length")
    return check


def check_penalty(param: str) -> Callable[[openai.OpenAI], None]:
    """Penalised, the answer repeats its words less (distinct words / words, greedy, same prompt)."""
    def distinct(answer: str) -> float:
        words = answer.split()
        return len(set(words)) / len(words)

    def check(client: openai.OpenAI) -> None:
        messages = [{"role": "user", "content": "Say hello hello hello hello hello hello hello"}]
        free = text(create(client, model=REAL_MODEL, messages=messages, max_tokens=30))
        penalised = text(create(client, model=REAL_MODEL, messages=messages, max_tokens=30, **{param: 1.5}))
        assert distinct(penalised) > distinct(free)
    return check


def check_logit_bias(client: openai.OpenAI) -> None:
    banana = client.completions.create(model=MODEL, prompt=" banana", max_tokens=0, echo=True, logprobs=0)  # its token id via the tokenizer
    assert banana.choices[0].logprobs.tokens
    from transformers import AutoTokenizer

    from tests.conftest import prepared_models

    token = AutoTokenizer.from_pretrained(prepared_models(MODEL) / MODEL)(" banana", add_special_tokens=False)["input_ids"][0]
    assert text(create(client, max_tokens=2, logit_bias={str(token): 100})).split() == ["banana", "banana"]


def check_logprobs(client: openai.OpenAI) -> None:
    out = create(client, logprobs=True)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens and all(t.logprob <= 0 and t.top_logprobs == [] for t in content)


def check_top_logprobs(client: openai.OpenAI) -> None:
    out = create(client, logprobs=True, top_logprobs=3)
    for token in out.choices[0].logprobs.content:
        assert len(token.top_logprobs) == 3 and token.top_logprobs[0].logprob >= token.top_logprobs[2].logprob
        assert token.top_logprobs[0].token == token.token  # greedy: the chosen token is the most likely


def check_n(client: openai.OpenAI) -> None:
    out = create(client, n=3, temperature=1.0, max_tokens=6, seed=3)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage.completion_tokens == 18 or out.usage.completion_tokens <= 18


def check_parallel_tool_calls(client: openai.OpenAI) -> None:
    out = create(client, messages=[{"role": "user", "content": "Weather in Oslo and Rome?"}], tools=[WEATHER], tool_choice="required",
                 parallel_tool_calls=False, max_tokens=60)
    assert len(out.choices[0].message.tool_calls) == 1 and out.choices[0].finish_reason == "tool_calls"


def check_response_format(client: openai.OpenAI) -> None:
    out = create(client, model=REAL_MODEL, messages=[{"role": "user", "content": "Describe a person."}], max_tokens=60,
                 response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(text(out)), PERSON)
    obj = create(client, model=REAL_MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=40, response_format={"type": "json_object"})
    assert isinstance(json.loads(text(obj)), dict)


def check_seed(client: openai.OpenAI) -> None:
    a, b = (text(create(client, temperature=1.0, seed=5, max_tokens=10)) for _ in range(2))
    assert a == b


def check_stop(client: openai.OpenAI) -> None:
    full = text(create(client, model=REAL_MODEL, max_tokens=12))
    word = full.split()[1]
    out = create(client, model=REAL_MODEL, max_tokens=12, stop=[word])
    assert text(out) == full[: full.index(word)] and out.choices[0].finish_reason == "stop"


def check_stream(client: openai.OpenAI) -> None:
    chunks = list(create(client, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text(plain(client))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "length"


def check_stream_options(client: openai.OpenAI) -> None:
    chunks = list(create(client, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])


def check_temperature(client: openai.OpenAI) -> None:
    assert len({text(create(client, temperature=0, max_tokens=12)) for _ in range(2)}) == 1
    assert len({text(create(client, temperature=2.0, max_tokens=12)) for _ in range(3)}) > 1


def check_top_p(client: openai.OpenAI) -> None:
    assert text(create(client, temperature=1.0, top_p=1e-6)) == text(plain(client))


def check_tool_choice(client: openai.OpenAI) -> None:
    named = create(client, messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER], max_tokens=40,
                   tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and named.choices[0].message.content is None
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    none = create(client, messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER], tool_choice="none")
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content is not None


def check_tools(client: openai.OpenAI) -> None:
    out = create(client, tools=[WEATHER])
    assert out.usage.prompt_tokens > plain(client).usage.prompt_tokens + 20


def check_modalities(client: openai.OpenAI) -> None:
    same_as_plain("modalities", ["text"])(client)
    refused("modalities", ["text", "audio"])(client)


PARAMETERS: dict[str, Callable[[openai.OpenAI], None]] = {
    "messages": lambda c: None if text(plain(c)) else pytest.fail("no answer"),
    "model": lambda c: None if plain(c).model == MODEL else pytest.fail("model"),
    "audio": refused("audio", {"voice": "alloy", "format": "wav"}),
    "frequency_penalty": check_penalty("frequency_penalty"),
    "function_call": refused("function_call", "auto"),
    "functions": refused("functions", [{"name": "f", "parameters": {"type": "object", "properties": {}}}]),
    "logit_bias": check_logit_bias,
    "logprobs": check_logprobs,
    "max_completion_tokens": check_max("max_completion_tokens"),
    "max_tokens": check_max("max_tokens"),
    "metadata": same_as_plain("metadata", {"purpose": "test"}),
    "modalities": check_modalities,
    "moderation": refused("moderation", {"model": "omni-moderation-latest"}),
    "n": check_n,
    "parallel_tool_calls": check_parallel_tool_calls,
    "prediction": refused("prediction", {"type": "content", "content": "7"}),
    "presence_penalty": check_penalty("presence_penalty"),
    "prompt_cache_key": same_as_plain("prompt_cache_key", "agent-7"),
    "prompt_cache_options": same_as_plain("prompt_cache_options", {"ttl": "5m"}),
    "prompt_cache_retention": same_as_plain("prompt_cache_retention", "24h"),
    "reasoning_effort": refused("reasoning_effort", "high"),
    "response_format": check_response_format,
    "safety_identifier": same_as_plain("safety_identifier", "user-1"),
    "seed": check_seed,
    "service_tier": same_as_plain("service_tier", "auto"),
    "stop": check_stop,
    "store": same_as_plain("store", False),
    "stream": check_stream,
    "stream_options": check_stream_options,
    "temperature": check_temperature,
    "tool_choice": check_tool_choice,
    "tools": check_tools,
    "top_logprobs": check_top_logprobs,
    "top_p": check_top_p,
    "user": same_as_plain("user", "agent-1"),
    "verbosity": refused("verbosity", "low"),
    "web_search_options": refused("web_search_options", {}),
}


def test_every_parameter_of_the_sdks_chat_schema_has_a_case() -> None:
    from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming

    from services.common.openai_protocol import ChatCompletionRequest

    declared = set(CompletionCreateParamsStreaming.__annotations__)  # every key, ``stream`` included
    assert sorted(declared ^ set(PARAMETERS)) == []
    assert sorted(declared - set(ChatCompletionRequest.model_fields)) == []


@pytest.mark.parametrize("param", sorted(PARAMETERS))
def test_each_parameter_is_honoured_or_refused(client: openai.OpenAI, param: str) -> None:
    PARAMETERS[param](client)


# ---------------------------------------------------------------------------- engine features, tools, streams


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"logprobs": True}, "logprobs"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
    ({"presence_penalty": 1.0}, "presence_penalty"),
    ({"frequency_penalty": 1.0}, "frequency_penalty"),
    ({"logit_bias": {"7": 5}}, "logit_bias"),
    ({"seed": 3, "temperature": 1.0}, "seed"),
])
def test_a_feature_the_engine_lacks_is_a_422_naming_its_field(client: openai.OpenAI, served: TestClient, monkeypatch: pytest.MonkeyPatch,
                                                             kwargs: dict, field: str) -> None:
    monkeypatch.setattr(served.app.state.inference.engines[MODEL], "features", frozenset())
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        create(client, **kwargs)
    assert exc.value.param == field
    create(client, seed=3)  # greedy: a seed changes nothing, so it needs no feature


def test_a_conversation_with_tool_calls_and_results_is_served(client: openai.OpenAI) -> None:
    first = create(client, messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER], tool_choice="required", max_tokens=60)
    message = first.choices[0].message
    assert message.tool_calls and first.choices[0].finish_reason == "tool_calls"
    call = message.tool_calls[0]
    follow = create(client, tools=[WEATHER], max_tokens=12, messages=[
        {"role": "user", "content": "Weather in Oslo?"}, message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 3, "sky": "snow"})}])
    assert follow.choices[0].message.content and follow.usage.prompt_tokens > first.usage.prompt_tokens


def test_a_streamed_tool_call_arrives_as_one_tool_calls_delta(client: openai.OpenAI) -> None:
    chunks = list(create(client, messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER], max_tokens=40, stream=True,
                         tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert len(calls) == 1 and calls[0].function.name == "get_weather" and json.loads(calls[0].function.arguments)["city"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_async_sdk_streams_concurrent_requests(served: TestClient, ledger: LedgerClient) -> None:
    """Two streams at once through ``AsyncOpenAI`` (the in-process app behind an ASGI transport)."""
    import httpx

    ctx = run(ledger, "run_async_sdk")

    async def main() -> list[str]:
        transport = httpx.ASGITransport(app=served.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://inference") as http:
            client = openai.AsyncOpenAI(base_url="http://inference/internal", api_key=GATEWAY_TOKEN, http_client=http,
                                        default_headers=run_headers(ctx, GATEWAY_TOKEN), max_retries=0)

            async def one(question: str) -> str:
                stream = await client.chat.completions.create(model=REAL_MODEL, messages=[{"role": "user", "content": question}], max_tokens=6,
                                                              temperature=0, stream=True)
                return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

            return list(await asyncio.gather(one("What is 3 + 4?"), one("Name a colour.")))

    answers = asyncio.run(main())
    assert all(answers) and answers[0] != answers[1]


def test_a_client_leaving_mid_stream_pays_exactly_for_what_was_generated(served: TestClient, ledger: LedgerClient) -> None:
    ctx = run(ledger, "run_leaves")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story about a cat."}], "max_tokens": 400, "temperature": 0,
            "stream": True}
    with served.stream("POST", "/internal/chat/completions", json=body, headers=run_headers(ctx, GATEWAY_TOKEN)) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        lines = []
        for line in resp.iter_lines():
            if line.startswith("data: "):
                lines.append(json.loads(line[6:]))
            if len(lines) == 4:
                break
    call_id = lines[0]["id"]
    deadline = time.monotonic() + 60
    while ledger.list_holds(ctx.run_id)[0].status == HoldStatus.open and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [h.status for h in ledger.list_holds(ctx.run_id)] == [HoldStatus.settled]
    with served.app.state.inference.db.session() as s:
        logged = s.scalars(select(CompletionLog).where(CompletionLog.id == call_id)).one()
    assert 3 <= logged.completion_tokens < 400
    assert ledger.get_balance(ctx.run_id).usage_by_kind["decode_tokens"] == logged.completion_tokens


def test_a_refused_stream_is_a_problem_before_any_event(served: TestClient, ledger: LedgerClient) -> None:
    ctx = run(ledger, "run_broke_stream", budget_usd_micros=0)
    resp = served.post("/internal/chat/completions", headers=run_headers(ctx, GATEWAY_TOKEN),
                       json={"model": MODEL, "messages": Q, "max_tokens": 4, "stream": True})
    assert resp.status_code == 402 and resp.headers["content-type"].startswith("application/problem+json")


def test_omitted_max_tokens_runs_to_the_end_of_the_context(client: openai.OpenAI) -> None:
    """No hidden cap: with a benchmark context of prompt + 5 tokens, the answer is cut by the context (5 tokens)."""
    prompt_tokens = plain(client).usage.prompt_tokens
    out = client.with_options(default_headers={**client.default_headers, "X-Crucible-Context-Tokens": str(prompt_tokens + 5)}).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a long story about a cat."}], temperature=0)
    assert out.usage.completion_tokens <= 5


# ---------------------------------------------------------------------------- text completions


def test_echo_with_logprobs_scores_the_prompt(client: openai.OpenAI) -> None:
    prompt = "The capital of France is"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, echo=True, logprobs=1, temperature=0)
    choice = out.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(prompt) and "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert out.usage.completion_tokens == 1 and out.usage.prompt_tokens == len(lp.tokens) - 1
    alone = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    assert alone.choices[0].text == prompt and alone.choices[0].logprobs.token_logprobs == pytest.approx(lp.token_logprobs[:-1], abs=1e-4)


def _token_bytes(token: str) -> bytes:
    """A token as the API shows it, back to its bytes: its text, or ``bytes:\\xNN…`` where it holds part of a character."""
    return bytes.fromhex(token.removeprefix("bytes:").replace("\\x", "")) if token.startswith("bytes:") else token.encode()


@pytest.mark.parametrize("prompt", ["a 日本", "naïve café — 猫が好き 🐱!", "€ 1"])
def test_tokens_that_split_a_character_are_their_own_bytes_and_offsets_index_the_text(client: openai.OpenAI, prompt: str) -> None:
    """``"a 日本"`` once echoed tokens ``["", " �", "�", "�", "本"]``, whose offsets no longer indexed the text. Each
    token is its real bytes (shown ``bytes:\\xNN…`` where they are not whole characters); their bytes make up the
    text, and each offset is the character where the token starts."""
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    lp = out.choices[0].logprobs
    text = out.choices[0].text
    assert text == prompt and "\ufffd" not in "".join(lp.tokens)
    assert b"".join(_token_bytes(t) for t in lp.tokens) == text.encode()
    starts = [len(b"".join(_token_bytes(t) for t in lp.tokens[:i]).decode("utf-8", "ignore")) for i in range(len(lp.tokens))]
    assert lp.text_offset == starts and all(0 <= o < len(text) for o in lp.text_offset)
    assert any(t.startswith("bytes:") for t in lp.tokens) or prompt == "€ 1"


def test_chat_logprob_bytes_are_each_tokens_own_and_make_up_the_answer(client: openai.OpenAI) -> None:
    """An answer held by a JSON schema to ``"日本語"``, whose tokens split its characters: each entry's ``bytes`` are
    its token's, not U+FFFD's, and together they are the answer's."""
    schema = {"type": "json_schema", "json_schema": {"name": "word", "schema": {"type": "string", "enum": ["日本語"]}}}
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say something."}], max_tokens=16,
                                         temperature=0, logprobs=True, top_logprobs=2, response_format=schema)  # type: ignore[arg-type]
    entries = out.choices[0].logprobs.content
    assert bytes(b for e in entries for b in e.bytes) == out.choices[0].message.content.encode()
    assert [e.token for e in entries if e.token.startswith("bytes:")], [e.token for e in entries]  # the answer splits a character
    for e in entries:
        assert _token_bytes(e.token) == bytes(e.bytes) and all(_token_bytes(t.token) == bytes(t.bytes) for t in e.top_logprobs)


def test_a_batch_of_prompts_gives_n_choices_each_in_order(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt=["1, 2, 3,", "a, b, c,"], max_tokens=3, n=2, temperature=0)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.choices[0].text == out.choices[1].text and out.choices[0].text != out.choices[2].text
    tokens = client.completions.create(model=MODEL, prompt=[[16, 28, 30]], max_tokens=2, temperature=0)
    assert tokens.usage.prompt_tokens == 3


def test_a_streamed_text_completion(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=6, temperature=0).choices[0].text
    chunks = list(client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=6, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"suffix": "x"}, "suffix"), ({"best_of": 3}, "best_of"), ({"prompt": ""}, "prompt"), ({"prompt": [[10**9]]}, "prompt"),
    ({"max_tokens": 0}, "max_tokens"), ({"logprobs": 50}, "logprobs"),
])
def test_a_bad_text_completion_is_a_422_naming_the_field(client: openai.OpenAI, kwargs: dict, field: str) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        client.completions.create(**{"model": MODEL, "prompt": "hi", "max_tokens": 2, **kwargs})
    assert exc.value.param == field


# ---------------------------------------------------------------------------- hostile and sloppy requests

BAD_REF = {"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}


@pytest.mark.parametrize(("kwargs", "field"), [
    # schemas: not a JSON schema (the meta-schema), or one the engine cannot decode under (compiled when admitted)
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_REF}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_REF}}, "stream": True}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}],
      "tool_choice": "required"}, "tools.0.function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": BAD_REF}}], "tool_choice": "required"}, "tool_choice"),
    # token ids: digits only, inside the vocabulary
    ({"logit_bias": {"²": 1}}, "logit_bias"), ({"logit_bias": {"٣": 1}}, "logit_bias"), ({"logit_bias": {"49152": 5}}, "logit_bias"),
    # JSON types are not coerced
    ({"max_tokens": "3"}, "max_tokens"), ({"max_tokens": True}, "max_tokens"), ({"stream": "yes"}, "stream"), ({"seed": "42"}, "seed"),
    ({"n": 2.0}, "n"), ({"logprobs": "true"}, "logprobs"),
    # nothing silently ignored
    ({"top_k": 1}, "top_k"), ({"ignore_eos": True}, "ignore_eos"), ({"stop": ""}, "stop"), ({"stop": ["a", ""]}, "stop"),
    ({"max_tokens": 3, "max_completion_tokens": 1}, "max_completion_tokens"), ({"tool_choice": "auto"}, "tool_choice"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    # the field at fault, not a union member's label
    ({"tool_choice": "bogus"}, "tool_choice"), ({"stop": 5}, "stop"), ({"max_tokens": 10**12}, "max_tokens"),
    ({"max_tokens": None, "max_completion_tokens": 10**12}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}]}, "messages.1"),
])
def test_a_bad_chat_request_is_a_422_naming_the_field_the_sdk_shows(client: openai.OpenAI, kwargs: dict, field: str) -> None:
    """Each case a hostile or sloppy client sent: a 422 problem naming the field (``field``, and OpenAI's ``error``
    object's ``param`` and ``message``, which the SDK puts in its exception), never a 500, a coerced value or an ignored field."""
    body = {"model": MODEL, "messages": Q, "max_tokens": 8, "temperature": 0, **kwargs}
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        client.chat.completions.create(model=MODEL, messages=body.pop("messages"), extra_body=body)
    problem, error = exc.value.response.json(), exc.value.body  # the SDK's body is the problem's OpenAI error object
    assert (problem["field"], error["param"], error["type"]) == (field, field, "invalid_request_error"), problem
    assert error["message"] == problem["detail"] and error["message"] in str(exc.value) and exc.value.param == field


def test_a_bad_schema_fails_alone_and_the_next_request_is_served(client: openai.OpenAI) -> None:
    """A schema the engine cannot compile is refused when admitted; requests around it are served as usual."""
    before = text(plain(client))
    with pytest.raises(openai.UnprocessableEntityError):
        create(client, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_REF}})
    assert text(plain(client)) == before


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"echo": True, "stream": True}, "echo"), ({"logit_bias": {"99999999": 5}}, "logit_bias"), ({"max_tokens": "2"}, "max_tokens"),
    ({"logprobs": True}, "logprobs"), ({"top_k": 1}, "top_k"), ({"prompt": ["1", 2]}, "prompt"),
])
def test_a_bad_text_completion_is_refused_not_coerced(client: openai.OpenAI, kwargs: dict, field: str) -> None:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, **kwargs}
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        client.completions.create(model=MODEL, prompt=body.pop("prompt"), extra_body=body)
    assert exc.value.param == field, exc.value.body


def test_streamed_text_offsets_count_from_the_start_of_the_text(client: openai.OpenAI) -> None:
    chunks = [c for c in client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=6, temperature=0, stream=True, logprobs=0)
              if c.choices and c.choices[0].logprobs]
    offsets = [o for c in chunks for o in c.choices[0].logprobs.text_offset]
    tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


def test_health_needs_no_token_and_so_names_no_model(served: TestClient) -> None:
    """Any process on the host reaches ``/healthz``; the evaluator track hides which model a candidate is."""
    health = served.get("/healthz", headers={"Authorization": ""})
    assert health.status_code == 200 and MODEL not in health.text and "smollm" not in health.text.lower()
