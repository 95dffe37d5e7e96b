"""Full-weight checkpoints (``Adapter(kind="full")``): served by the transformers engine as models of their own, on the
test-only model ``tiny-smollm2`` (what is checked is which weights answer, not what they say; no HTTP for the engine
tests), through the service with a stub trainer, and refused (422 on ``model``) by
an engine without :attr:`~inference_service.engines.base.Feature.full_weights`.

The checkpoints are written as the trainer writes a full one: transformers' ``save_pretrained`` (safetensors, one of
them sharded with its index), a ``training_state.pt`` beside, no tokenizer. ``same`` holds the base model's own
weights, so it must answer exactly as the base does, for every feature; ``mid`` and ``late`` have one MLP layer scaled
(20 and 50 times: the random-weight model's greedy answer is a run of newlines until a layer dominates it), so each answers differently from the base and from each other, and as transformers' own forward pass on those weights
says (each generated token the most likely, its log-probability the model's).

Log-probabilities are compared to 1e-4: two float32 copies of the same weights may round a decode step's last digits
differently (CPU matrix kernels depend on the memory layout), which never changes a greedy token here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from inference_service.engines.base import Adapter, Feature, GenerationRequest, GenerationResult
from inference_service.engines.transformers import TransformersEngine
from inference_service.engines.upstream import UpstreamEngine
from inference_service.metering import Metering
from inference_service.service import Inference
from inference_service.settings import InferenceSettings
from pydantic import BaseModel
from trainer_service.client import TrainerClient
from transformers import AutoModelForCausalLM

from services.common.auth import RunContext
from services.common.errors import Unprocessable, UpstreamProblem
from services.common.http import ServiceClient
from services.common.ids import new_id
from services.common.openai_protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from services.ledger.client import LedgerClient
from tests.conftest import prepared_models
from tests.unit.inference.conftest import INFERENCE_TOKEN, MODEL, run

MODEL_DIR = prepared_models(MODEL) / MODEL
QUESTIONS = ["What is 3 + 4?", "Name a colour."]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}}, "required": ["name", "age"],
          "additionalProperties": False}
# checkpoint name -> (layer whose MLP output projection is scaled, factor); None: the base's own weights
VARIANTS: dict[str, tuple[int, float] | None] = {"same": None, "mid": (1, 20.0), "late": (3, 50.0)}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Adapter]:
    """The full checkpoints, as the engine is given them (name -> adapter)."""
    root = tmp_path_factory.mktemp("full-checkpoints")
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    out: dict[str, Adapter] = {}
    for name, change in VARIANTS.items():
        folder = root / f"ckpt_{name}"
        with torch.no_grad():
            weight = model.model.layers[change[0]].mlp.down_proj.weight if change else None
            original = weight.clone() if weight is not None else None
            if change and weight is not None:
                weight.mul_(change[1])
            model.save_pretrained(folder, safe_serialization=True, **({"max_shard_size": "5MB"} if name == "same" else {}))
            if original is not None and weight is not None:
                weight.copy_(original)
        torch.save({"optimizer": {}, "step": 3}, folder / "training_state.pt")  # the trainer's, never read by inference
        assert not any(p.name.startswith("tokenizer") for p in folder.iterdir())
        out[name] = Adapter(f"ckpt_{name}", folder, kind="full")
    assert (root / "ckpt_same" / "model.safetensors.index.json").exists()
    return out


@pytest.fixture(scope="module")
def engine() -> Iterator[TransformersEngine]:
    engine = TransformersEngine(MODEL_DIR, max_batch_size=8, max_loaded_full_checkpoints=2)
    yield engine
    asyncio.run(engine.aclose())


def chat(q: str, **kw: Any) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": q}], **{"max_tokens": 8, "temperature": 0, **kw})


def generate(engine: TransformersEngine, *requests: GenerationRequest, adapter: Adapter | None = None) -> list[GenerationResult]:
    """Submit ``requests`` at once (one batch) and wait for their results."""
    async def main() -> list[GenerationResult]:
        generations = await asyncio.gather(*(engine.submit(r, adapter) for r in requests))
        return list(await asyncio.gather(*(g.result() for g in generations)))
    return asyncio.run(main())


def texts(results: list[GenerationResult]) -> list[str]:
    return [r.choices[0].text for r in results]


def close(a: Any, b: Any, path: str = "") -> None:
    """``a == b`` with floats (log-probabilities) to 1e-4; fails naming where they differ."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            close(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, BaseModel):
        close(a.model_dump(), b.model_dump(), path)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: {a!r} != {b!r}"
        for k in a:
            close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, abs=1e-4), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def assert_answers_of(model: Any, engine: TransformersEngine, request: GenerationRequest, result: GenerationResult) -> None:
    """``result`` (greedy, with ``logprobs``) is what ``model`` answers: each generated token the most likely after the
    prompt and the tokens before it, with its log-probability (one forward pass of transformers)."""
    choice = result.choices[0]
    assert choice.logprobs is not None
    prompt = engine.prompt_ids(request)
    generated = engine.tokenizer(choice.text, add_special_tokens=False)["input_ids"]
    assert [engine.logprobs.text(t)[0] for t in generated] == [e.token for e in choice.logprobs]
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([prompt + generated])).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
    assert logprobs.argmax(dim=-1).tolist() == generated
    assert [e.logprob for e in choice.logprobs] == pytest.approx([float(logprobs[k, t]) for k, t in enumerate(generated)], abs=1e-4)


