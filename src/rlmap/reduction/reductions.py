"""The reductions as per-token weights, and the axis registry.

Notation (docs/formulas.md §5): m_{i,t} the action mask, |o_i| = Σ_t m_{i,t}, j_{i,t}
the per-token loss of a policy objective, B and N = Σ_{i,t} m_{i,t} the counts
of the whole optimiser mini-batch, g(i) the prompt group of row i, N_g the action tokens
of group g and P the number of groups in that mini-batch
(:class:`~rlmap.reduction.denominator.Denominator`).

Every reduction is written as weights w_{i,t}, fixed once per mini-batch, with

    loss = Σ_{i,t} w_{i,t} · j_{i,t}.

A row's weights depend only on that row's mask (and group id) and the mini-batch's
denominator, so the loss of a micro-batch is the same sum over its rows and the
micro-batch gradients add up to the full-batch gradient, for every reduction.
Rows with |o_i| = 0 get zero weight and still count in B; groups with N_g = 0 still
count in P.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlmap.core.errors import ConfigError
from rlmap.core.registry import Registry
from rlmap.reduction.denominator import Denominator
from rlmap.reduction.params import ReductionParams

WeightFn = Callable[[Tensor, Denominator, ReductionParams, Tensor | None], Tensor]


@dataclass(frozen=True)
class Reduction:
    """A registry entry: the weight function and what a run needs to know about it."""

    fn: WeightFn
    """``fn(mask_BT, denom, params, group_B) -> weights_BT``: (B, T) float32, zero off the
    mask. ``group_B`` (B,) long group ids, or None; only ``needs_groups`` entries read it."""
    needs_max_len: bool
    """Whether ``ReductionParams.max_len`` (L_max) must be set."""
    summary: str
    """One line: the unit in which the loss is averaged."""
    paper: str
    """Where the reduction comes from."""
    needs_groups: bool = False
    """Whether the weights need each row's prompt group (``Batch.group_id``) and the
    denominator's per-group counts."""


def response_mean_weights(
    mask_BT: Tensor, denom: Denominator, p: ReductionParams, group_B: Tensor | None = None
) -> Tensor:
    """w_{i,t} = m_{i,t} / (|o_i| · B): loss = (1/B) Σ_i (Σ_t m_{i,t} j_{i,t}) / |o_i|.

    Each response weighs the same, whatever its length (GRPO, Shao et al. 2024).
    Shapes: ``mask_BT`` (B, T) → weights (B, T) float32. |o_i| is the row's own count, so it
    is the same in any micro-batch; B is the whole mini-batch's ``denom.sequences``.
    """
    m = mask_BT.to(torch.float32)  # (B, T)
    lengths = m.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1); empty rows have m = 0 anyway
    return m / (lengths * max(denom.sequences, 1))


def token_mean_weights(
    mask_BT: Tensor, denom: Denominator, p: ReductionParams, group_B: Tensor | None = None
) -> Tensor:
    """w_{i,t} = m_{i,t} / N: loss = (Σ_{i,t} m_{i,t} j_{i,t}) / (Σ_{i,t} m_{i,t}).

    Each action token weighs the same (DAPO, Yu et al. 2025; PPO for RLHF). N is the
    whole mini-batch's ``denom.tokens``. Shapes: (B, T) → (B, T) float32.
    """
    return mask_BT.to(torch.float32) / max(denom.tokens, 1)


def fixed_budget_weights(
    mask_BT: Tensor, denom: Denominator, p: ReductionParams, group_B: Tensor | None = None
) -> Tensor:
    """w_{i,t} = m_{i,t} / (B · L_max): loss = (1 / (B · L_max)) Σ_{i,t} m_{i,t} j_{i,t}.

    Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): the
    denominator does not depend on how many tokens were generated, so long and
    short responses are not re-weighted by their length. Shapes: (B, T) → (B, T)
    float32. A row longer than L_max (e.g. several turns) is not truncated; its
    tokens simply each weigh 1/(B · L_max).
    """
    if p.max_len is None:
        raise ConfigError("reduction.max_len: 'fixed_budget' needs L_max (max_len), got None")
    return mask_BT.to(torch.float32) / (max(denom.sequences, 1) * p.max_len)


