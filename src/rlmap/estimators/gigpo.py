"""Group baselines over turns: GiGPO's episode + step advantages (docs/formulas.md §2.4).

Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training" (arXiv
2505.10978, Eq. 3-8); reference implementation verl-agent ``gigpo/core_gigpo.py``.

Notation: trajectory i of episode group g (the G samples of one prompt, ``group_id``)
has turns k = 0..K_i−1, one column each of the (B, K) turn matrix
(:class:`~rlmap.estimators.turns.TurnIndex`); r_{i,k} is the reward of turn k (the sum
of its action tokens' step rewards: a sparse outcome sits on the last turn);
R_i = Σ_k r_{i,k}. An anchor state h is a set of turns (i, k) of one episode group whose
observation history before the turn is token-for-token equal (:func:`anchor_ids`).

    A^E_i     = b(R_i; g)                       the group estimator's own baseline
    G_{i,k}   = Σ_{k'≥k} γ^{k'−k} r_{i,k'}      discounted per-turn return (γ per turn)
    A^S_{i,k} = b(G_{i,k}; h)                   the same baseline over the anchor group
    A_{i,k}   = A^E_i + ω · A^S_{i,k}           broadcast to turn k's action tokens

b is the estimator's group function, so one switch (``credit.estimator``) sets the
normalisation of both levels: ``grpo`` (x − mean)/(std + ε), unbiased std;
``dr_grpo`` x − mean; ``rloo`` the leave-one-out mean.

Differs from verl-agent (the three points it leaves open, decided here):

- (a) Row weighting: each *trajectory* weighs one in the episode statistics (an rlmap
  row is a trajectory). verl-agent's rows are steps, so a trajectory of K_i steps
  weighs K_i there: with one success of 3 steps and one failure of 5 steps its
  baseline is 3/8 and A^E = +0.625 / −0.375; here it is 1/2 and A^E = ±0.5 whatever
  the lengths. A long failure no longer drags the episode baseline towards itself.
- (b) A group of one: G = 1 is a configuration error (the group estimators need
  G ≥ 2, ``sampling.group_size``); a group left with one valid member gets A^E = 0,
  as today's group estimators give it (verl-agent gives A^E = R_i: mean 0, std 1). A
  step group of one gets A^S = 0, as in verl-agent.
- (c) Normalisation: the estimator's, at both levels (above); verl-agent's mode
  switch (``mean_norm`` / ``mean_std_norm``, whose defaults disagree across its
  files) maps to ``dr_grpo`` / ``grpo``. rlmap's default estimator, ``grpo``, is
  mean/std.

The anchor key is the observation history (prompt and every observation so far, the
policy's own tokens left out), not verl-agent's current observation alone: a state is
where the environment has put the agent, whatever words its calls were phrased in;
equal keys across different prompts never meet (the key holds the episode group).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from rlmap.estimators.group import group_stats
from rlmap.estimators.reinforce import discounted_returns
from rlmap.estimators.turns import TurnIndex

Baseline = Callable[[Tensor, Tensor, Tensor], Tensor]
"""A group estimator's function ``(values_N, group_id_N, valid_N) -> advantages_N``:
``grpo_advantages`` (with its ε), ``dr_grpo_advantages`` or ``rloo_advantages``."""


class TurnAdvantages(NamedTuple):
    """GiGPO's advantages and their parts; 0 wherever a turn does not exist or is invalid."""

    advantages: Tensor
    """(B, K) A_{i,k} = A^E_i + ω · A^S_{i,k}."""
    episode: Tensor
    """(B,) A^E_i, the baseline over the episode group."""
    step: Tensor
    """(B, K) A^S_{i,k}, the baseline over the anchor group."""
    returns: Tensor
    """(B, K) G_{i,k}, the discounted per-turn return."""


