"""``orpo``: Odds Ratio Preference Optimization (Hong et al. 2024, "ORPO: Monolithic Preference Optimization without
Reference Model", §4) on ``preference`` rows (``prompt``, ``chosen``, ``rejected``), with no reference model.

For a pair, with ``log P(y|x) = 1/|y| Σ_t log π(y_t | x, y_<t)`` the policy's mean per-token log-likelihood of an
answer (eq. 3; over the answer's text and the chat template's end-of-turn tokens, as DPO's sums are) and
``odds(y|x) = P(y|x) / (1 - P(y|x))`` (eq. 4), the odds-ratio loss is
``L_OR = -log σ(log odds(y_c|x) - log odds(y_r|x))`` (eq. 7), where ``log odds(y|x) = log P - log(1 - P)``;
the step minimizes ``L = L_SFT + λ · mean(L_OR)`` (eq. 6), ``L_SFT`` the next-token loss of the chosen answers (their
tokens' mean negative log-likelihood over the batch, TRL's ``ORPOTrainer``) and ``λ`` ``recipe.orpo_lambda``
(TRL's ``beta``). Examples and token counts are DPO's: a preference pair is two sequences.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from trainer_service.config import TrainConfig
from trainer_service.examples import collate
from trainer_service.logprobs import sequence_logprobs
from trainer_service.methods.dpo import DPO, PreferencePair
from trainer_service.policy import Policy
from trainer_service.steps import StepLoss, method_step


def log_odds(mean_logprob: torch.Tensor) -> torch.Tensor:
    """``log(P / (1 - P))`` of ``P = exp(mean_logprob)`` (any shape, log-probabilities ``< 0``), with ``log(1 - P)``
    as ``log(-expm1(log P))``, exact where ``P`` is near 1."""
    return mean_logprob - torch.log(-torch.expm1(mean_logprob))


@method_step("orpo")
class ORPO(DPO):
    """ORPO's loss over DPO's preference pairs (module docstring). Step metrics: ``nll_loss`` (``L_SFT``),
    ``log_odds_ratio`` (mean ``log σ`` of the pairs' log odds ratio, TRL's name), ``log_odds_chosen`` (mean log odds
    ratio of the chosen over the rejected answer: the preference margin), ``reward_accuracy`` (share of pairs whose
    chosen answer has the higher odds)."""

    refuse_identical = False  # a pair made identical by the cut still trains its NLL term on the chosen answer

    def loss(self, policy: Policy, batch: Sequence[PreferencePair], config: TrainConfig) -> StepLoss:
        """``L_SFT + λ · mean(L_OR)`` of the pairs; the chosen and rejected sequences run as one batch of ``2n`` rows."""
        n = len(batch)
        tensors = collate([p.chosen for p in batch] + [p.rejected for p in batch], policy.pad_token_id, policy.device.torch_device)
        logprobs, rows = policy.logprobs(*tensors)  # [tokens], [tokens]: each supervised token's log π and its row
        lengths = torch.bincount(rows, minlength=2 * n).to(logprobs.dtype)  # [2n] supervised tokens per sequence
        mean = sequence_logprobs(logprobs, rows, 2 * n) / lengths  # [2n] log P(y|x), eq. 3
        ratio = log_odds(mean[:n]) - log_odds(mean[n:])  # [n] log odds(y_c|x) / odds(y_r|x)
        nll = -logprobs[rows < n].mean()
        odds_ratio_term = F.logsigmoid(ratio)
        loss = nll - config.orpo_lambda * odds_ratio_term.mean()
        return StepLoss(loss, {"nll_loss": float(nll.detach()), "log_odds_ratio": float(odds_ratio_term.detach().mean()),
                               "log_odds_chosen": float(ratio.detach().mean()), "reward_accuracy": float((ratio > 0).float().mean())})
