"""Recipe presets: each a full composition, with its paper and quoted hyper-parameters.

A preset is data: a function that returns a :class:`RecipeConfig`, the paper it
comes from, and the hyper-parameters quoted from that paper. Papers train models
of billions of parameters; a preset keeps the composition and scales sizes
(G, lengths, batch, learning rate) to the embedded default. ``rlmap explain``
derives "scaled" by comparing each quoted value with the preset's own value, so
the two cannot drift apart silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rlmap.core.registry import Registry
from rlmap.correction.params import BehaviourParams, KLParams
from rlmap.estimators.params import CreditParams, CriticParams
from rlmap.feedback.params import FeedbackParams
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.sections import GenerationConfig, OptimConfig
from rlmap.recipes.system_params import SystemParams
from rlmap.reduction.params import ReductionParams
from rlmap.sampling.params import SamplingParams


@dataclass(frozen=True)
class Quote:
    """One hyper-parameter as the paper states it."""

    text: str
    """The setting in the paper's words, e.g. "KL coefficient β = 0.04"."""
    field: str | None = None
    """Dotted config field it corresponds to; None when it has no single field."""
    value: Any = None
    """The paper's value of ``field`` (compared with the preset's to report scaling)."""


@dataclass(frozen=True)
class Preset:
    """A named recipe: its builder, one-line summary and paper."""

    build: Callable[[], RecipeConfig]
    summary: str
    paper: str
    quotes: tuple[Quote, ...] = ()
    note: str = ""
    """How the preset departs from the paper beyond scaling, if at all."""


registry: Registry[Preset] = Registry("recipe")

# Sizes of the embedded default (a ~few-M-parameter model on short arithmetic answers).
_EMBEDDED_G = 8
_EMBEDDED_LEN = 16
_EMBEDDED_LR = 5e-5
# The critic starts from the policy's trunk with a fresh head whose outputs sit ~0.5 away
# from the returns; Adam moves a weight by about lr per step, so at 1e-5 it is still far
# off after 100 steps (measured: explained variance stays near -0.3). At 3e-4 it learns
# the mean return within ~10 steps and reaches EV ≈ 0.3 by the end of a ppo run.
_EMBEDDED_CRITIC_LR = 3e-4
# VAPO value pre-training: 5 steps at 3e-4 leave EV at -0.25; by 15 it is ≈ 0 (the
# early stop usually does not trigger before; it guards against wasted steps).
_EMBEDDED_VALUE_PRETRAIN = 15


def _critic_optim() -> OptimConfig:
    return OptimConfig(lr=_EMBEDDED_LR, critic_lr=_EMBEDDED_CRITIC_LR)


def _config(name: str, **sections: Any) -> RecipeConfig:
    base: dict[str, Any] = {
        "recipe": name,
        "generation": GenerationConfig(max_new_tokens=_EMBEDDED_LEN),
        "optim": OptimConfig(lr=_EMBEDDED_LR),
    }
    return RecipeConfig(**{**base, **sections})


def grpo_variant(name: str, **behaviour: Any) -> RecipeConfig:
    """GRPO's composition with a different objective (and its hyper-parameters)."""
    cfg = grpo_config()
    return cfg.model_copy(update={"recipe": name, "behaviour": replace(cfg.behaviour, **behaviour)})


def dro_config() -> RecipeConfig:
    """grpo with the DRO objective on the mean-baseline (std-free) advantage, as Kimi k1.5's
    derivation gives it (Â = R − mean_g R: ``dr_grpo``)."""
    cfg = grpo_variant("dro", objective="dro", dro_beta=0.05)
    return cfg.model_copy(update={"credit": replace(cfg.credit, estimator="dr_grpo")})


