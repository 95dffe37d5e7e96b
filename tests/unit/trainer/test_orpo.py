"""ORPO (Hong et al. 2024) on the test-only model ``tiny-smollm2``: its first step's loss is the paper's formula computed
from the model's own logits, a few steps make the odds of the chosen answers grow over the rejected ones' with no
reference model, and the method's one field reaches the wire recipe and the trainer's refusals from its declaration."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from trainer_service.config import TrainConfig
from trainer_service.examples import IGNORE_INDEX, collate
from trainer_service.methods import METHODS
from trainer_service.schemas import parse_row
from trainer_service.training import train
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.common import recipes
from services.common.contracts import TRAINING_FIELDS, Recipe
from tests.conftest import prepared_models
from tests.models import TINY_MODEL

ROWS = [parse_row({"prompt": f"What is {a} + {a}?", "chosen": str(2 * a), "rejected": f"{2 * a + 1} or so"}, 1) for a in range(6)]


@pytest.fixture(scope="module")
def base() -> Path:
    return prepared_models(TINY_MODEL) / TINY_MODEL


def config(**fields: object) -> TrainConfig:
    return TrainConfig(**{"max_steps": 8, "batch_size": len(ROWS), "warmup_steps": 0, "max_seq_len": 64, "checkpoint_every": 100,
                          "learning_rate": 2e-3, "lr_scheduler_type": "constant", "bf16_autocast": False, **fields})  # type: ignore[arg-type]


def paper_loss(base: Path, cfg: TrainConfig, rows: list) -> float:
    """``L_SFT + λ · mean(-log σ(log odds(y_c) - log odds(y_r)))`` (eq. 6-7) from the base model's full logits, with
    ``P(y|x)`` the answer's mean per-token likelihood (eq. 3-4)."""
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    pairs = METHODS["orpo"].examples(tokenizer, rows, cfg)
    input_ids, attention_mask, labels = collate([p.chosen for p in pairs] + [p.rejected for p in pairs], tokenizer.pad_token_id,
                                                torch.device("cpu"))
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    target = labels[:, 1:]
    mask = target != IGNORE_INDEX
    token_logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    mean = token_logp.sum(1) / mask.sum(1)
    odds = mean - torch.log(1 - torch.exp(mean))
    n = len(pairs)
    nll = -token_logp[:n].sum() / mask[:n].sum()
    return float(nll - cfg.orpo_lambda * F.logsigmoid(odds[:n] - odds[n:]).mean())


def test_orpo_starts_at_the_papers_loss_and_learns_to_prefer_the_chosen_answers_without_a_reference(base: Path, tmp_path: Path) -> None:
    """At step 1 the LoRA adapter is 0, so the loop's loss on its batch (every row: the loss does not depend on their
    order) is the formula on the base model's logits; eight full-batch steps lower the loss (measured 11.17 to 10.60)
    and make every pair's log odds ratio favour the chosen answer (mean -0.04 to +0.36 nats)."""
    cfg = config(orpo_lambda=0.5)
    steps = []
    result = train(base, METHODS["orpo"], ROWS, cfg, tmp_path, on_step=steps.append)
    assert steps[0].loss == pytest.approx(paper_loss(base, cfg, ROWS), abs=1e-4)
    assert steps[-1].loss < steps[0].loss
    assert steps[-1].extra["log_odds_chosen"] > max(steps[0].extra["log_odds_chosen"], 0) and steps[-1].extra["reward_accuracy"] == 1.0
    assert steps[-1].extra["nll_loss"] < steps[0].extra["nll_loss"]  # the chosen answers' own likelihood rises too
    assert not recipes.method_spec("orpo").needs_reference and (result.last_checkpoint / "adapter_model.safetensors").exists()


def test_orpo_is_declared_once_and_its_field_reaches_the_recipe_and_the_refusals() -> None:
    """``orpo_lambda`` is in the wire recipe (TRL's default 0.1, λ > 0, described as ORPO's), under the gateway's
    policy, and a field every other method's job refuses; ORPO's job refuses DPO's β."""
    assert Recipe(method="orpo").orpo_lambda == 0.1 and "orpo_lambda" in TRAINING_FIELDS
    with pytest.raises(ValidationError):
        Recipe(method="orpo", orpo_lambda=0)
    assert Recipe.model_json_schema()["properties"]["orpo_lambda"]["description"].startswith("`orpo` only: λ")
    assert "orpo" in Recipe.model_json_schema()["properties"]["method"]["enum"]
    assert [m.name for m in recipes.METHODS.values() if "orpo_lambda" in m.fields] == ["orpo"]
    assert "dpo_beta" not in recipes.method_spec("orpo").fields and recipes.method_spec("orpo").formats == {"preference"}
