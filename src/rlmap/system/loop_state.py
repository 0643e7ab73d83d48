"""Where a training loop is between steps, and the rules that move it there.

:class:`LoopState` is what a checkpoint restores besides weights and RNG. After a step,
Ziegler et al.'s controller moves the KL coefficient (:func:`adapt_kl`) and the critic's
warm-up counts its progress (:func:`warmup_progress`); both loops
(:mod:`rlmap.system.sync`, :mod:`rlmap.system.async_loop`) use them.

Critic warm-up: during the first ``critic.warmup_steps`` steps only the critic learns
(the step is logged as usual, with ``critic/pretraining = 1``). With
``critic.pretrain_mc`` (VAPO's value pre-training) its targets are Monte-Carlo
returns (λ_critic = 1 whatever the recipe's λ), and the warm-up ends early once the
critic's explained variance — measured on each step's fresh rollouts, before that
step's critic update — has not beaten its best for ``WARMUP_PATIENCE`` consecutive
steps. The policy's first update comes in the step after the warm-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from rlmap.assembly.parts import Parts
from rlmap.correction import adaptive_beta
from rlmap.sampling.curriculum import Climb
from rlmap.sampling.rebalance import Visits


@dataclass(frozen=True)
class LoopState:
    """Where the loop is: what a checkpoint must restore besides weights and RNG."""

    step: int = 0
    """Completed steps (= the rollout engine's weight version)."""
    cursor: int = 0
    """Training prompts consumed so far (the data order is a function of it)."""
    critic_warmup_done: bool = False
    """The critic's warm-up ended early (value pre-training stopped improving)."""
    critic_best_ev: float = -math.inf
    """Best explained variance seen during value pre-training."""
    critic_ev_stale: int = 0
    """Consecutive pre-training steps whose explained variance did not beat the best."""
    kl_beta: float | None = None
    """β of the KL term as the adaptive controller left it (``kl.target`` set); None: the
    configured ``kl.beta`` (fixed, or not adapted yet)."""
    climb: Climb | None = None
    """The curriculum's level and window (``sampling.curriculum``); None: not started, or
    no curriculum."""
    visits: Visits = field(default_factory=Visits)
    """What prompt rebalancing remembers (``sampling.rebalance``); empty without it."""

    @classmethod
    def saved(cls, fields: dict[str, Any]) -> LoopState:
        """The state a checkpoint holds (:func:`dataclasses.asdict` of one)."""
        climb = fields.get("climb")
        climb = None if climb is None else Climb(int(climb["level"]), tuple(climb["recent"]))
        v = fields.get("visits") or {}
        visits = Visits(
            tuple((str(t), int(n)) for t, n in v.get("uniform", ())), tuple(v.get("revisit", ()))
        )
        return cls(**(fields | {"climb": climb, "visits": visits}))


def kl_beta(p: Parts, state: LoopState) -> float:
    """The KL coefficient of this step: the adaptive controller's, else ``kl.beta``."""
    return p.cfg.kl.beta if state.kl_beta is None else state.kl_beta


def adapt_kl(p: Parts, state: LoopState, metrics: dict[str, float], samples: int) -> LoopState:
    """Ziegler et al.'s controller after a step that measured ``kl/mean`` on ``samples``
    trajectories (:func:`rlmap.correction.adaptive_beta`); unchanged without ``kl.target``,
    on a step that measured no KL (an empty batch) and on a critic-only warm-up step (the
    KL in the reward is measured there too, but the policy is not trained)."""
    k = p.cfg.kl
    if k.target is None or k.placement == "none" or "kl/mean" not in metrics:
        return state
    if metrics.get("critic/pretraining") == 1.0:  # the policy did not move: KL ≈ 0 says nothing
        return state
    beta = adaptive_beta(kl_beta(p, state), metrics["kl/mean"], k.target, samples, k.horizon)
    return replace(state, kl_beta=beta)


WARMUP_PATIENCE = 3
"""Value pre-training stops after this many consecutive steps without a better EV."""


def critic_warming_up(p: Parts, state: LoopState) -> bool:
    """This step trains only the critic (its warm-up or value pre-training)."""
    c = p.cfg.critic
    return p.critic is not None and not state.critic_warmup_done and state.step < c.warmup_steps


def warmup_progress(state: LoopState, ev: float) -> LoopState:
    """The pre-training bookkeeping after a step whose (pre-update) explained variance is ``ev``.

    Strictly greater than the best counts as improvement; NaN (all returns equal) does not.
    """
    if not math.isnan(ev) and ev > state.critic_best_ev:
        return replace(state, critic_best_ev=ev, critic_ev_stale=0)
    stale = state.critic_ev_stale + 1
    return replace(state, critic_ev_stale=stale, critic_warmup_done=stale >= WARMUP_PATIENCE)