def anchor_ids(
    tokens_BT: Tensor, observed_BT: Tensor, index: TurnIndex, group_id_B: Tensor
) -> Tensor:
    """(B, K) long: one id per anchor state, −1 where the turn does not exist.

    The key of turn k of row i is (g_i, the tokens of row i before the turn's first action
    token where ``observed_BT`` holds): the prompt and every observation so far, padding
    and the policy's own tokens left out. Equal keys get equal ids; ids are numbered in
    order of first appearance. Built on the host with a dict (batch-scale work).
    """
    tokens = tokens_BT.cpu().numpy()
    observed = observed_BT.cpu().numpy().astype(bool)
    first = index.first_BK.cpu().numpy()
    group = group_id_B.cpu().tolist()
    ids: dict[tuple[int, bytes], int] = {}
    out = torch.full(index.mask_BK.shape, -1, dtype=torch.long)
    for i, k in index.mask_BK.nonzero().tolist():
        start = first[i, k]
        history = tokens[i, :start][observed[i, :start]]
        out[i, k] = ids.setdefault((group[i], history.tobytes()), len(ids))
    return out.to(index.mask_BK.device)


def step_groups(group_id_B: Tensor, anchor_BK: Tensor) -> Tensor:
    """(B, K) long: one id per (episode group, anchor) pair, so that an anchor never joins
    turns of two prompts even when the anchor ids come from elsewhere (an environment's
    state hash)."""
    pairs = torch.stack([group_id_B.unsqueeze(-1).expand_as(anchor_BK), anchor_BK], -1)
    return torch.unique(pairs.reshape(-1, 2), dim=0, return_inverse=True)[1].view_as(anchor_BK)


def gigpo_advantages(
    rewards_BK: Tensor,
    mask_BK: Tensor,
    group_id_B: Tensor,
    valid_B: Tensor,
    anchor_BK: Tensor,
    *,
    baseline: Baseline,
    omega: float = 1.0,
    gamma: float = 1.0,
) -> TurnAdvantages:
    """GiGPO's A_{i,k} = A^E_i + ω · A^S_{i,k} on the turn matrix (module docstring).

    ``rewards_BK`` r_{i,k}; ``mask_BK`` the turn exists; ``anchor_BK`` the anchor id of
    each turn (:func:`anchor_ids`; −1 on an existing turn makes it a group of its own).
    Invalid rows neither enter a statistic nor get an advantage. (B, K) → (B, K).
    """
    turn_BK = mask_BK & valid_B.unsqueeze(-1)
    rewards_BK = torch.where(turn_BK, rewards_BK, 0.0)
    episode_B = baseline(rewards_BK.sum(-1), group_id_B, valid_B)
    returns_BK = discounted_returns(rewards_BK, turn_BK, gamma=gamma)
    member_BK = turn_BK & (anchor_BK >= 0)
    h_BK = step_groups(group_id_B, anchor_BK)
    step_BK = baseline(returns_BK.flatten(), h_BK.flatten(), member_BK.flatten())
    step_BK = torch.where(member_BK, step_BK.view_as(returns_BK), 0.0)
    advantages_BK = torch.where(turn_BK, episode_B.unsqueeze(-1) + omega * step_BK, 0.0)
    return TurnAdvantages(advantages_BK, episode_B, step_BK, returns_BK)


def anchor_diagnostics(
    returns_BK: Tensor, mask_BK: Tensor, group_id_B: Tensor, anchor_BK: Tensor
) -> dict[str, Tensor]:
    """How much the step level has to work with, detached scalars.

    - ``group/anchor_groups``: anchor groups with at least two turns (those with a step
      baseline); each prompt's first turns form one, so it is at least the number of
      prompts with two valid samples;
    - ``group/anchor_turn_frac``: the share of turns that sit in such a group (1 when
      every episode has one turn; 1/G-ish when every later state is unique);
    - ``group/anchor_zero_adv_frac``: the share of those groups whose returns are all
      equal, so that their A^S is 0 (the step level's ``zero_adv_frac``).

    ``mask_BK``: the valid turns; ``anchor_BK`` ≥ 0 on them.
    """
    member = (mask_BK & (anchor_BK >= 0)).flatten()
    h = step_groups(group_id_B, anchor_BK).flatten()
    stats = group_stats(returns_BK.detach().flatten(), h, member)
    shared = member & (stats.n_valid >= 2)
    n_groups = torch.unique(h[shared]).numel()
    n_equal = torch.unique(h[shared & (stats.std == 0)]).numel()
    one = returns_BK.new_ones(())
    return {
        "group/anchor_groups": one * n_groups,
        "group/anchor_turn_frac": shared.sum() / member.sum().clamp(min=1) * one,
        "group/anchor_zero_adv_frac": one * n_equal / max(n_groups, 1),
    }
