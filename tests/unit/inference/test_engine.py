"""The transformers engine on the real base model: batching, adapters, micro-batching (no HTTP)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from inference_service.engine import GenerationRequest, MicroBatcher, TransformersEngine

from tests.conftest import prepared_models

QUESTIONS = ["What is 3 + 4?", "What is 10 - 7?", "Name a colour.", "What is 12 + 30?"]


@pytest.fixture(scope="module")
def engine() -> TransformersEngine:
    return TransformersEngine(prepared_models() / "smollm2-135m-instruct", max_batch_size=4)


def _req(q: str, **kw: object) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": q}], max_tokens=kw.pop("max_tokens", 12), **kw)  # type: ignore[arg-type]


def test_batched_greedy_equals_one_at_a_time(engine: TransformersEngine) -> None:
    batched = engine.generate([_req(q) for q in QUESTIONS])
    single = [engine.generate([_req(q)])[0] for q in QUESTIONS]
    assert [r.text for r in batched] == [r.text for r in single]
    assert all(r.prompt_tokens == engine.count_prompt_tokens([{"role": "user", "content": q}]) for r, q in zip(batched, QUESTIONS, strict=True))


def test_max_tokens_and_stop_strings(engine: TransformersEngine) -> None:
    r = engine.generate([_req("Write a long story about a cat.", max_tokens=5)])[0]
    assert r.completion_tokens == 5 and r.finish_reason == "length"
    full = engine.generate([_req("Write a long story about a cat.", max_tokens=20)])[0].text
    cut_at = full.split()[1]
    stopped = engine.generate([_req("Write a long story about a cat.", max_tokens=20, stop=[cut_at])])[0]
    assert stopped.finish_reason == "stop" and cut_at not in stopped.text


def test_adapter_changes_output_and_base_is_unchanged_after(engine: TransformersEngine, tmp_path: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base_dir = prepared_models() / "smollm2-135m-instruct"
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir), LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    model.save_pretrained(tmp_path / "adapter")
    before = [r.text for r in engine.generate([_req(q) for q in QUESTIONS])]
    adapted = [r.text for r in engine.generate([_req(q) for q in QUESTIONS], tmp_path / "adapter", "ckpt_test")]
    after = [r.text for r in engine.generate([_req(q) for q in QUESTIONS])]
    assert adapted != before
    assert after == before


def test_micro_batcher_serves_concurrent_requests(engine: TransformersEngine) -> None:
    expected = [r.text for r in engine.generate([_req(q) for q in QUESTIONS])]

    async def main() -> list[str]:
        batcher = MicroBatcher(engine, max_wait_ms=50)
        results = await asyncio.gather(*[batcher.submit(_req(q), None, None) for q in QUESTIONS])
        return [r.text for r in results]

    assert asyncio.run(main()) == expected


def test_prompt_tokens_from_a_prefix_cache_are_metered_as_their_own_kind() -> None:
    from inference_service.service import usage_items

    assert [u.model_dump(mode="json") for u in usage_items("m", 100, 7)] == [
        {"kind": "prefill_tokens", "quantity": 100, "model": "m"}, {"kind": "decode_tokens", "quantity": 7, "model": "m"}]
    assert [(u.kind, u.quantity) for u in usage_items("m", 100, 7, cached_prompt_tokens=60)] == [
        ("prefill_tokens", 40), ("cached_prefill_tokens", 60), ("decode_tokens", 7)]
