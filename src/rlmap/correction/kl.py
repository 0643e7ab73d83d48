"""KL to the reference: per-token estimators, KL in the reward, adaptive β (docs/formulas.md §6).

Notation: x_t = log π_ref(t) − log π_θ(t) for the sampled token t ~ π_θ (approximately:
the samples come from μ_old). Schulman 2020, "Approximating KL divergence":

    k1 = log π_θ − log π_ref = −x                 unbiased, can be negative
    k2 = ½ (log π_θ − log π_ref)²                 biased, low variance, ≥ 0
    k3 = exp(x) − x − 1                           unbiased, ≥ 0 (clamped to [−10, 10])

In the reward (classic RLHF): r_t ← r_t − β·k1_t. In the loss (GRPO): j ← j + β·k.
The importance-weighted k3_iw = ρ·k3, ρ = π_θ/π_old not detached, corrects for the samples
coming from π_old rather than π_θ (DeepSeek-V3.2's "unbiased KL").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlmap.core.ops import at_least_float32
from rlmap.core.registry import Registry
from rlmap.correction.ratios import log_ratio

K3_BOUND = 10.0
"""k3 is clamped to [−10, 10] (as verl's ``low_var_kl``)."""
ADAPTIVE_ERROR_BOUND = 0.2
"""The adaptive controller's proportional error KL/target − 1 is clipped to ±0.2."""


@dataclass(frozen=True)
class KLEstimator:
    """A registered per-token KL estimator: ``fn(logprobs_BT, ref_logprobs_BT) -> k_BT``."""

    fn: Callable[[Tensor, Tensor], Tensor]
    summary: str
    importance_weighted: bool = False
    """True: the estimate is multiplied by ρ = π_θ/π_old, not detached
    (:func:`importance_weighted`)."""

    def per_token(
        self, logprobs_BT: Tensor, ref_logprobs_BT: Tensor, old_logprobs_BT: Tensor
    ) -> Tensor:
        """k (B, T) as placed in the loss; ``old_logprobs_BT`` (log π_old) is read only when
        the estimator is importance-weighted."""
        k = self.fn(logprobs_BT, ref_logprobs_BT)
        if not self.importance_weighted:
            return k
        return importance_weighted(k, logprobs_BT, old_logprobs_BT)


def k1(logprobs_BT: Tensor, ref_logprobs_BT: Tensor) -> Tensor:
    """k1 = log π_θ − log π_ref; (B, T), formed in at least float32 (as every log-ratio)."""
    return at_least_float32(logprobs_BT) - at_least_float32(ref_logprobs_BT)


def k2(logprobs_BT: Tensor, ref_logprobs_BT: Tensor) -> Tensor:
    """k2 = ½ (log π_θ − log π_ref)²; (B, T), in at least float32."""
    return 0.5 * k1(logprobs_BT, ref_logprobs_BT).square()


def k3(logprobs_BT: Tensor, ref_logprobs_BT: Tensor) -> Tensor:
    """k3 = exp(x) − x − 1, x = log π_ref − log π_θ, clamped to [−10, 10]; (B, T).

    Differs from the bare formula: x itself is clamped to [−20, 20] before exp (the
    rule for every ratio, docs/formulas.md §1, and formed in at least float32), so exp cannot
    overflow and the backward pass cannot produce 0·inf = NaN where the outer clamp is
    active. exp(x) − 1 is computed as expm1(x): for tiny |x|, float32 exp(x) rounds to 1
    and would give k3 = −x < 0.
    """
    x = log_ratio(ref_logprobs_BT, logprobs_BT)
    return (torch.expm1(x) - x).clamp(-K3_BOUND, K3_BOUND)


def importance_weighted(k_BT: Tensor, logprobs_BT: Tensor, old_logprobs_BT: Tensor) -> Tensor:
    """ρ·k, ρ = π_θ/π_old **not** detached (log ρ clamped to [−20, 20]); (B, T).

    Why: the sampled tokens come from π_old, not π_θ, so E_{π_old}[ρ·k] is the estimate of
    KL(π_θ ‖ π_ref) under π_θ (DeepSeek-V3.2, arXiv 2512.02556, "unbiased KL estimate"), and
    the gradient gains the score-function term k·∇log π_θ that a plain β·k lacks. At ρ = 1
    (π_θ = π_old, one optimiser step) the value is k's; for k3 the gradient w.r.t. log π_θ is
    (1 − π_ref/π_θ) + k3 = log π_θ − log π_ref, not 1 − π_ref/π_θ.

    Code: slime ``slime/utils/ppo_utils.py::compute_approx_kl(importance_ratio=)`` with
    ``--use-unbiased-kl`` (ρ = exp(log π_θ − old_log_probs), old = π_old, or μ with
    ``--use-rollout-logprobs``); TRL ``GRPOTrainer._compute_loss`` with
    ``use_bias_correction_kl`` (coef_1 = ρ, per token or per sequence). rlmap's π_old is the
    mode's, so in bypass mode ρ = d = π_θ/μ_old. Differs from NeMo-RL
    (``nemo_rl/algorithms/utils.py::calculate_kl(importance_sampling_weights=)``): its weight
    is π_θ/μ with ``use_on_policy_kl_approximation``, else exp(log π_θ − sg log π_θ) (value
    1, the score term kept) on every step — equal to ρ here only at ρ = 1; it also clamps
    the product to ±10, where rlmap clamps k3 before weighting.
    """
    return log_ratio(logprobs_BT, old_logprobs_BT).exp() * k_BT


def kl_in_reward(
    step_rewards_BT: Tensor,
    logprobs_BT: Tensor,
    ref_logprobs_BT: Tensor,
    mask_BT: Tensor,
    beta: float,
) -> Tensor:
    """r_t ← r_t − β·k1_t on action tokens (unchanged elsewhere); (B, T), detached.

    Paper: Ziegler et al. 2019; Ouyang et al. 2022 (classic RLHF). The penalty is a
    reward, so it carries no gradient; the advantage estimator sees it.
    """
    penalty = torch.where(mask_BT, k1(logprobs_BT, ref_logprobs_BT).detach(), 0.0)
    return step_rewards_BT - beta * penalty


def adaptive_beta(beta: float, kl: float, target: float, n_steps: int, horizon: int) -> float:
    """β ← β · (1 + clip(KL/target − 1, −0.2, 0.2) · n/horizon).

    Paper: Ziegler et al. 2019 (adaptive KL controller); ``n_steps`` is n, the number
    of samples since the last update, ``kl`` the measured mean KL. β rises when KL is
    above target and falls below it, by at most 20% × n/horizon per update.
    """
    error = min(max(kl / target - 1.0, -ADAPTIVE_ERROR_BOUND), ADAPTIVE_ERROR_BOUND)
    return beta * (1.0 + error * n_steps / horizon)


registry: Registry[KLEstimator] = Registry("KL estimator")
registry.add("k1", KLEstimator(k1, "log π_θ − log π_ref (unbiased)"))
registry.add("k2", KLEstimator(k2, "½ (log π_θ − log π_ref)² (biased, low variance)"))
registry.add("k3", KLEstimator(k3, "exp(x) − x − 1, x = log π_ref − log π_θ (unbiased, ≥ 0)"))
registry.add(
    "k3_iw",
    KLEstimator(
        k3,
        "ρ·k3, ρ = π_θ/π_old not detached (DeepSeek-V3.2 unbiased KL; slime --use-unbiased-kl, "
        "TRL use_bias_correction_kl)",
        importance_weighted=True,
    ),
)