# ---------------------------------------------------------------------- the engine


def test_the_base_saved_as_a_full_checkpoint_answers_as_the_base_for_every_feature(engine: TransformersEngine,
                                                                                   checkpoints: dict[str, Adapter]) -> None:
    requests = [  # one batch of every per-row option, a seeded group of n choices, a stream
        *[chat(q, logprobs=3) for q in QUESTIONS],
        GenerationRequest(prompt="The capital of France is", max_tokens=3, temperature=0, prompt_logprobs=2, logprobs=1),
        chat("Describe a person.", json_schema=SCHEMA),
        chat("Repeat the word cat ten times.", frequency_penalty=1.0, presence_penalty=1.0),
        chat("Name a colour.", max_tokens=4, logit_bias={42: 5.0, 17: -100.0}),
        chat("Write a long story about a cat.", stop=["."]),
        chat("Tell me a story.", n=3, temperature=0.9, top_p=0.9, seed=7, max_tokens=6),
        chat("Write a long story about a cat.", max_tokens=6, stream=True, logprobs=0),
    ]

    async def answers(adapter: Adapter | None) -> tuple[list[GenerationResult], list[Any]]:
        generations = [await engine.submit(r, adapter) for r in requests]
        deltas = [d async for d in generations[-1].deltas()]
        return [await g.result() for g in generations], deltas

    full, full_deltas = asyncio.run(answers(checkpoints["same"]))
    base, base_deltas = asyncio.run(answers(None))
    close(full, base)
    close(full_deltas, base_deltas)
    assert len(full_deltas) > 3 and "".join(d.text for d in full_deltas) == full[-1].choices[0].text


def test_a_full_checkpoint_with_other_weights_answers_as_its_own_model_and_the_base_is_unaffected(
        engine: TransformersEngine, checkpoints: dict[str, Adapter], monkeypatch: pytest.MonkeyPatch) -> None:
    late = checkpoints["late"]
    requests = [chat(q, logprobs=2) for q in QUESTIONS]
    base_before = generate(engine, *requests)
    answered = generate(engine, *requests, adapter=late)
    assert all(a != b for a, b in zip(texts(answered), texts(base_before), strict=True))
    own = AutoModelForCausalLM.from_pretrained(late.path, dtype=torch.float32).eval()
    for request, result in zip(requests, answered, strict=True):
        assert_answers_of(own, engine, request, result)

    # base and checkpoint requests arriving together: one batch window, one generate call per model, each its own answer
    models_per_call: list[set[str | None]] = []
    generate_group = engine._generate

    def recording(group: list[Any]) -> None:
        models_per_call.append({p.adapter.name if p.adapter else None for p in group})
        generate_group(group)

    monkeypatch.setattr(engine, "_generate", recording)

    async def together() -> list[GenerationResult]:
        submitted = []
        for request in requests:  # interleaved: base, checkpoint, base, checkpoint …
            submitted += [await engine.submit(request), await engine.submit(request, late)]
        return list(await asyncio.gather(*(g.result() for g in submitted)))

    mixed = asyncio.run(together())
    assert len(models_per_call) == 2 and {frozenset(m) for m in models_per_call} == {frozenset({None}), frozenset({"ckpt_late"})}
    close(mixed[0::2], base_before)  # the base, after serving the checkpoint and next to it, unchanged
    close(mixed[1::2], answered)


