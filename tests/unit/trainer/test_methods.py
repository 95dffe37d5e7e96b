"""The trainer's loop and its methods on the real built-in model (SmolLM2-135M, CPU): log-probabilities as the model
computes them, DPO's loss as its paper defines it, LoRA and full weights, exact resume, and tokens billed as counted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainer_service.methods import METHODS
from trainer_service.schemas import parse_row
from trainer_service.training import (
    IGNORE_INDEX,
    TrainConfig,
    collate,
    count_training_tokens,
    load_model,
    select_device,
    token_logprobs,
    tokenize_examples,
    train,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import prepared_models

SFT_ROWS = [parse_row({"prompt": f"What is {a} + {a}?", "completion": str(2 * a)}, 1) for a in range(6)]
DPO_ROWS = [parse_row({"prompt": [{"role": "system", "content": "Answer with the number only."}, {"role": "user", "content": f"What is {a} + {a}?"}]
                       if a % 2 else f"What is {a} + {a}?", "chosen": str(2 * a), "rejected": str(2 * a + 1)}, 1) for a in range(6)]
ROWS = {"sft": SFT_ROWS, "dpo": DPO_ROWS}


@pytest.fixture(scope="module")
def base() -> Path:
    return prepared_models() / "smollm2-135m-instruct"


def config(**fields: object) -> TrainConfig:
    return TrainConfig(**{"max_steps": 4, "batch_size": 2, "warmup_steps": 0, "max_seq_len": 64, "checkpoint_every": 2,
                          "learning_rate": 1e-3, "lr_scheduler_type": "constant", **fields})  # type: ignore[arg-type]


def test_token_logprobs_are_the_models_own_log_softmax_with_or_without_a_shared_prompt_prefix(base: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    for rows in (SFT_ROWS[:3], [SFT_ROWS[0], parse_row({"prompt": "Name a colour.", "completion": "Blue"}, 1)]):  # shared prefix, then none
        input_ids, attention_mask, labels = collate(tokenize_examples(tokenizer, rows, 64), tokenizer.pad_token_id, torch.device("cpu"))
        with torch.no_grad():
            logprobs, row_of = token_logprobs(model, input_ids, attention_mask, labels)
            full = torch.log_softmax(model(input_ids=input_ids, attention_mask=attention_mask).logits.float(), -1)
        target = labels[:, 1:]
        mask = target != IGNORE_INDEX
        expected = full[:, :-1].gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)[mask]
        assert torch.allclose(logprobs, expected, atol=2e-4), (logprobs - expected).abs().max()
        assert row_of.tolist() == mask.nonzero()[:, 0].tolist()


def test_dpo_starts_at_log_2_and_learns_to_prefer_the_chosen_answers(base: Path, tmp_path: Path) -> None:
    """Policy and reference are the same model at step 1, so every pair's margin is 0 and the loss exactly ln 2
    (Rafailov et al. 2023, eq. 7); a few steps on one preference make the implicit reward pick the chosen answer."""
    steps = []
    result = train(base, METHODS["dpo"], DPO_ROWS, config(max_steps=4, batch_size=3, checkpoint_every=100), tmp_path, on_step=steps.append)
    assert math.isclose(steps[0].loss, math.log(2), abs_tol=1e-5) and steps[0].extra["reward_margin"] == pytest.approx(0, abs=1e-5)
    assert steps[-1].loss < math.log(2) and steps[-1].extra["reward_accuracy"] == 1.0 and steps[-1].extra["reward_margin"] > 0
    assert (result.last_checkpoint / "adapter_model.safetensors").exists()


@pytest.mark.parametrize(("method", "adapter"), [pytest.param("sft", "full", marks=pytest.mark.slow), ("dpo", "lora")])
def test_a_job_resumed_from_its_checkpoint_ends_with_the_weights_of_an_uninterrupted_run(base: Path, tmp_path: Path, method: str,
                                                                                       adapter: str) -> None:
    """What a killed worker's job does: the second attempt resumes from the newest checkpoint (weights, AdamW
    moments, schedule, RNG, data position); its tokens plus the first attempt's are exactly the count the hold
    was priced on, and every step's tokens are those ``count_training_tokens`` counted."""
    cfg = config(adapter=adapter, learning_rate=1e-4 if adapter == "full" else 1e-3, max_steps=3, checkpoint_every=100)
    billed: list[int] = []
    straight = train(base, METHODS[method], ROWS[method], cfg, tmp_path / "straight", on_step=lambda m: billed.append(m.tokens))
    stopped_after = []

    def stop_after_one() -> bool:
        return len(stopped_after) >= 1

    first = train(base, METHODS[method], ROWS[method], cfg, tmp_path / "first", on_step=stopped_after.append, should_stop=stop_after_one)
    assert (first.stopped, first.steps_done, first.last_checkpoint.name) == (True, 1, "step-1")
    resumed = train(base, METHODS[method], ROWS[method], cfg, tmp_path / "resumed", resume=first.last_checkpoint)
    assert (resumed.steps_done, resumed.tokens_total) == (3, straight.tokens_total)
    examples = METHODS[method].examples(AutoTokenizer.from_pretrained(base), ROWS[method], cfg.max_seq_len)
    assert sum(billed) == straight.tokens_total == count_training_tokens(METHODS[method], examples, cfg)

    weights = "model.safetensors" if adapter == "full" else "adapter_model.safetensors"
    a, b = load_file(straight.last_checkpoint / weights), load_file(resumed.last_checkpoint / weights)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert any(not torch.equal(a[k], load_file(first.last_checkpoint / weights)[k]) for k in a)  # steps 2-3 did train


def test_full_fine_tuning_from_a_lora_parent_starts_from_the_adapter_merged_into_the_base(base: Path, tmp_path: Path) -> None:
    parent = train(base, METHODS["sft"], SFT_ROWS, config(max_steps=2), tmp_path / "lora").last_checkpoint
    device = select_device(TrainConfig())
    lora = load_model(base, TrainConfig(), device, init_adapter=parent).eval()
    full = load_model(base, TrainConfig(adapter="full"), device, init_adapter=parent).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        merged, served = full(input_ids=ids).logits, lora(input_ids=ids).logits
        plain = load_model(base, TrainConfig(adapter="full"), device).eval()(input_ids=ids).logits
        assert (merged - served).abs().max() < 1e-2 < (merged - plain).abs().max()  # float32 rounding of the merge vs training
    assert not hasattr(full, "peft_config") and all(p.requires_grad for p in full.parameters())  # a plain model, every weight trained
