"""The three reductions as per-token weights, and the axis registry.

Notation (docs/formulas.md §5): m_{i,t} the action mask, |o_i| = Σ_t m_{i,t}, j_{i,t}
the per-token loss of a policy objective, B and N = Σ_{i,t} m_{i,t} the counts
of the whole optimiser mini-batch (:class:`~rlmap.reduction.denominator.Denominator`).

Every reduction is written as weights w_{i,t}, fixed once per mini-batch, with

    loss = Σ_{i,t} w_{i,t} · j_{i,t}.

A row's weights depend only on that row's mask and the mini-batch's
denominator, so the loss of a micro-batch is the same sum over its rows and the
micro-batch gradients add up to the full-batch gradient, for every reduction.
Rows with |o_i| = 0 get zero weight and still count in B.
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

WeightFn = Callable[[Tensor, Denominator, ReductionParams], Tensor]


@dataclass(frozen=True)
class Reduction:
    """A registry entry: the weight function and what a run needs to know about it."""

    fn: WeightFn
    """``fn(mask_BT, denom, params) -> weights_BT``: (B, T) float32, zero off the mask."""
    needs_max_len: bool
    """Whether ``ReductionParams.max_len`` (L_max) must be set."""
    summary: str
    """One line: the unit in which the loss is averaged."""
    paper: str
    """Where the reduction comes from."""


def response_mean_weights(mask_BT: Tensor, denom: Denominator, p: ReductionParams) -> Tensor:
    """w_{i,t} = m_{i,t} / (|o_i| · B): loss = (1/B) Σ_i (Σ_t m_{i,t} j_{i,t}) / |o_i|.

    Each response weighs the same, whatever its length (GRPO, Shao et al. 2024).
    Shapes: ``mask_BT`` (B, T) → weights (B, T) float32. |o_i| is the row's own count, so it
    is the same in any micro-batch; B is the whole mini-batch's ``denom.sequences``.
    """
    m = mask_BT.to(torch.float32)  # (B, T)
    lengths = m.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1); empty rows have m = 0 anyway
    return m / (lengths * max(denom.sequences, 1))


def token_mean_weights(mask_BT: Tensor, denom: Denominator, p: ReductionParams) -> Tensor:
    """w_{i,t} = m_{i,t} / N: loss = (Σ_{i,t} m_{i,t} j_{i,t}) / (Σ_{i,t} m_{i,t}).

    Each action token weighs the same (DAPO, Yu et al. 2025; PPO for RLHF). N is the
    whole mini-batch's ``denom.tokens``. Shapes: (B, T) → (B, T) float32.
    """
    return mask_BT.to(torch.float32) / max(denom.tokens, 1)


def fixed_budget_weights(mask_BT: Tensor, denom: Denominator, p: ReductionParams) -> Tensor:
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
