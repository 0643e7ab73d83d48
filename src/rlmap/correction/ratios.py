"""The three ratios between π_θ, π_old and μ_old, and their tail diagnostics (docs/formulas.md §1).

Notation::

    log ρ = log π_θ − log π_old     current vs old: what PPO clipping limits
    log κ = log π_old − log μ_old   training vs rollout engine: what TIS/IcePop correct
    log d = log π_θ − log μ_old     = log ρ + log κ: what asynchronous gates use

Every ratio is formed in log space, in at least float32, and clamped to [−20, 20]
before ``exp``, so a token the other engine found nearly impossible cannot overflow
the loss. In
**bypass** mode π_old := μ_old, so κ ≡ 1 and ρ = d (one fewer forward pass).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlmap.core.errors import ConfigError
from rlmap.core.ops import at_least_float32, masked_mean

LOG_RATIO_BOUND = 20.0
"""|log x| is clamped to this before exp (exp(20) ≈ 4.9e8 stays finite in float32)."""


def log_ratio(log_num_BT: Tensor, log_den_BT: Tensor) -> Tensor:
    """clamp(log num − log den, −20, 20), the log of a ratio of probabilities; shapes broadcast.

    Formed in at least float32: both log-probabilities are upcast *before* the
    subtraction. In bfloat16 a log-probability near −10 is rounded to a step of
    0.0625, so a ratio band such as GSPO's 1 ± 3e-4 could not be resolved at all.
    """
    diff = at_least_float32(log_num_BT) - at_least_float32(log_den_BT)
    return diff.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def log_rho(logprobs_BT: Tensor, old_logprobs_BT: Tensor) -> Tensor:
    """log ρ = log π_θ − log π_old, clamped; (B, T), carries the gradient of log π_θ."""
    return log_ratio(logprobs_BT, old_logprobs_BT)


def log_kappa(old_logprobs_BT: Tensor, behavior_logprobs_BT: Tensor) -> Tensor:
    """log κ = log π_old − log μ_old, clamped and detached (neither policy is trained); (B, T)."""
    return log_ratio(old_logprobs_BT, behavior_logprobs_BT).detach()


def log_direct(logprobs_BT: Tensor, behavior_logprobs_BT: Tensor) -> Tensor:
    """log d = log π_θ − log μ_old (= log ρ + log κ before clamping), clamped; (B, T)."""
    return log_ratio(logprobs_BT, behavior_logprobs_BT)


def resolve_old(mode: str, old_logprobs_BT: Tensor | None, behavior_logprobs_BT: Tensor) -> Tensor:
    """log π_old for the ratio mode: the trainer's recomputation, or μ_old in bypass mode.

    decoupled: ``old_logprobs_BT`` (required; missing is a configuration error).
    bypass: ``behavior_logprobs_BT`` — then κ ≡ 1 and ρ = d by construction.
    """
    if mode == "bypass":
        return behavior_logprobs_BT
    if mode != "decoupled":
        raise ConfigError(f"behaviour.mode: expected 'decoupled' or 'bypass', got {mode!r}")
    if old_logprobs_BT is None:
        raise ConfigError(
            "behaviour.mode: 'decoupled' needs old_logprobs (π_old recomputed by the trainer); "
            "recompute them or use mode 'bypass'"
        )
    return old_logprobs_BT


def sequence_mean(x_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """(B,) Σ_t m_{i,t} x_{i,t} / |o_i|, the masked mean over each trajectory (0 if |o_i| = 0).

    Summed in at least float32 and counted in int64 (a bfloat16 count of 1001 tokens
    would round to 1000); differentiable in x.
    """
    n_B = mask_BT.sum(-1).clamp(min=1)  # (B,) int64
    return torch.where(mask_BT, at_least_float32(x_BT), 0.0).sum(-1) / n_B


def masked_quantile(x_BT: Tensor, mask_BT: Tensor, q: float) -> Tensor:
    """The q-quantile (linear interpolation, as ``torch.quantile``) of x over masked entries.

    0 when nothing is masked. Vectorised without a host sync, and without a full sort:
    only the tail beyond the quantile is selected (``topk``), since a diagnostic such
    as p99 runs on every learner step (a sort of B·T = 512K values costs ~6× a topk).
    Uses Q_q(x) = −Q_{1−q}(−x) so that the selected tail is always the short one.
    Values are compared and interpolated in at least float32, the position is
    computed in float64 (in bfloat16, position 0.99·999 = 989.01 would round to 988).
    """
    if q < 0.5:
        return -masked_quantile(-x_BT, mask_BT, 1.0 - q)
    x_BT = at_least_float32(x_BT)
    flat = torch.where(mask_BT, x_BT, -torch.inf).flatten()  # (N,), masked-out at the bottom
    total = flat.numel()
    if total == 0:
        return x_BT.new_zeros(())
    k = min(total, int((total - 1) * (1.0 - q)) + 2)
    top = flat.topk(k).values  # (k,) descending
    n = mask_BT.sum()  # int64
    pos = (n - 1).clamp(min=0).to(torch.float64) * q  # ascending position among the n values
    lo, hi = pos.floor(), pos.ceil()
    # Ascending index i of n values is descending index n − 1 − i, within the top k.
    top_lo = top[(n - 1 - lo.long()).clamp(0, k - 1)]
    top_hi = top[(n - 1 - hi.long()).clamp(0, k - 1)]
    value = top_lo + (pos - lo).to(x_BT.dtype) * (top_hi - top_lo)
    return torch.where(n > 0, value, torch.zeros_like(value))


def ratio_stats(log_x_BT: Tensor, mask_BT: Tensor, name: str) -> dict[str, Tensor]:
    """Tails of a ratio x over masked tokens: mean, p99 and max of |log x| (detached scalars).

    Keys: ``ratio/<name>/mean_abs_log``, ``ratio/<name>/p99_abs_log``,
    ``ratio/<name>/max_abs_log``. PPO's clip fraction alone cannot reveal an engine
    mismatch; these tails on κ can.
    """
    a = at_least_float32(log_x_BT.detach()).abs()  # (B, T)
    mask = mask_BT.bool()
    return {
        f"ratio/{name}/mean_abs_log": masked_mean(a, mask),
        f"ratio/{name}/p99_abs_log": masked_quantile(a, mask, 0.99),
        f"ratio/{name}/max_abs_log": torch.where(mask, a, 0.0).amax(),
    }
