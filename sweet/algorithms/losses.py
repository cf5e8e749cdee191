"""The DPO loss (Rafailov et al. 2023, eq. 7) with an NLL term on the chosen action,
shared by SWEET-RL stage 2 (per-turn pairs) and multi-turn DPO (trajectory pairs).

    h      = β · [(log π_θ(y_w|x) − log π_ref(y_w|x)) − (log π_θ(y_l|x) − log π_ref(y_l|x))]
    L_DPO  = −log σ(h)                                  (loss_type "sigmoid", the paper's)
    L_IPO  = (Δ − 1/(2β))²                              (loss_type "ipo", Azar et al. 2023, eq. 17)
    Δ      = (log π_θ(y_w|x) − log π_ref(y_w|x)) / |y_w| − (log π_θ(y_l|x) − log π_ref(y_l|x)) / |y_l|
    L_NLL  = −log π_θ(y_w|x) / |y_w|          (chosen action only, per token)
    L      = mean over pairs of  L_DPO + α · L_NLL  [+ α_anchor · L_anchor]
    L_anchor = −log π_θ(y_a|x_a) / |y_a|      (optional: one anchor action per pair)

IPO's squared loss has its optimum at a finite margin, where DPO's keeps pushing the
rejected action down; its log-ratios are per token, as in TRL's `loss_type="ipo"` (which
the IPO authors confirmed is the form behind their results).

The anchor (SWEET-RL stage 2's `anchor_coef`, not in the paper) is an action the initial
policy sampled at a state the critic leaves unranked; its NLL estimates KL(π_0‖π_θ) there
up to a constant, holding the policy where the pairs say nothing.

log π(y|x) is a sum over ACTION tokens only (for a trajectory: over every agent turn,
each in its own recorded context); prompts and simulator tokens are never in it. The
reference code put the NLL term on the whole sequence, prompt included: here it is
the chosen action's per-token NLL, as in RPO (Pang et al. 2024) / TRL's `rpo_alpha`.

Why not TRL's DPOTrainer (trl 1.16, checked in its source):
- `_prepare_dataset` always extracts the prompt and re-tokenises text or conversations
  (`tokenize_fn`); it cannot take our recorded prompt ids and generated action ids
  as they are, so trained tokens could drift from sampled ones;
- one prompt + one completion per example: a multi-turn trajectory whose log-prob is
  the sum of per-turn log-probs, each turn in its own context, is not expressible;
- its only truncation mode, `keep_start`, cuts the end of the sequence (the action);
  we cut contexts in the middle and never the action (sweet.core.tokens.truncate_context).
Its `loss_type=["sigmoid", "sft"]` and `["ipo", "sft"]` compute the same two terms as this
function, and serve as the oracle of `dpo_loss` (tests/sweet/test_dpo_loss.py runs TRL's
DPOTrainer on the tiny model and compares the losses).
"""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LOSS_TYPES = ("sigmoid", "ipo")  # the pairwise term: DPO's −log σ(h), or IPO's squared margin


def loss_type_field():
    """The `loss_type` field of the DPO configs (SWEET-RL stage 2, MT-DPO): one of LOSS_TYPES."""
    return field(default="sigmoid", metadata={"help": "the pairwise loss: sigmoid (DPO, the paper's) | ipo (IPO's "
                                                      "squared margin, per-token log-ratios, target 1/(2 beta); "
                                                      "TRL's loss_type ipo)"})


def dpo_loss(
    policy_chosen_logps: "torch.Tensor",
    policy_rejected_logps: "torch.Tensor",
    ref_chosen_logps: "torch.Tensor",
    ref_rejected_logps: "torch.Tensor",
    chosen_token_counts: "torch.Tensor",
    *,
    beta: float = 0.1,
    nll_coef: float = 0.0,
    anchor_logps: "torch.Tensor | None" = None,
    anchor_token_counts: "torch.Tensor | None" = None,
    anchor_coef: float = 0.0,
    loss_type: str = "sigmoid",
    rejected_token_counts: "torch.Tensor | None" = None,
) -> tuple["torch.Tensor", dict[str, float]]:
    """DPO (or IPO) + α·NLL loss (module docstring) for a batch of B pairs.

    All tensors are [B]: summed log-probs over action tokens, and the chosen actions'
    token counts (for the per-token NLL). Returns the scalar loss and detached metrics:
    loss/dpo (the pairwise term, L_DPO or L_IPO), loss/nll, rewards/{chosen,rejected,margin,
    accuracy}, logps/{chosen,rejected}. rewards/* are the implicit DPO rewards
    β·(log π_θ − log π_ref), whatever the loss type. `loss_type` "ipo" needs
    `rejected_token_counts`. `anchor_logps` and `anchor_token_counts` ([B], one anchor action
    per pair) add α_anchor·L_anchor (loss/anchor).
    """
    import torch.nn.functional as F

    chosen_rewards = beta * (policy_chosen_logps - ref_chosen_logps)
    rejected_rewards = beta * (policy_rejected_logps - ref_rejected_logps)
    margin = chosen_rewards - rejected_rewards  # h in the module docstring
    if loss_type == "sigmoid":
        loss_dpo = -F.logsigmoid(margin).mean()
    elif loss_type == "ipo":
        if rejected_token_counts is None:
            raise ValueError("dpo_loss: loss_type 'ipo' needs rejected_token_counts (its log-ratios are per token)")
        delta = ((policy_chosen_logps - ref_chosen_logps) / chosen_token_counts.clamp(min=1)
                 - (policy_rejected_logps - ref_rejected_logps) / rejected_token_counts.clamp(min=1))
        loss_dpo = ((delta - 1 / (2 * beta)) ** 2).mean()
    else:
        raise ValueError(f"dpo_loss: loss_type must be one of {', '.join(map(repr, LOSS_TYPES))}, got {loss_type!r}")
    loss_nll = (-policy_chosen_logps / chosen_token_counts.clamp(min=1)).mean()
    loss = loss_dpo + nll_coef * loss_nll
    extra = {}
    if anchor_logps is not None:
        loss_anchor = (-anchor_logps / anchor_token_counts.clamp(min=1)).mean()
        loss = loss + anchor_coef * loss_anchor
        extra = {"loss/anchor": loss_anchor.item()}
    metrics = {
        "loss/dpo": loss_dpo.item(),
        "loss/nll": loss_nll.item(),
        "loss/total": loss.item(),
        "rewards/chosen": chosen_rewards.mean().item(),
        "rewards/rejected": rejected_rewards.mean().item(),
        "rewards/margin": margin.mean().item(),
        "rewards/accuracy": (margin > 0).float().mean().item(),
        "logps/chosen": policy_chosen_logps.mean().item(),
        "logps/rejected": policy_rejected_logps.mean().item(),
        **extra,
    }
    return loss, metrics
