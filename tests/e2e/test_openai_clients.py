"""End to end with unmodified OpenAI clients: the ``openai`` SDK (sync and async), a client that walks away in the
middle of a stream, and lm-evaluation-harness's OpenAI-compatible models, all through the gateway under a run key.

Each test gets a fresh run, so the run's budget shows exactly that test's calls: what a client is told it used
(``usage``) is what the ledger charged. lm-eval runs in a child process with the hub switched off (any download
fails loudly) on the two local tasks in ``tests/e2e/lm_eval_task/``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
import sqlalchemy as sa

from crucible.sdk import CrucibleClient
from tests.conftest import MODEL_CACHE, ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # in `make test-slow`: lm-evaluation-harness runs whole tasks

MODEL = "smollm2-135m-instruct"
TASKS = Path(__file__).resolve().parent / "lm_eval_task"
CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture()
def run(new_run) -> Iterator[tuple[dict, CrucibleClient]]:  # noqa: ANN001
    """A fresh run of the test benchmark and its native client (for ``/v1/budget``)."""
    record, client = new_run("openai-clients")
    yield record, client
    client.close()


@pytest.fixture()
def sdk(stack, run) -> Iterator[openai.OpenAI]:  # noqa: ANN001
    """The unmodified openai SDK pointed at the gateway with the run's key (no retries: every call is charged)."""
    with openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=run[0]["api_key"], max_retries=0, timeout=300) as client:
        yield client


def _usage(client: CrucibleClient) -> dict[str, int]:
    """Tokens the run was charged, by kind; asserts nothing is still held."""
    budget = client.budget()
    assert budget["held_usd_micros"] == 0, budget
    return budget["usage_by_kind"]


# ---------------------------------------------------------------------- openai SDK, sync


def test_sdk_chat_completion_is_an_openai_answer_charged_as_reported(sdk: openai.OpenAI, run) -> None:  # noqa: ANN001
    answer = sdk.chat.completions.create(model=MODEL, messages=CAPITAL, max_tokens=8, temperature=0)
    assert answer.object == "chat.completion" and answer.model == MODEL and answer.id
    (choice,) = answer.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
    usage = answer.usage
    assert 0 < usage.completion_tokens <= 8 and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    charged = _usage(run[1])
    assert (charged["prefill_tokens"] + charged["cached_prefill_tokens"], charged["decode_tokens"]) == (usage.prompt_tokens, usage.completion_tokens)


def test_streamed_chat_joins_to_the_greedy_answer_and_ends_with_a_usage_chunk(sdk: openai.OpenAI) -> None:
    greedy = sdk.chat.completions.create(model=MODEL, messages=CAPITAL, max_tokens=12, temperature=0)
    chunks = list(sdk.chat.completions.create(model=MODEL, messages=CAPITAL, max_tokens=12, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    assert len(chunks) >= 3
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == greedy.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [greedy.choices[0].finish_reason]
    *body, last = chunks
    assert all(c.usage is None for c in body)
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (greedy.usage.prompt_tokens, greedy.usage.completion_tokens)


def test_n_2_returns_two_choices_and_charges_both(sdk: openai.OpenAI, run) -> None:  # noqa: ANN001
    answer = sdk.chat.completions.create(model=MODEL, messages=CAPITAL, max_tokens=6, temperature=1.0, seed=3, n=2)
    assert sorted(c.index for c in answer.choices) == [0, 1]
    assert all(isinstance(c.message.content, str) and c.finish_reason in ("stop", "length") for c in answer.choices)
    assert 2 <= answer.usage.completion_tokens <= 12
    assert _usage(run[1])["decode_tokens"] == answer.usage.completion_tokens


def test_logprobs_give_each_token_and_its_two_likeliest_alternatives(sdk: openai.OpenAI) -> None:
    answer = sdk.chat.completions.create(model=MODEL, messages=CAPITAL, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    (choice,) = answer.choices
    entries = choice.logprobs.content
    # every generated token but the end of turn (it has no text, as in OpenAI's answers; it is still a completion token)
    assert len(entries) == answer.usage.completion_tokens - (choice.finish_reason == "stop")
    assert "".join(e.token for e in entries) == choice.message.content
    for entry in entries:
        assert entry.logprob <= 0.0 and math.isfinite(entry.logprob)
        first, second = entry.top_logprobs  # exactly two alternatives
        assert first.logprob >= second.logprob
        assert (entry.token, entry.logprob) == (first.token, pytest.approx(first.logprob, abs=1e-5))  # greedy: the likeliest token


def test_named_tool_choice_returns_a_call_whose_arguments_follow_the_schema(sdk: openai.OpenAI) -> None:
    parameters = {"type": "object", "additionalProperties": False, "required": ["city", "unit"], "properties": {
        "city": {"type": "string", "maxLength": 20}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": parameters}}
    answer = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=[tool],
                                         tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=48, temperature=0)
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), parameters)


def test_json_schema_response_format_answer_validates(sdk: openai.OpenAI) -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["answer", "confident"],
              "properties": {"answer": {"type": "integer"}, "confident": {"type": "boolean"}}}
    answer = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 12 + 30? Reply in JSON."}], max_tokens=48, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "sum", "schema": schema, "strict": True}})
    (choice,) = answer.choices
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), schema)