def grpo_config() -> RecipeConfig:
    return _config(
        "grpo",
        sampling=SamplingParams(group_size=_EMBEDDED_G),
        credit=CreditParams(estimator="grpo"),
        behaviour=BehaviourParams(objective="ppo_clip", clip_low=0.2, clip_high=0.2),
        kl=KLParams(placement="loss", estimator="k3", beta=0.04),
        reduction=ReductionParams(name="response_mean"),
    )


def dr_grpo_config() -> RecipeConfig:
    cfg = grpo_config()
    return cfg.model_copy(
        update={
            "recipe": "dr-grpo",
            "credit": replace(cfg.credit, estimator="dr_grpo"),
            "reduction": ReductionParams(name="fixed_budget", max_len=_EMBEDDED_LEN),
        }
    )


def on_policy_config(name: str, estimator: str) -> RecipeConfig:
    return _config(
        name,
        sampling=SamplingParams(group_size=_EMBEDDED_G),
        credit=CreditParams(estimator=estimator),
        behaviour=BehaviourParams(objective="pg"),
        reduction=ReductionParams(name="response_mean"),
    )


def dapo_config() -> RecipeConfig:
    return _config(
        "dapo",
        feedback=FeedbackParams(overlong_cache=4),
        sampling=SamplingParams(group_size=_EMBEDDED_G, filter="mixed", max_rounds=4),
        credit=CreditParams(estimator="grpo"),
        behaviour=BehaviourParams(objective="ppo_clip", clip_low=0.2, clip_high=0.28),
        reduction=ReductionParams(name="token_mean"),
    )


VAPO_ALPHA = 0.05 * 20480 / 16
"""VAPO's α = 0.05 scaled by the length limits (20,480 tokens in the paper, 16 on the embedded
default): α·l at the length limit is the paper's (1,024), and λ_policy = 1 − 1/(α·l) ≥ 0.98
for every embedded length, never the clamp. Unscaled, 0.05 · l < 1 for every embedded
response, so λ_policy = 1 − 1/(α·l) < 0 was clamped to 0 — pure TD(0), unlike the paper."""


def vapo_config() -> RecipeConfig:
    return _config(
        "vapo",
        sampling=SamplingParams(group_size=_EMBEDDED_G),
        credit=CreditParams(
            estimator="gae", gamma=1.0, lam_critic=1.0, adaptive_alpha=VAPO_ALPHA, time_unit="token"
        ),
        critic=CriticParams(enabled=True, pretrain_mc=True, warmup_steps=_EMBEDDED_VALUE_PRETRAIN),
        behaviour=BehaviourParams(
            objective="ppo_clip", clip_low=0.2, clip_high=0.28, positive_nll=0.1
        ),
        reduction=ReductionParams(name="token_mean"),
        optim=_critic_optim(),
    )


def critic_ppo_config(name: str, **sections: Any) -> RecipeConfig:
    return _config(
        name,
        sampling=SamplingParams(group_size=1, prompts_per_step=64),
        credit=CreditParams(estimator="gae", gamma=1.0, lam=0.95),
        critic=CriticParams(enabled=True),
        behaviour=BehaviourParams(objective="ppo_clip", clip_low=0.2, clip_high=0.2),
        reduction=ReductionParams(name="token_mean"),
        optim=_critic_optim(),
        **sections,
    )


def sao_config() -> RecipeConfig:
    return _config(
        "sao",
        sampling=SamplingParams(group_size=1, prompts_per_step=64),
        credit=CreditParams(
            estimator="gae",
            gamma=1.0,
            lam_critic=1.0,
            adaptive_alpha=1.5,
            length_unit="token",
            time_unit="token",
        ),
        critic=CriticParams(enabled=True, updates_per_step=2, warmup_steps=5),
        behaviour=BehaviourParams(
            objective="direct_gate",
            mode="bypass",
            gate_low=0.3,
            gate_high=5.0,
            corrections=("staleness",),
        ),
        reduction=ReductionParams(name="token_mean"),
        system=SystemParams(mode="async"),
        optim=_critic_optim(),
    )
