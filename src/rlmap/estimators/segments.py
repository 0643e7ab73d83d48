"""Credit across segment boundaries: one episode trained on as several rows.

Notation (docs/formulas.md §2.5). With ``data.context_policy=truncate_oldest`` an episode e
whose context outgrew the model goes on in a new row: its rows are segments k = 0..S_e−1
(``Batch.episode_id``, ``Batch.segment``), each with its own context (the prompt and the
newest whole turns). The environment is not reset between them, so the end of segment k is
a **truncation with a final observation**, never a terminal; the state that follows it is
segment k+1's first one, s_0^{k+1}, as the policy sees it there.

Token-level estimators (GAE, V-trace), at the boundary b = 1, c = 0 (§2.1's truncation):

    V(s_final^k) := V(s_0^{k+1})        the critic's value at segment k+1's first action token

the trace stops there, and each reward stays on the row that earned it (the outcome on the
last segment). Telescoping makes it exact: with λ = 0 the segmented advantages are the
unsegmented ones; with λ > 0 they are the unsegmented ones with the trace cut at the boundary.

Outcome estimators (grpo, rloo, dr_grpo, reinforce, reinforce_pp_baseline) see one return per
episode, R_e = Σ_k Σ_t r_t^k, on every segment; their statistics (means, stds, counts) run
over episodes — one value each, so an episode of many segments weighs what one of a single
segment does — and every segment of e gets e's advantage. REINFORCE++'s token return runs
on through the later segments: G at segment k's last action token is r + γ·G_0^{k+1}.

State sufficiency (critic recipes): the bootstrap assumes the next segment's context still
determines the state. Its measure is the gap gap^k = V(s_0^{k+1}) − V̂(s_final^k) between
the critic's value of the state after the boundary read with the next context and read
with the closing one (:func:`boundary_value_gaps`), logged as ``critic/segment_value_gap``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from rlmap.core.ops import masked_mean
from rlmap.estimators.group import group_index
from rlmap.estimators.reinforce import discounted_returns


def next_segment_rows(episode_id_B: Tensor, segment_B: Tensor) -> Tensor:
    """(B,) long: the row that holds the same episode's next segment (``segment + 1``), −1
    where there is none (the episode's last segment, or an unsegmented row)."""
    follows_BB = (episode_id_B[:, None] == episode_id_B[None, :]) & (
        segment_B[None, :] == segment_B[:, None] + 1
    )
    return torch.where(follows_BB.any(1), follows_BB.long().argmax(1), -1)


def first_action_values(x_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """(B,): ``x`` at each row's first masked column (0 for a row without one)."""
    first_B = mask_BT.long().argmax(1)  # the first True, or 0 when none
    return torch.where(mask_BT.any(1), x_BT.gather(1, first_B[:, None]).squeeze(1), 0.0)


def boundary_bootstrap(
    values_BT: Tensor,
    action_mask_BT: Tensor,
    episode_id_B: Tensor,
    segment_B: Tensor,
    bootstrap_B: Tensor,
) -> tuple[Tensor, Tensor]:
    """The segment boundary rule: (V(s_final)_B, boundary_B).

    A row followed by its episode's next segment (``boundary_B``) bootstraps from
    V(s_0^{k+1}), the next row's value at its first action token; every other row keeps
    ``bootstrap_B`` (the critic's value after its last step, used where it is TRUNCATED).
    Such a row must be treated as truncated (b = 1, c = 0). (B, T), (B,) in; (B,) out.
    """
    next_B = next_segment_rows(episode_id_B, segment_B)
    boundary_B = next_B >= 0
    start_B = first_action_values(values_BT, action_mask_BT)  # V(s_0) of each row
    return torch.where(boundary_B, start_B[next_B.clamp(min=0)], bootstrap_B), boundary_B


def boundary_value_gaps(
    values_BT: Tensor,
    action_mask_BT: Tensor,
    episode_id_B: Tensor,
    segment_B: Tensor,
    final_B: Tensor,
) -> tuple[Tensor, Tensor]:
    """The state-sufficiency gap at each segment boundary: (gap_B, boundary_B).

        gap^k = V(s_0^{k+1}) − V̂(s_final^k)

    V̂(s_final^k) is ``final_B``, the critic's value at the closing row's last real token
    (``Batch.bootstrap_values``): the state the row ends in — after its final observation
    (``truncate_oldest``) or after the summary it ends with (``compact``) — read with the
    closing segment's context. V(s_0^{k+1}) is the critic's value of the same state with
    the next segment's context, the value :func:`boundary_bootstrap` puts in its place — so
    the gap is exactly what the boundary rule changes in δ_last^k (by γ·gap). A critic that
    reads the state alone gives 0; what the next context dropped and the critic had learned
    to value shows as |gap| > 0. 0 on rows that close no boundary. (B, T), (B,) in; (B,) out.

    Not the value at the closing row's last *action* token: that state precedes the last
    step's reward and observation, so its difference from V(s_0^{k+1}) is a TD error,
    non-zero for a perfect critic of a sufficient context.
    """
    kept_B, boundary_B = boundary_bootstrap(
        values_BT, action_mask_BT, episode_id_B, segment_B, final_B
    )
    return kept_B - final_B, boundary_B


def segment_value_gap(gap_B: Tensor, counted_B: Tensor) -> dict[str, Tensor]:
    """``critic/segment_value_gap``, the mean |gap| over the boundaries ``counted_B`` (bool,
    (B,); :func:`boundary_value_gaps`), and ``critic/segment_value_gap_signed``, the mean gap
    (below 0: the next segment's context looks worse to the critic). Detached scalars, 0 when
    nothing is counted."""
    gap_B = gap_B.detach()
    return {
        "critic/segment_value_gap": masked_mean(gap_B.abs(), counted_B),
        "critic/segment_value_gap_signed": masked_mean(gap_B, counted_B),
    }


class EpisodeView(NamedTuple):
    """Rows seen as episodes, for statistics that take one value per episode; all (B,)."""

    returns_B: Tensor
    """R_e: the sum of the row returns of the row's episode, on each of its rows."""
    counted_B: Tensor
    """bool: the one row that stands for its episode in a statistic (its first row in the
    batch), where every row of the episode is valid; False elsewhere."""
    first_B: Tensor
    """long: the index of that row, for each row of the episode (``x_B[first_B]`` spreads a
    per-episode value, computed on the counted rows, to all of them)."""


def episode_view(returns_B: Tensor, valid_B: Tensor, episode_id_B: Tensor) -> EpisodeView:
    """The per-episode view of row returns ``returns_B`` (each row's Σ_t r_t), valid rows
    ``valid_B`` and ``episode_id_B`` (B,). An episode counts when all its rows are valid."""
    index_B, n = group_index(episode_id_B)
    rows_B = torch.arange(len(episode_id_B), device=episode_id_B.device)
    first_E = rows_B.new_full((n,), len(rows_B)).scatter_reduce(0, index_B, rows_B, "amin")
    total_E = returns_B.new_zeros(n).index_add_(0, index_B, torch.where(valid_B, returns_B, 0.0))
    valid_E = rows_B.new_ones(n).scatter_reduce(0, index_B, valid_B.long(), "amin").bool()
    first_B = first_E[index_B]
    return EpisodeView(total_E[index_B], (rows_B == first_B) & valid_E[index_B], first_B)


def continued_returns(
    rewards_BT: Tensor, mask_BT: Tensor, next_B: Tensor, *, gamma: float, segments: int
) -> Tensor:
    """G_t = Σ_{s≥t} γ^{s−t} r_s over the action steps of the row *and of its episode's later
    segments* (``next_B``: :func:`next_segment_rows`); (B, T), 0 off the mask.

    Each pass settles one more segment from the end (the last is right after the first
    pass), so ``segments``, the most segments any episode has, passes are exact.
    """
    tail_B = rewards_BT.new_zeros(rewards_BT.shape[0])
    returns_BT = discounted_returns(rewards_BT, mask_BT, gamma=gamma, tail_B=tail_B)
    for _ in range(segments - 1):
        start_B = first_action_values(returns_BT, mask_BT)  # G_0 of each row
        tail_B = torch.where(next_B >= 0, start_B[next_B.clamp(min=0)], 0.0)
        returns_BT = discounted_returns(rewards_BT, mask_BT, gamma=gamma, tail_B=tail_B)
    return returns_BT
