"""The trainer's loop and its methods, on the test-only model ``tiny-smollm2`` (SmolLM2's architecture and tokenizer,
random weights; :mod:`tests.models`): log-probabilities as the model computes them, DPO's loss as its paper defines it,
GRPO's policy gradient, LoRA and full weights, exact resume, and tokens billed as counted. What is checked is the
arithmetic of the loop, which holds for any weights; what training teaches the real model is the end-to-end tests'."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from trainer_service.config import TrainConfig
from trainer_service.data_order import count_tokens
from trainer_service.devices import select_device
from trainer_service.examples import IGNORE_INDEX, Example, collate, tokenize_examples
from trainer_service.logprobs import token_logprobs
from trainer_service.methods import METHODS
from trainer_service.methods.grpo import GRPO
from trainer_service.metrics import TokenCounts
from trainer_service.policy import load_model
from trainer_service.schemas import parse_row
from trainer_service.training import train
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import prepared_models
from tests.models import TINY_MODEL

SFT_ROWS = [parse_row({"prompt": f"What is {a} + {a}?", "completion": str(2 * a)}, 1) for a in range(6)]
DPO_ROWS = [parse_row({"prompt": [{"role": "system", "content": "Answer with the number only."}, {"role": "user", "content": f"What is {a} + {a}?"}]
                       if a % 2 else f"What is {a} + {a}?", "chosen": str(2 * a), "rejected": str(2 * a + 1)}, 1) for a in range(6)]
GRPO_ROWS = [parse_row({"prompt": f"Count from {a} to {a + 3}.", "item_id": f"item-{a}"}, 1) for a in range(4)]
ROWS = {"sft": SFT_ROWS, "dpo": DPO_ROWS, "grpo": GRPO_ROWS}


class EvenFirstToken:
    """A reward that keeps what it scored: 1 for a completion whose first token id is even. A random model samples
    about as many of each, so a group of a few completions almost always holds both rewards (a signal to learn from)."""

    def __init__(self) -> None:
        self.scored: list[tuple[str, list[int], float]] = []

    def __call__(self, examples: list[Any], completions: list[list[int]]) -> list[float]:
        rewards = [float(bool(c) and c[0] % 2 == 0) for c in completions]
        self.scored += [(e.item_id, c, r) for e, c, r in zip(examples, completions, rewards, strict=True)]
        return rewards


def method(name: str) -> object:
    """``METHODS[name]``; GRPO with an :class:`EvenFirstToken` reward (the grader's part is tested with the services)."""
    return GRPO(EvenFirstToken()) if name == "grpo" else METHODS[name]


@pytest.fixture(scope="module")
def base() -> Path:
    return prepared_models(TINY_MODEL) / TINY_MODEL


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
    result = train(base, METHODS["dpo"], DPO_ROWS, config(max_steps=8, batch_size=3, learning_rate=1e-2, checkpoint_every=100), tmp_path, on_step=steps.append)
    assert math.isclose(steps[0].loss, math.log(2), abs_tol=1e-5) and steps[0].extra["reward_margin"] == pytest.approx(0, abs=1e-5)
    assert steps[-1].loss < math.log(2) and steps[-1].extra["reward_accuracy"] == 1.0 and steps[-1].extra["reward_margin"] > 0
    assert (result.last_checkpoint / "adapter_model.safetensors").exists()


@pytest.mark.parametrize(("name", "adapter"), [("sft", "full"), ("dpo", "lora"), ("grpo", "lora")])
def test_a_job_resumed_from_its_checkpoint_ends_with_the_weights_of_an_uninterrupted_run(base: Path, tmp_path: Path, name: str,
                                                                                       adapter: str) -> None:
    """What a killed worker's job does: the second attempt resumes from the newest checkpoint (weights, AdamW
    moments, schedule, RNG, data position; for GRPO the sampling RNG too, so it draws the same rollouts); its tokens
    plus the first attempt's are those of the uninterrupted run, every step's tokens add up to them, and they are
    exactly (GRPO: at most) what ``count_tokens`` priced the hold on."""
    cfg = config(adapter=adapter, learning_rate=1e-4 if adapter == "full" else 1e-3, max_steps=3, checkpoint_every=100,
                 grpo_max_new_tokens=8)
    billed: list[TokenCounts] = []
    straight = train(base, method(name), ROWS[name], cfg, tmp_path / "straight",
                     on_step=lambda m: billed.append(TokenCounts(m.tokens, m.prefill_tokens, m.decode_tokens)))
    stopped_after = []

    def stop_after_one() -> bool:
        return len(stopped_after) >= 1

    first = train(base, method(name), ROWS[name], cfg, tmp_path / "first", on_step=stopped_after.append, should_stop=stop_after_one)
    assert (first.stopped, first.steps_done, first.last_checkpoint.name) == (True, 1, "step-1")
    resumed = train(base, method(name), ROWS[name], cfg, tmp_path / "resumed", resume=first.last_checkpoint)
    assert (resumed.steps_done, resumed.usage) == (3, straight.usage)
    examples = method(name).examples(AutoTokenizer.from_pretrained(base), ROWS[name], cfg)
    priced = count_tokens(METHODS[name], examples, cfg)
    assert sum(billed, TokenCounts()) == straight.usage
    if name == "grpo":
        assert 0 < straight.usage.decode <= priced.decode and straight.usage.prefill == priced.prefill
        assert straight.usage.training == straight.usage.prefill + straight.usage.decode  # G sequences of prompt + completion
    else:
        assert straight.usage == priced and straight.usage.decode == 0

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
        # float32 rounding of the merge (measured up to 0.011 where the parent trained in bf16 autocast) vs what training changed
        assert (merged - served).abs().max() < min(3e-2, (merged - plain).abs().max() / 5)
    assert not hasattr(full, "peft_config") and all(p.requires_grad for p in full.parameters())  # a plain model, every weight trained


def test_grpo_pushes_up_the_completions_its_reward_prefers_and_starts_at_the_reference(base: Path, tmp_path: Path) -> None:
    """One GRPO step (Shao et al. 2024, eq. 3): at step 1 the policy is the reference (the LoRA adapter starts at 0),
    so the k3 KL is 0; after the step, the completions with positive advantage (rewarded above their group's mean)
    gained log-likelihood relative to those with negative advantage. The completions are the step's own, kept by the
    reward function; their log-likelihood is measured under the base model and under the checkpoint."""
    reward = EvenFirstToken()
    steps = []
    cfg = config(max_steps=1, batch_size=4, learning_rate=3e-3, grpo_group_size=6, grpo_max_new_tokens=10, grpo_temperature=1.2, seed=3)
    result = train(base, GRPO(reward), GRPO_ROWS, cfg, tmp_path, on_step=steps.append)
    assert steps[0].extra["kl"] == pytest.approx(0, abs=1e-6)
    assert 0 < steps[0].extra["reward_mean"] < 1 and steps[0].extra["groups_with_signal"] > 0
    tokenizer = AutoTokenizer.from_pretrained(base)
    examples = GRPO(reward).examples(tokenizer, GRPO_ROWS, cfg)
    prompts = {e.item_id: e.prompt_ids for e in examples}
    groups: dict[str, list[tuple[list[int], float]]] = {}
    for item_id, completion, r in reward.scored:
        groups.setdefault(item_id, []).append((completion, r))
    device = select_device(cfg)

    def loglik(model: object, prompt: list[int], completion: list[int]) -> float:
        batch = collate([Example(prompt + completion, [IGNORE_INDEX] * len(prompt) + completion)],
                        tokenizer.pad_token_id, device.torch_device)
        with torch.no_grad():
            return float(token_logprobs(model, *batch)[0].sum())

    before = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    after = load_model(base, cfg, device, init_adapter=result.last_checkpoint).eval()
    up, down = [], []
    for item_id, group in groups.items():
        mean = sum(r for _, r in group) / len(group)
        for completion, r in group:
            gain = loglik(after.get_base_model(), prompts[item_id], completion) - loglik(before, prompts[item_id], completion)
            if r > mean:
                up.append(gain)
            elif r < mean:
                down.append(gain)
    assert up and down
    assert sum(up) / len(up) > sum(down) / len(down) + 0.5, (up, down)  # measured: +0.63 vs -0.61 nats


def test_a_job_continuing_a_lora_parent_starts_at_the_parent_as_its_reference(base: Path, tmp_path: Path) -> None:
    """The reference policy is the model as the job started: continuing an SFT adapter, GRPO's k3 KL and DPO's
    implicit reward margin are 0 at step 1 (the bare base as the reference measured KL 1.3 for a trained adapter,
    and the loss pulled the policy back to the base). The parent is a real SFT checkpoint trained with a high
    learning rate, so it differs from the base; its own step-1 KL against the base shows the difference matters."""
    sft = train(base, METHODS["sft"], SFT_ROWS, config(max_steps=6, learning_rate=5e-3), tmp_path / "sft")
    parent = sft.last_checkpoint
    reward = EvenFirstToken()
    # float32 throughout (no bf16 autocast), so the merged reference and the adapter differ only by the merge's rounding
    grpo_cfg = config(max_steps=1, batch_size=2, grpo_group_size=4, grpo_max_new_tokens=8, seed=5, bf16_autocast=False)
    steps: list = []
    train(base, GRPO(reward), GRPO_ROWS, grpo_cfg, tmp_path / "grpo", init_adapter=parent, on_step=steps.append)
    assert steps[0].extra["kl"] == pytest.approx(0, abs=1e-4)
    dpo_steps: list = []
    train(base, METHODS["dpo"], DPO_ROWS, config(max_steps=1, batch_size=2, bf16_autocast=False), tmp_path / "dpo", init_adapter=parent,
          on_step=dpo_steps.append)
    assert dpo_steps[0].extra["reward_margin"] == pytest.approx(0, abs=1e-4)
    # against the bare base (a fresh adapter would be the base itself), the trained parent is far off
    tokenizer = AutoTokenizer.from_pretrained(base)
    device = select_device(grpo_cfg)
    batch = collate(tokenize_examples(tokenizer, SFT_ROWS[:2], 64), tokenizer.pad_token_id, device.torch_device)
    tuned = load_model(base, grpo_cfg, device, init_adapter=parent).eval()
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    with torch.no_grad():
        assert float((token_logprobs(tuned.get_base_model(), *batch)[0] - token_logprobs(plain, *batch)[0]).abs().mean()) > 0.05
