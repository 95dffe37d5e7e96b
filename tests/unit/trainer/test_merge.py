"""Merge jobs' combinations on the test-only model ``tiny-smollm2`` (SmolLM2's architecture and tokenizer, four layers,
random weights; :mod:`tests.models`), as a merge is arithmetic on weights whatever they are: a merge of one checkpoint
with weight 1 is that checkpoint, merged LoRA weights folded into the base answer as the adapter served on top, a
linear merge of full weights is their weighted average, and TIES / DARE write loadable checkpoints (DARE's drop fixed
by its seed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from trainer_service.methods.merge import MergeStopped, merge_checkpoints
from transformers import AutoModelForCausalLM

from tests.conftest import prepared_models
from tests.models import TINY_MODEL

IDS = torch.tensor([[1, 504, 3458, 314, 216, 33, 1232, 28]])


@pytest.fixture(scope="module")
def base() -> Path:
    return prepared_models(TINY_MODEL) / TINY_MODEL


def _model(folder: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def adapters(base: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two rank-8 LoRA adapters with random (non-zero) factors, as training would leave them."""
    folders = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = get_peft_model(_model(base), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        folders.append(tmp_path_factory.mktemp(f"lora{seed}"))
        model.save_pretrained(folders[-1])
    return folders


@pytest.fixture(scope="module")
def fulls(base: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two full-weight checkpoints: the base with one MLP's weights moved by small random changes."""
    folders = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = _model(base)
        with torch.no_grad():
            for layer in model.model.layers[2:4]:
                layer.mlp.down_proj.weight.add_(torch.randn_like(layer.mlp.down_proj.weight) * 0.02)
        folders.append(tmp_path_factory.mktemp(f"full{seed}"))
        model.save_pretrained(folders[-1])
    return folders


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_a_merge_of_one_lora_adapter_with_weight_1_is_that_adapter_and_folded_into_the_base_answers_alike(base: Path, adapters: list[Path],
                                                                                                        tmp_path: Path) -> None:
    merged = merge_checkpoints(base, "lora", adapters[:1], [1.0], "linear", 0.5, 0, tmp_path / "merged")
    served = PeftModel.from_pretrained(_model(base), adapters[0]).eval()
    again = PeftModel.from_pretrained(_model(base), merged).eval()
    assert torch.allclose(_logits(served), _logits(again), atol=1e-4)
    folded = PeftModel.from_pretrained(_model(base), merged).merge_and_unload().eval()
    with torch.no_grad():
        on_top = served.generate(input_ids=IDS, max_new_tokens=12, do_sample=False)
        in_base = folded.generate(input_ids=IDS, max_new_tokens=12, do_sample=False)
    assert on_top.tolist() == in_base.tolist()
    assert not torch.allclose(_logits(_model(base)), _logits(served), atol=1e-3)  # the adapter does change the model


def test_a_merge_of_one_full_checkpoint_with_weight_1_is_that_checkpoint_and_a_linear_merge_is_the_weighted_average(
        base: Path, fulls: list[Path], tmp_path: Path) -> None:
    one = merge_checkpoints(base, "full", fulls[:1], [1.0], "linear", 0.5, 0, tmp_path / "one")
    assert torch.allclose(_logits(_model(fulls[0])), _logits(_model(one)), atol=1e-4)
    soup = merge_checkpoints(base, "full", fulls, [0.25, 0.75], "linear", 0.5, 0, tmp_path / "soup")
    a, b, m = (load_file(folder / "model.safetensors") for folder in (*fulls, soup))
    name = "model.layers.2.mlp.down_proj.weight"
    assert torch.allclose(m[name], 0.25 * a[name] + 0.75 * b[name], atol=1e-6)
    assert torch.equal(m["model.layers.0.mlp.down_proj.weight"], a["model.layers.0.mlp.down_proj.weight"])  # untouched by both


@pytest.mark.parametrize("combination", ["ties", "dare_linear", "dare_ties"])
def test_ties_and_dare_write_loadable_checkpoints_of_both_kinds_and_dare_is_fixed_by_its_seed(base: Path, adapters: list[Path],
                                                                                             fulls: list[Path], tmp_path: Path,
                                                                                             combination: str) -> None:
    lora = merge_checkpoints(base, "lora", adapters, [0.5, 0.5], combination, 0.5, 7, tmp_path / "lora")
    assert torch.isfinite(_logits(PeftModel.from_pretrained(_model(base), lora))).all()
    full = merge_checkpoints(base, "full", fulls, [0.5, 0.5], combination, 0.5, 7, tmp_path / "full")
    merged = load_file(full / "model.safetensors")["model.layers.3.mlp.down_proj.weight"]
    base_w = load_file(base / "model.safetensors")["model.layers.3.mlp.down_proj.weight"]
    changed = (merged != base_w).float().mean()
    assert 0.2 < changed < 0.9  # about `density` of the entries kept (TIES: a union of two, minus sign conflicts)
    again = merge_checkpoints(base, "full", fulls, [0.5, 0.5], combination, 0.5, 7, tmp_path / "again")
    assert torch.equal(load_file(again / "model.safetensors")["model.layers.3.mlp.down_proj.weight"], merged)
    if combination.startswith("dare"):
        other = merge_checkpoints(base, "full", fulls, [0.5, 0.5], combination, 0.5, 8, tmp_path / "other")
        assert not torch.equal(load_file(other / "model.safetensors")["model.layers.3.mlp.down_proj.weight"], merged)


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_a_cancelled_merge_stops_and_writes_nothing(base: Path, adapters: list[Path], fulls: list[Path], tmp_path: Path, kind: str) -> None:
    asked = []

    def cancelled_by_now() -> bool:
        asked.append(1)
        return len(asked) > 1 if kind == "full" else True

    with pytest.raises(MergeStopped):
        merge_checkpoints(base, kind, adapters if kind == "lora" else fulls, [0.5, 0.5], "linear", 0.5, 0, tmp_path / "out", cancelled_by_now)
    assert list(tmp_path.iterdir()) == []