def test_a_cancelled_generation_on_a_full_checkpoint_stops(engine: TransformersEngine, checkpoints: dict[str, Adapter]) -> None:
    async def main() -> GenerationResult:
        generation = await engine.submit(chat("Write a long story about a cat.", max_tokens=200, stream=True), checkpoints["mid"])
        seen = 0
        async for _ in generation.deltas():
            seen += 1
            if seen == 3:
                generation.cancel()
        return await generation.result()

    choice = asyncio.run(main()).choices[0]
    assert 3 <= choice.completion_tokens < 200 and choice.finish_reason == "stop"


def test_at_most_max_loaded_full_checkpoints_stay_loaded_and_an_unloaded_one_is_freed_and_reloaded(
        engine: TransformersEngine, checkpoints: dict[str, Adapter]) -> None:
    assert engine.models.max_loaded_full_checkpoints == 2
    requests = [chat("Name a colour.", max_tokens=6)]
    answers: dict[str, list[str]] = {"base": texts(generate(engine, *requests))}
    refs: dict[str, weakref.ref[Any]] = {}
    for name in ("same", "mid", "late"):
        answers[name] = texts(generate(engine, *requests, adapter=checkpoints[name]))
        refs[name] = weakref.ref(engine.models.full[f"ckpt_{name}"])
        assert len(engine.models.full) <= 2
    assert list(engine.models.full) == ["ckpt_mid", "ckpt_late"]
    gc.collect()
    assert refs["same"]() is None  # unloaded: nothing holds the evicted model any more
    assert answers["same"] == answers["base"] and len({tuple(answers[n]) for n in ("base", "mid", "late")}) == 3
    assert texts(generate(engine, *requests, adapter=checkpoints["same"])) == answers["same"]  # loaded again
    assert list(engine.models.full) == ["ckpt_late", "ckpt_same"] and refs["mid"]() is None
    assert texts(generate(engine, *requests, adapter=checkpoints["late"])) == answers["late"]  # the most recently used now
    assert texts(generate(engine, *requests, adapter=checkpoints["mid"])) == answers["mid"]  # evicts "same", the least recent
    assert list(engine.models.full) == ["ckpt_late", "ckpt_mid"]


def test_a_full_checkpoint_of_another_model_fails_its_requests_alone(engine: TransformersEngine, tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    small = LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1))
    small.save_pretrained(tmp_path / "other", safe_serialization=True)
    loaded = list(engine.models.full)
    expected = texts(generate(engine, chat(QUESTIONS[0])))

    async def main() -> tuple[BaseException | GenerationResult, ...]:
        other = await engine.submit(chat(QUESTIONS[0]), Adapter("ckpt_other", tmp_path / "other", kind="full"))
        base = await engine.submit(chat(QUESTIONS[0]))
        return tuple(await asyncio.gather(other.result(), base.result(), return_exceptions=True))

    other, base = asyncio.run(main())
    assert isinstance(other, ValueError) and "not a full checkpoint of this base model" in str(other)
    assert isinstance(base, GenerationResult) and texts([base]) == expected
    assert list(engine.models.full) == loaded  # nothing loaded, nothing evicted for it


# ---------------------------------------------------------------------- the service


def stub_trainer(records: dict[str, tuple[Path, str]]) -> TrainerClient:
    """The trainer's checkpoint look-up, knowing ``records`` (checkpoint id -> its folder and kind)."""
    def answer(request: httpx.Request) -> httpx.Response:
        ckpt = request.url.path.rsplit("/", 1)[-1]
        if ckpt in records:
            folder, kind = records[ckpt]
            return httpx.Response(200, json={"id": ckpt, "run_id": "run_full", "base_model": MODEL, "uri": folder.as_uri(), "kind": kind, "step": 3})
        return httpx.Response(404, json={"status": 404, "title": "Not found", "code": "not_found", "detail": "unknown checkpoint"})

    client = ServiceClient("http://trainer", INFERENCE_TOKEN, name="trainer")
    client.client = httpx.Client(base_url="http://trainer", transport=httpx.MockTransport(answer))
    return TrainerClient(client)