# ---------------------------------------------------------------------- openai SDK, async


def test_async_client_streams_two_answers_at_once(stack, run) -> None:  # noqa: ANN001
    questions = ["What is the capital of France?", "What is the capital of Japan?"]

    async def main() -> tuple[list[str], list[str]]:
        async with openai.AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key=run[0]["api_key"], max_retries=0, timeout=300) as client:
            async def greedy(question: str) -> str:
                answer = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=10, temperature=0)
                return answer.choices[0].message.content

            async def streamed(question: str) -> str:
                stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=10,
                                                              temperature=0, stream=True)
                return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

            expected = [await greedy(q) for q in questions]
            return expected, list(await asyncio.gather(*(streamed(q) for q in questions)))

    expected, got = asyncio.run(main())
    assert got == expected and "Paris" in expected[0] and "Tokyo" in expected[1]
    assert _usage(run[1])["decode_tokens"] > 0


# ---------------------------------------------------------------------- a client that goes away mid-stream


def _completion_log(stack, run_id: str) -> list[tuple[int, int]]:  # noqa: ANN001
    """``(prompt_tokens, completion_tokens)`` of each completion inference logged for the run (read as an auditor)."""
    url = stack.database_urls.get("inference") or f"sqlite:///{(stack.data_dir / 'inference.sqlite').resolve()}"
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT prompt_tokens, completion_tokens FROM completion_log WHERE run_id = :r"), {"r": run_id})
            return [tuple(r) for r in rows]
    finally:
        engine.dispose()


def test_client_that_disconnects_mid_stream_pays_for_the_tokens_generated(stack, run) -> None:  # noqa: ANN001
    from transformers import AutoTokenizer

    record, client = run
    eos = AutoTokenizer.from_pretrained(MODEL_CACHE / MODEL).eos_token_id
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_tokens": 300,
            "temperature": 0, "stream": True, "logit_bias": {str(eos): -100}}  # no end of answer: only the disconnect stops it
    content_events = 0
    headers = {"Authorization": f"Bearer {record['api_key']}"}
    with httpx.Client(base_url=stack.gateway_url, headers=headers, timeout=300) as http, http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: ") and any(c["delta"].get("content") for c in json.loads(line.removeprefix("data: "))["choices"]):
                content_events += 1
                if content_events == 3:
                    break  # leaving the block closes the connection
    assert content_events == 3

    deadline = time.monotonic() + 120
    while (budget := client.budget())["held_usd_micros"] or not (logged := _completion_log(stack, record["id"])):
        assert time.monotonic() < deadline, f"the call is still held or not logged: {budget}"
        time.sleep(0.25)
    ((prompt_tokens, completion_tokens),) = logged
    assert 3 <= completion_tokens < 300
    charged = budget["usage_by_kind"]
    assert (charged["prefill_tokens"] + charged["cached_prefill_tokens"], charged["decode_tokens"]) == (prompt_tokens, completion_tokens)


# ---------------------------------------------------------------------- lm-evaluation-harness

