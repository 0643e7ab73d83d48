"""TRL's RLOOConfig → rlmap (read through ``--from trl``; :func:`rlmap.recipes.translate.trl.
trainer_of` tells it from a GRPOConfig).

Defaults are trl 1.16.0's ``trl/trainer/rloo_config.py`` (``R:line``, the line of the
field's ``default=``); the mathematics is ``rloo_trainer.py``'s ``_generate_and_score_
completions`` (advantages) and ``compute_loss`` (the loss), read from the installed package:

- R_i ← R_i − β·Σ_t (log π_old − log π_ref), then the leave-one-out baseline
  A_i = R_i − mean_{j≠i} R_j: rlmap's ``rloo`` estimator with a k1 KL in the reward, whose
  outcome estimators read R_i − β·Σ_t k1_t (``Batch.total_rewards``). β = 0.05 by default.
- loss_i = −min(ρ_i·A_i, clip(ρ_i, 1−ε, 1+ε_high)·A_i), ρ_i = Π_t π_θ/π_old (the *product*
  of the token ratios), averaged over sequences. rlmap's closest is GSPO (sequence-level)
  reduced by ``seq_mean_token_sum``: its gradient is −A_i·s_i·Σ_t ∇log π_θ / B with s_i the
  *geometric mean* of the token ratios. At one optimiser step per batch (``num_iterations``
  1, one mini-batch) ρ = s = 1, the clip never engages, and the two are the same; with
  more, TRL clips the product, rlmap the geometric mean: approximate.
"""

from __future__ import annotations

from typing import Any

from rlmap.recipes.translate.rows import (
    IMPLIED,
    NULL,
    Lookup,
    Mapped,
    Mapping,
    field,
    off,
    read_with,
)
from rlmap.recipes.translate.trl_args import shared, updates_per_batch

R = "trl 1.16.0 trl/trainer/rloo_config.py"
RLOO_LINES = {
    "generation_batch_size": 343,
    "steps_per_generation": 350,
    "num_iterations": 510,
    "mask_truncated_completions": 543,
    "temperature": 354,
    "top_p": 358,
    "top_k": 365,
    "min_p": 372,
    "max_completion_length": 316,
    "learning_rate": 254,
}
"""The line of each shared field's ``default=`` in rloo_config.py."""

TRAINER = {
    "feedback.source": "verifier",
    "credit.estimator": "rloo",
    "critic.enabled": False,
    "behaviour.objective": "gspo",
    "behaviour.gspo_token": False,
    "behaviour.mode": "decoupled",
    "behaviour.corrections": [],
    "behaviour.positive_nll": 0.0,
    "behaviour.dual_clip": None,
    "reduction.name": "seq_mean_token_sum",
    "reduction.max_len": None,
    "sampling.filter": "none",
    "feedback.overlong_cache": None,
    "system.mode": "sync",
}


def trainer(world_size: int) -> Any:
    """The RLOOTrainer's fixed mathematics: exact at one optimiser step per batch."""

    def convert(value: Any, get: Lookup) -> Mapped:
        updates = updates_per_batch(get, world_size)
        if updates == 1:
            return Mapped(
                TRAINER,
                note="leave-one-out baseline; one update a batch: the "
                "sequence ratio is 1, the loss's gradient −A_i·Σ_t ∇log π_θ / B "
                "is GSPO's with seq_mean_token_sum",
            )
        return Mapped(
            TRAINER,
            "approximate",
            f"{updates} updates a batch: TRL clips the "
            "product of the token ratios, rlmap's GSPO their geometric mean",
        )

    return convert


def _beta(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"kl.placement": "none", "kl.beta": 0.0}, note="no reference model")
    return Mapped(
        {"kl.placement": "reward", "kl.estimator": "k1", "kl.beta": value, "kl.target": None},
        note="trap: on by default; R − β·Σ_t (log π_old − log π_ref) before the "
        "baseline, as rlmap's outcome estimators read it",
    )


def _clip_high(value: Any, get: Lookup) -> Mapped:
    return Mapped(
        {"behaviour.clip_high": get("epsilon") if value is None else value}, note="None: epsilon"
    )


def _vllm(value: Any, get: Lookup) -> Mapped:
    return Mapped({}, note="RLOOTrainer applies no importance-sampling correction" if value else "")


def table(world_size: int = 1) -> tuple[Mapping, ...]:
    """RLOOConfig's rows, in the order they apply (a later row's fields win)."""
    return (
        Mapping(
            IMPLIED + "RLOOTrainer",
            trainer(world_size),
            "rloo",
            "trl 1.16.0 trl/trainer/rloo_trainer.py (compute_loss)",
        ),
        Mapping("trainer", read_with("--from trl: RLOOConfig"), None, "rlmap (not a TRL field)"),
        Mapping(
            "num_generations", field("sampling.group_size", "trap: 2 by default"), 2, f"{R}:302"
        ),
        *shared(world_size, R, RLOO_LINES),
        Mapping("epsilon", field("behaviour.clip_low"), 0.2, f"{R}:514"),
        Mapping("epsilon_high", _clip_high, NULL, f"{R}:518"),
        Mapping("beta", _beta, 0.05, f"{R}:503"),
        Mapping(
            "normalize_advantages",
            off(
                "advantages normalised over the generation batch (mean 0, std 1): no rlmap "
                "estimator",
                (False,),
            ),
            False,
            f"{R}:532",
        ),
        Mapping("reward_clip_range", off("rlmap does not clip rewards", (None,)), NULL, f"{R}:539"),
        Mapping("use_vllm", _vllm, False, f"{R}:409"),
    )