def test_the_service_serves_a_full_checkpoint_by_its_records_kind(served: Any, inference: Any, ledger: LedgerClient, engine: TransformersEngine,
                                                                  checkpoints: dict[str, Adapter]) -> None:
    service: Inference = served.app.state.inference
    ids = {name: new_id("ckpt") for name in ("same", "late")}
    trainer, service.trainer = service.trainer, stub_trainer({ids[n]: (checkpoints[n].path, "full") for n in ids})
    try:
        ctx = run(ledger, "run_full_checkpoints")
        resolved = service.resolve_model(ctx, ids["late"])
        assert resolved.base == MODEL and resolved.adapter == Adapter(ids["late"], checkpoints["late"].path, kind="full")
        assert inference.get_model(ctx, ids["late"]).adapter == ids["late"]

        def ask(model: str, q: str) -> Any:
            return inference.chat_completions(ctx, ChatCompletionRequest(model=model, messages=[ChatMessage(role="user", content=q)], max_tokens=8,
                                                                         temperature=0, logprobs=True, top_logprobs=2))

        for q in QUESTIONS[1:]:
            base, same, late = ask(MODEL, q), ask(ids["same"], q), ask(ids["late"], q)
            assert same.model == ids["same"] and late.model == ids["late"]
            assert same.choices[0].message == base.choices[0].message
            close(same.choices[0].logprobs, base.choices[0].logprobs)
            assert late.choices[0].message.content == texts(generate(engine, chat(q), adapter=checkpoints["late"]))[0] != base.choices[0].message.content
            assert late.usage.prompt_tokens == base.usage.prompt_tokens  # the base's tokenizer and chat template
        text = inference.completions(ctx, CompletionRequest(model=ids["same"], prompt="The capital of France is", max_tokens=3, temperature=0,
                                                            echo=True, logprobs=1))
        base_text = inference.completions(ctx, CompletionRequest(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0,
                                                                 echo=True, logprobs=1))
        assert text.choices[0].text == base_text.choices[0].text
        close(text.choices[0].logprobs, base_text.choices[0].logprobs)
        assert ledger.get_balance(ctx.run_id).usage_by_kind["decode_tokens"] > 0  # metered on the base model's prices, as a LoRA checkpoint
    finally:
        service.trainer.close()
        service.trainer = trainer


class _NoFullWeights:
    """An engine as the service sees one, with the upstream engine's features (those of vLLM's too): no full weights."""

    features = UpstreamEngine.features
    context_tokens = 8192

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        raise _Admitted


class _Admitted(Exception):
    """Raised once the service got past its feature checks."""


@pytest.mark.parametrize("engine_name", ["upstream", "vllm"])
def test_an_engine_without_full_weights_refuses_a_full_checkpoint_with_a_422_on_model(tmp_path: Path, engine_name: str) -> None:
    assert Feature.full_weights not in UpstreamEngine.features and Feature.full_weights in TransformersEngine.features
    full, lora = new_id("ckpt"), new_id("ckpt")
    settings = InferenceSettings(data_dir=tmp_path, service_token="t", engine=engine_name)
    service = Inference(settings=settings, db=None, ledger=None, trainer=stub_trainer({full: (tmp_path / "full", "full"), lora: (tmp_path / "lora", "lora")}),  # type: ignore[arg-type]
                        engines={MODEL: _NoFullWeights()})  # type: ignore[dict-item]
    ctx = RunContext(run_id="run_full", task_id="bench_t")

    def ask(model: str) -> None:
        request = ChatCompletionRequest(model=model, messages=[ChatMessage(role="user", content="hi")], max_tokens=2)
        asyncio.run(service.chat_completion(ctx, request, Metering(metered=False)))

    with pytest.raises(Unprocessable) as refused:
        ask(full)
    assert refused.value.status == 422 and refused.value.extra["field"] == "model"
    assert full in refused.value.detail and engine_name in refused.value.detail and "transformers engine" in refused.value.detail
    with pytest.raises(_Admitted):  # a LoRA checkpoint (and the base) pass the check on the same engine
        ask(lora)
    with pytest.raises(_Admitted):
        ask(MODEL)
    with pytest.raises(Unprocessable) as unknown:
        ask(new_id("ckpt"))
    assert unknown.value.extra["field"] == "model" and isinstance(unknown.value.__cause__, UpstreamProblem)
    service.trainer.close()