LM_EVAL = """
import json, sys
import lm_eval
from lm_eval.tasks import TaskManager

spec = json.loads(sys.argv[1])
out = lm_eval.simple_evaluate(model=spec["model"], model_args=spec["model_args"], tasks=[spec["task"]], apply_chat_template=spec["chat"],
                              task_manager=TaskManager(include_path=spec["include_path"], include_defaults=False),
                              log_samples=True, bootstrap_iters=0)
samples = [{k: s[k] for k in ("arguments", "resps", "filtered_resps", "target")} for s in out["samples"][spec["task"]]]
with open(spec["out"], "w") as f:
    json.dump({"version": lm_eval.__version__, "results": out["results"][spec["task"]], "samples": samples}, f, default=str)
"""


def _lm_eval(tmp_path: Path, key: str, task: str, model: str, model_args: dict, *, chat: bool) -> dict:
    """Run ``lm_eval.simple_evaluate`` in a child process, offline, with the run key as ``OPENAI_API_KEY`` (what lm-eval's
    local OpenAI-compatible models send as the Bearer token); its results and logged samples."""
    out = tmp_path / f"{task}.json"
    spec = {"model": model, "model_args": model_args, "task": task, "chat": chat, "include_path": str(TASKS), "out": str(out)}
    env = {**os.environ, "OPENAI_API_KEY": key, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    # the task files name their data relative to the repository root
    proc = subprocess.run([sys.executable, "-c", LM_EVAL, json.dumps(spec)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(out.read_text())


def test_lm_eval_local_completions_scores_a_loglikelihood_task(stack, run, sdk: openai.OpenAI, tmp_path: Path) -> None:  # noqa: ANN001
    record, client = run
    # a local tokenizer counts the context's tokens (no download); prompts go as text (tokenized_requests false),
    # batched 8 to a request; one attempt per request, so the charge below is exact
    args = {"model": MODEL, "base_url": f"{stack.gateway_url}/v1/completions", "tokenizer_backend": "huggingface",
            "tokenizer": str(MODEL_CACHE / MODEL), "tokenized_requests": False, "batch_size": 8, "max_retries": 1}
    report = _lm_eval(tmp_path, record["api_key"], "crucible_capitals", "local-completions", args, chat=False)
    assert report["version"].startswith("0.4.")
    assert report["results"]["sample_len"] == 10 and 0.0 <= report["results"]["acc,none"] <= 1.0
    assert len(report["samples"]) == 10
    assert all(len(s["resps"]) == 4 and all(math.isfinite(r[0][0]) and r[0][0] < 0 for r in s["resps"]) for s in report["samples"])
    charged = _usage(client)
    assert charged["decode_tokens"] == 40 and charged["prefill_tokens"] + charged["cached_prefill_tokens"] > 40  # 10 questions × 4 choices, max_tokens 1

    # lm-eval's log-likelihood of a choice is the sum of its tokens' log-probabilities as the gateway reports them
    (context, continuation), (loglikelihood, _) = report["samples"][0]["arguments"][0], report["samples"][0]["resps"][0][0]
    scored = sdk.completions.create(model=MODEL, prompt=context + continuation, max_tokens=0, echo=True, logprobs=0, temperature=0)
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text == context + continuation
    expected = sum(p for p, at in zip(lp.token_logprobs, lp.text_offset, strict=True) if at >= len(context))
    assert loglikelihood == pytest.approx(expected, abs=1e-3)


def test_lm_eval_local_chat_completions_scores_a_generation_task(stack, run, tmp_path: Path) -> None:  # noqa: ANN001
    record, client = run
    args = {"model": MODEL, "base_url": f"{stack.gateway_url}/v1/chat/completions", "num_concurrent": 2, "max_retries": 1}
    report = _lm_eval(tmp_path, record["api_key"], "crucible_arithmetic", "local-chat-completions", args, chat=True)
    assert report["results"]["sample_len"] == 10 and 0.0 <= report["results"]["exact_match,last_number"] <= 1.0
    answers = [s["resps"][0][0] for s in report["samples"]]
    assert len(answers) == 10 and all(isinstance(a, str) and a.strip() for a in answers)
    assert not any("\n" in a for a in answers)  # the task's stop string (until: ["\n"]) was honoured
    charged = _usage(client)
    assert 10 <= charged["decode_tokens"] <= 10 * 8 and charged["prefill_tokens"] + charged["cached_prefill_tokens"] > 0  # max_gen_toks 8