def prompt_mean_weights(
    mask_BT: Tensor, denom: Denominator, p: ReductionParams, group_B: Tensor | None = None
) -> Tensor:
    """w_{i,t} = m_{i,t} / (N_{g(i)} · P): loss = (1/P) Σ_g (Σ_{i∈g} Σ_t m_{i,t} j_{i,t}) / N_g.

    Each prompt group weighs the same, and inside a group each action token does, so a
    prompt whose G responses are long does not outweigh one whose responses are short
    (SkyRL ``loss_reduction="prompt_mean"``, #1719:
    skyrl/backends/skyrl_train/utils/ppo_utils.py::apply_loss_reduction_to_advantages_minibatch).
    N_g and P are the whole mini-batch's (``denom.group_tokens``), so a row's weight is the
    same in any micro-batch or rank. A group with N_g = 0 weighs 0 and still counts in P, as
    in SkyRL (its denominator is clamped to 1 and it stays in ``num_prompts``).

    Differs from SkyRL: SkyRL cuts mini-batches at prompt boundaries; rlmap draws a
    mini-batch's rows at random, so a group split between mini-batches is, in each, the
    group's rows there (N_g counts those, P counts the group once). Groups need not be
    contiguous rows. Shapes: ``mask_BT`` (B, T), ``group_B`` (B,) long → (B, T) float32.
    """
    if group_B is None or denom.group_tokens is None:
        raise ValueError("prompt_mean: needs group_B and a Denominator with group_tokens")
    device = mask_BT.device
    ids_P = torch.tensor([g for g, _ in denom.group_tokens], dtype=torch.long, device=device)
    n_P = torch.tensor([n for _, n in denom.group_tokens], dtype=torch.float32, device=device)
    at_B = torch.searchsorted(ids_P, group_B.to(device=device, dtype=torch.long))  # g(i)'s slot
    n_B1 = n_P[at_B.clamp(max=max(len(ids_P) - 1, 0))].clamp(min=1.0).unsqueeze(-1)  # (B, 1)
    return mask_BT.to(torch.float32) / (n_B1 * max(denom.groups, 1))


def token_sum_weights(
    mask_BT: Tensor, denom: Denominator, p: ReductionParams, group_B: Tensor | None = None
) -> Tensor:
    """w_{i,t} = m_{i,t}: loss = Σ_{i,t} m_{i,t} j_{i,t}, no denominator.

    verl ``loss_agg_mode="token-sum"`` (verl 0.9.1,
    verl/trainer/ppo/core_algos.py::agg_loss) and Tinker's summed losses. verl multiplies
    each rank's sum by dp_size only to undo DDP's gradient averaging; rlmap sums the ranks'
    gradients, so no factor appears. The gradient grows with the number of action tokens:
    against token_mean the learning rate (and every β of a loss term) acts N times larger.
    Shapes: (B, T) → (B, T) float32.
    """
    return mask_BT.to(torch.float32)


def seq_mean_token_sum_weights(
    mask_BT: Tensor, denom: Denominator, p: ReductionParams, group_B: Tensor | None = None
) -> Tensor:
    """w_{i,t} = m_{i,t} / B: loss = (1/B) Σ_i Σ_t m_{i,t} j_{i,t}.

    Mean over responses of each response's token sum (verl ``"seq-mean-token-sum"``,
    verl/trainer/ppo/core_algos.py::agg_loss); fixed_budget is this divided by L_max.
    Differs from verl: verl's B′ leaves out fully masked rows unless ``global_batch_size`` is
    passed (its trainer passes the mini-batch's row count, as rlmap does); rlmap's B
    (``denom.sequences``) always counts them. Shapes: (B, T) → (B, T) float32.
    """
    return mask_BT.to(torch.float32) / max(denom.sequences, 1)


registry: Registry[Reduction] = Registry("reduction")
registry.add(
    "response_mean",
    Reduction(
        fn=response_mean_weights,
        needs_max_len=False,
        summary="mean over responses of each response's token mean; each response weighs 1/B",
        paper="Shao et al. 2024, DeepSeekMath (GRPO)",
    ),
)
registry.add(
    "token_mean",
    Reduction(
        fn=token_mean_weights,
        needs_max_len=False,
        summary="mean over all action tokens of the mini-batch; each token weighs 1/N",
        paper="Yu et al. 2025, DAPO (token-level policy gradient loss)",
    ),
)
registry.add(
    "fixed_budget",
    Reduction(
        fn=fixed_budget_weights,
        needs_max_len=True,
        summary="sum over action tokens divided by the constant B · L_max",
        paper="Liu et al. 2025, Understanding R1-Zero-Like Training (Dr. GRPO)",
    ),
)
registry.add(
    "prompt_mean",
    Reduction(
        fn=prompt_mean_weights,
        needs_max_len=False,
        summary="mean over prompt groups of each group's token mean; each group weighs 1/P",
        paper="SkyRL loss_reduction=prompt_mean (NovaSky-AI/SkyRL #1719)",
        needs_groups=True,
    ),
)
registry.add(
    "token_sum",
    Reduction(
        fn=token_sum_weights,
        needs_max_len=False,
        summary="sum over all action tokens, no denominator; each token weighs 1",
        paper="verl loss_agg_mode=token-sum (verl 0.9.1 core_algos.agg_loss); Tinker's sum",
    ),
)
registry.add(
    "seq_mean_token_sum",
    Reduction(
        fn=seq_mean_token_sum_weights,
        needs_max_len=False,
        summary="mean over responses of each response's token sum; each token weighs 1/B",
        paper="verl loss_agg_mode=seq-mean-token-sum (verl 0.9.1 core_algos.agg_loss)",
    ),
)
