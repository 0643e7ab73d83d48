"""Registry entries: thin adapters from (Batch, CreditParams) to the pure math functions.

Each adapter reads the batch fields its formula needs, excludes invalid rows through
one mask (action tokens of valid rows), calls the pure function and packs a
:class:`Credit`. Nothing else branches on an estimator's name.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor

from rlmap.core.batch import Batch, End
from rlmap.core.errors import ConfigError
from rlmap.core.registry import Registry
from rlmap.estimators.critic import explained_variance, value_errors
from rlmap.estimators.gae import adaptive_lambda, gae, turn_gae
from rlmap.estimators.gigpo import Baseline, anchor_diagnostics, anchor_ids, gigpo_advantages
from rlmap.estimators.group import (
    dr_grpo_advantages,
    group_diagnostics,
    grpo_advantages,
    rloo_advantages,
)
from rlmap.estimators.params import CreditParams
from rlmap.estimators.record import Credit, Estimator
from rlmap.estimators.reinforce import (
    reinforce_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
)
from rlmap.estimators.segments import (
    EpisodeView,
    boundary_bootstrap,
    boundary_value_gaps,
    continued_returns,
    episode_view,
    next_segment_rows,
    segment_value_gap,
)
from rlmap.estimators.stats import advantage_diagnostics, broadcast_to_tokens, whiten
from rlmap.estimators.turns import TurnIndex
from rlmap.estimators.vtrace import turn_vtrace, vtrace


def train_mask(batch: Batch) -> Tensor:
    """(B, T) bool: action tokens of valid rows, the only entries any estimator reads."""
    return batch.action_mask & batch.valid.unsqueeze(-1)


def episodes(batch: Batch) -> EpisodeView:
    """The batch's rows as episodes, what an outcome estimator's statistics run over: one
    row per episode, its return R_e (docs/formulas.md §2.5). Unsegmented, every valid row
    is its own episode and R_e its ``total_rewards``."""
    if batch.episode_id is None:
        rows_B = torch.arange(batch.size, device=batch.rewards.device)
        return EpisodeView(batch.total_rewards, batch.valid, rows_B)
    return episode_view(batch.total_rewards, batch.valid, batch.episode_id)


def _token_credit(batch: Batch, adv_BT: Tensor, *, group: bool) -> Credit:
    mask_BT = train_mask(batch)
    diagnostics = advantage_diagnostics(adv_BT, mask_BT)
    if group:
        view = episodes(batch)
        diagnostics |= group_diagnostics(
            batch.rewards, batch.group_id, view.counted_B, view.returns_B
        )
    return Credit(advantages=adv_BT.detach(), returns=None, diagnostics=diagnostics)


def _outcome_credit(batch: Batch, adv_B: Tensor, *, group: bool) -> Credit:
    """Per-episode advantages (on each episode's counted row) spread to all its rows' tokens."""
    adv_B = torch.where(batch.valid, adv_B[episodes(batch).first_B], 0.0)
    return _token_credit(batch, broadcast_to_tokens(adv_B, train_mask(batch)), group=group)


def _reinforce(batch: Batch, p: CreditParams) -> Credit:
    view = episodes(batch)
    return _outcome_credit(batch, reinforce_advantages(view.returns_B, view.counted_B), group=False)


def turn_groups(batch: Batch) -> Tensor:
    """(B, T) long: the anchor state of each valid action token's turn (−1 elsewhere), for
    ``Batch.turn_group``: what ``sampling.group_scope=turn`` adds to the batch. The key is
    the observation history, i.e. the real tokens before the turn that are not actions
    (:func:`rlmap.estimators.gigpo.anchor_ids`)."""
    index = TurnIndex.build(batch.turns, train_mask(batch))
    real_BT = (
        torch.ones_like(batch.action_mask)
        if batch.attention_mask is None
        else (batch.attention_mask)
    )
    ids_BK = anchor_ids(batch.tokens, real_BT & ~batch.action_mask, index, batch.group_id)
    return torch.where(index.token_mask_BT, ids_BK.gather(1, index.slot_BT), -1)


def _group_credit(batch: Batch, p: CreditParams, baseline: Baseline) -> Credit:
    """A group estimator's credit: its baseline over each prompt's group, and with turn
    groups in the batch (``sampling.group_scope=turn``) GiGPO's second one over them."""
    if batch.turn_group is None:
        view = episodes(batch)
        adv_B = baseline(view.returns_B, batch.group_id, view.counted_B)
        return _outcome_credit(batch, adv_B, group=True)
    if batch.episode_id is not None:  # refused by the config; a segment's turns lack history
        raise ConfigError("sampling.group_scope: turn does not take segmented episodes")
    index = TurnIndex.build(batch.turns, train_mask(batch))
    k = max(int(batch.turns.max()) + 1, 1)  # turn slots in use: the (B, K) matrix's width
    mask_BK = index.mask_BK[:, :k]
    anchor_BK = torch.where(mask_BK, batch.turn_group.gather(1, index.first_BK[:, :k]), -1)
    rewards_BK = index.sum(batch.step_rewards)[:, :k]
    parts = gigpo_advantages(
        rewards_BK,
        mask_BK,
        batch.group_id,
        batch.valid,
        anchor_BK,
        baseline=baseline,
        omega=p.step_advantage_weight,
        gamma=p.gamma,
    )
    credit = _token_credit(batch, index.broadcast(parts.advantages), group=True)
    credit.diagnostics.update(anchor_diagnostics(parts.returns, mask_BK, batch.group_id, anchor_BK))
    return credit


def _rloo(batch: Batch, p: CreditParams) -> Credit:
    return _group_credit(batch, p, rloo_advantages)


def _grpo(batch: Batch, p: CreditParams) -> Credit:
    return _group_credit(batch, p, partial(grpo_advantages, eps=p.std_eps))


def _dr_grpo(batch: Batch, p: CreditParams) -> Credit:
    return _group_credit(batch, p, dr_grpo_advantages)


def _reinforce_pp(batch: Batch, p: CreditParams) -> Credit:
    mask_BT = train_mask(batch)
    if batch.episode_id is None or batch.segment is None:
        adv_BT = reinforce_pp_advantages(batch.step_rewards, mask_BT, gamma=p.gamma, eps=p.std_eps)
    else:  # the return runs on through the episode's later segments (§2.5)
        next_B = next_segment_rows(batch.episode_id, batch.segment)
        returns_BT = continued_returns(
            batch.step_rewards,
            mask_BT,
            next_B,
            gamma=p.gamma,
            segments=int(batch.segment.max()) + 1,
        )
        adv_BT = whiten(returns_BT, mask_BT, eps=p.std_eps)
    return _token_credit(batch, adv_BT, group=False)


def _reinforce_pp_baseline(batch: Batch, p: CreditParams) -> Credit:
    view = episodes(batch)
    adv_BT = reinforce_pp_baseline_advantages(
        view.returns_B,
        batch.group_id,
        view.counted_B,
        train_mask(batch),
        eps=p.std_eps,
        rows_B=view.first_B,
    )
    return _token_credit(batch, adv_BT, group=True)


def _require_values(batch: Batch, name: str) -> Tensor:
    if batch.values is None:
        raise ConfigError(
            f"critic.enabled: estimator '{name}' needs critic values, but batch.values is None "
            "(turn the critic on, or pick a critic-free estimator)"
        )
    return batch.values


def _episode_ends(batch: Batch, values_BT: Tensor, name: str) -> tuple[Tensor, Tensor]:
    """(truncated_B, bootstrap_B): which valid rows bootstrap, and V(s_final) (0 if absent).
    A segment boundary bootstraps from the next segment's first value (§2.5)."""
    truncated_B = (batch.end == End.TRUNCATED) & batch.valid
    bootstrap_B = batch.bootstrap_values
    boundary_B = torch.zeros_like(truncated_B)
    if bootstrap_B is None:
        bootstrap_B = torch.zeros_like(batch.rewards)
    if batch.episode_id is not None and batch.segment is not None:
        bootstrap_B, boundary_B = boundary_bootstrap(
            values_BT, batch.action_mask, batch.episode_id, batch.segment, bootstrap_B
        )
        truncated_B = truncated_B | (boundary_B & batch.valid)
    if batch.bootstrap_values is None and bool((truncated_B & ~boundary_B).any()):
        raise ConfigError(
            f"critic.enabled: estimator '{name}' needs V(s_final) of truncated trajectories, "
            "but batch.bootstrap_values is None"
        )
    return truncated_B, bootstrap_B


def _policy_lambda(batch: Batch, p: CreditParams) -> float | Tensor:
    """λ_policy: the constant one, or 1 − 1/(α·l) with l in ``p.resolved_length_unit``."""
    if p.adaptive_alpha is None:
        return p.resolved_lam_policy
    mask_BT = train_mask(batch)
    if p.resolved_length_unit == "token":
        lengths_B = mask_BT.sum(-1)
    else:
        lengths_B = TurnIndex.build(batch.turns, mask_BT).counts_B
    return adaptive_lambda(lengths_B, alpha=p.adaptive_alpha)


def _critic_credit(batch: Batch, adv_BT: Tensor, returns_BT: Tensor, values_BT: Tensor) -> Credit:
    mask_BT = train_mask(batch)
    diagnostics = advantage_diagnostics(adv_BT, mask_BT)
    diagnostics["critic/explained_variance"] = explained_variance(values_BT, returns_BT, mask_BT)
    diagnostics |= value_errors(values_BT, returns_BT, mask_BT)
    diagnostics |= _segment_gap(batch, values_BT)
    return Credit(advantages=adv_BT.detach(), returns=returns_BT.detach(), diagnostics=diagnostics)


def _segment_gap(batch: Batch, values_BT: Tensor) -> dict[str, Tensor]:
    """The state-sufficiency gap (docs/formulas.md §2.5) over the boundaries that close a
    valid row — where the boundary rule bootstraps; nothing when the batch has none."""
    if batch.episode_id is None or batch.segment is None or batch.bootstrap_values is None:
        return {}
    gap_B, boundary_B = boundary_value_gaps(
        values_BT, batch.action_mask, batch.episode_id, batch.segment, batch.bootstrap_values
    )
    counted_B = boundary_B & batch.valid
    return segment_value_gap(gap_B, counted_B) if bool(counted_B.any()) else {}


def _gae(batch: Batch, p: CreditParams) -> Credit:
    values_BT = _require_values(batch, "gae")
    truncated_B, bootstrap_B = _episode_ends(batch, values_BT, "gae")
    lam_policy, lam_critic = _policy_lambda(batch, p), p.resolved_lam_critic
    rewards_BT, mask_BT = batch.step_rewards, train_mask(batch)
    ends: dict[str, Any] = {"bootstrap_B": bootstrap_B, "truncated_B": truncated_B}
    lams: dict[str, Any] = {"gamma": p.gamma, "lam_policy": lam_policy, "lam_critic": lam_critic}
    if p.time_unit == "token":
        adv_BT, ret_BT = gae(rewards_BT, values_BT, mask_BT, **ends, **lams)
    else:
        adv_BT, ret_BT = turn_gae(rewards_BT, values_BT, mask_BT, batch.turns, **ends, **lams)
    return _critic_credit(batch, adv_BT, ret_BT, values_BT)


def _vtrace(batch: Batch, p: CreditParams) -> Credit:
    values_BT = _require_values(batch, "vtrace")
    truncated_B, bootstrap_B = _episode_ends(batch, values_BT, "vtrace")
    # π is the learner's policy before the update; the learner computes it for this entry
    # (``needs_policy_logprobs``). A caller without it gets π := μ: every ratio 1.
    pi_BT = batch.behavior_logprobs if batch.old_logprobs is None else batch.old_logprobs
    mu_BT, rewards_BT, mask_BT = batch.behavior_logprobs, batch.step_rewards, train_mask(batch)
    kw: dict[str, Any] = {
        "bootstrap_B": bootstrap_B,
        "truncated_B": truncated_B,
        "gamma": p.gamma,
        "rho_bar": p.rho_bar,
        "c_bar": p.c_bar,
        "rho_bar_pg": p.rho_bar_pg,
    }
    if p.time_unit == "token":
        adv_BT, vs_BT = vtrace(rewards_BT, values_BT, mask_BT, pi_BT, mu_BT, **kw)
    else:
        adv_BT, vs_BT = turn_vtrace(rewards_BT, values_BT, mask_BT, batch.turns, pi_BT, mu_BT, **kw)
    return _critic_credit(batch, adv_BT, vs_BT, values_BT)


ENTRIES: tuple[tuple[str, Estimator], ...] = (
    (
        "reinforce",
        Estimator(
            _reinforce,
            needs_group=False,
            needs_critic=False,
            summary="A_i = R_i − mean_batch R (batch baseline)",
            paper="Williams 1992, REINFORCE",
        ),
    ),
    (
        "rloo",
        Estimator(
            _rloo,
            needs_group=True,
            needs_critic=False,
            summary="A_i = R_i − (1/(G−1)) Σ_{j≠i in g} R_j (leave-one-out baseline)",
            paper="Ahmadian et al. 2024, Back to Basics (RLOO)",
            turn_scope=True,
        ),
    ),
    (
        "grpo",
        Estimator(
            _grpo,
            needs_group=True,
            needs_critic=False,
            summary="A_i = (R_i − mean_g R) / (std_g R + eps), unbiased std",
            paper="Shao et al. 2024, DeepSeekMath (GRPO)",
            turn_scope=True,
        ),
    ),
    (
        "dr_grpo",
        Estimator(
            _dr_grpo,
            needs_group=True,
            needs_critic=False,
            summary="A_i = R_i − mean_g R (no std normalisation)",
            paper="Liu et al. 2025, Understanding R1-Zero-Like Training (Dr. GRPO)",
            turn_scope=True,
        ),
    ),
    (
        "reinforce_pp",
        Estimator(
            _reinforce_pp,
            needs_group=False,
            needs_critic=False,
            summary="A_t = whiten_batch(Σ_{s≥t} γ^{s−t} r_s) over action tokens",
            paper="Hu 2025, REINFORCE++",
        ),
    ),
    (
        "reinforce_pp_baseline",
        Estimator(
            _reinforce_pp_baseline,
            needs_group=True,
            needs_critic=False,
            summary="A_i = whiten_batch(R_i − mean_g R) over action tokens",
            paper="Hu 2025, REINFORCE++ (baseline variant)",
        ),
    ),
    (
        "gae",
        Estimator(
            _gae,
            needs_group=False,
            needs_critic=True,
            summary="Â_t = δ_t + γλ c_{t+1} Â_{t+1}, δ_t = r_t + γ b_{t+1} V_{t+1} − V_t",
            paper="Schulman et al. 2016, GAE; decoupled/adaptive λ: Yue et al. 2025, VAPO",
        ),
    ),
    (
        "vtrace",
        Estimator(
            _vtrace,
            needs_group=False,
            needs_critic=True,
            summary="v_s − V_s = δ_s + γ c_s (v_{s+1} − V_{s+1}); "
            "A_s = ρ_pg (r_s + γ v_{s+1} − V_s)",
            paper="Espeholt et al. 2018, IMPALA (V-trace)",
            needs_policy_logprobs=True,
        ),
    ),
)
"""Every estimator, in registration order (the registry is built from this table)."""


def build_registry() -> Registry[Estimator]:
    """The credit axis's registry: every estimator of :data:`ENTRIES`, registered explicitly."""
    registry: Registry[Estimator] = Registry("advantage estimator")
    for name, entry in ENTRIES:
        registry.add(name, entry)
    return registry
