"""Packing scored episodes into the batch record: one row per episode, or one per segment.

Layout of a row: ``[left-padded prompt | response, right-padded]``, where the response
is every token after the prompt — the policy's turns and the environment's
observations in order. Every prompt ends at the same column, so prompt and response
columns line up across the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlmap.core.batch import Batch, RewardStatus
from rlmap.rollout.columns import kept_columns, reward_columns, route_columns, row_rewards
from rlmap.rollout.episodes import Episode


@dataclass(frozen=True)
class Scored:
    """An episode with its reward and its group."""

    episode: Episode
    group: int
    """Index of the prompt it answers (its group)."""
    outcome: float
    """The environment's return before any shaping (what "correct" means in metrics)."""
    reward: float
    """The return trained on: outcome + shaping (e.g. DAPO soft overlong punishment)."""
    status: RewardStatus
    per_turn: tuple[float, ...] | None = None
    """Per-turn rewards summing to ``reward`` (environment step rewards, a process reward,
    the shaping on the last turn); None: ``reward`` at the last action token."""
    rank: int = 0
    """The learner rank that generated it and trains on it (:mod:`rlmap.learner.distributed`)."""


def to_batch(scored: Sequence[Scored], *, pad_token_id: int) -> Batch:
    """The batch record of a list of scored episodes (one row each, or one per segment).

    Rewards: when every turn but the last has reward 0 (outcome tasks), ``rewards`` is the
    return and ``token_rewards`` stays None (R at the last action token). Otherwise each
    turn's reward (``Scored.per_turn``, the shaping in the last one's) sits at that turn's
    last action token, in ``token_rewards``. ``turn_id`` is filled only when some episode
    has several turns. A segmented episode (``Episode.segments``) gives a row per segment,
    linked by ``episode_id`` and ``segment``: each row has its episode's ``rewards``,
    group and status, and in ``token_rewards`` only its own turns' rewards (the outcome on
    the last segment's last action token).
    """
    rows = [(s, e) for s in scored for e in s.episode.rows]
    prompt_len = max(len(e.prompt_ids) for _, e in rows)
    response_len = max(max(len(e.response_ids) for _, e in rows), 1)
    b, t = len(rows), prompt_len + response_len
    tokens = torch.full((b, t), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, t), dtype=torch.bool)
    action = torch.zeros((b, t), dtype=torch.bool)
    behaviour = torch.zeros((b, t))
    version = torch.zeros((b, t), dtype=torch.long)
    turn = torch.full((b, t), -1, dtype=torch.long)
    for i, (_, e) in enumerate(rows):
        p, r = len(e.prompt_ids), len(e.response_ids)
        response = slice(prompt_len, prompt_len + r)
        tokens[i, prompt_len - p : prompt_len] = torch.tensor(e.prompt_ids, dtype=torch.long)
        tokens[i, response] = torch.tensor(e.response_ids, dtype=torch.long)
        attention[i, prompt_len - p : prompt_len + r] = True
        action[i, response] = torch.tensor(e.action, dtype=torch.bool)
        behaviour[i, response] = torch.tensor(e.logprobs)
        version[i, response] = torch.tensor(e.versions, dtype=torch.long)
        turn[i, response] = torch.tensor(e.turn_ids, dtype=torch.long)
    multi_turn = any(s.episode.turns > 1 for s in scored)
    links = _links(scored)
    return Batch(
        tokens=tokens,
        action_mask=action,
        behavior_logprobs=behaviour,
        rewards=torch.tensor([s.reward for s, _ in rows], dtype=torch.float32),
        group_id=torch.tensor([s.group for s, _ in rows], dtype=torch.long),
        end=torch.tensor([int(e.end) for _, e in rows], dtype=torch.long),
        reward_status=torch.tensor([int(s.status) for s, _ in rows], dtype=torch.long),
        attention_mask=attention,
        eos=torch.tensor([e.eos for _, e in rows]),
        turn_id=turn if multi_turn else None,
        token_rewards=(
            _rewards(scored, action, turn) if links or _has_step_rewards(scored) else None
        ),
        policy_version=version,
        routed_experts=route_columns(
            [e.routes for _, e in rows], [len(e.prompt_ids) for _, e in rows], prompt_len, t
        ),
        sampling_set=kept_columns([e.kept for _, e in rows], prompt_len, t),
        episode_id=None if links is None else links[0],
        segment=None if links is None else links[1],
    )


def _links(scored: Sequence[Scored]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each row's episode (its index in ``scored``) and segment; None when none was cut."""
    if not any(s.episode.segments for s in scored):
        return None
    rows = [(n, k) for n, s in enumerate(scored) for k in range(len(s.episode.rows))]
    return torch.tensor([n for n, _ in rows]), torch.tensor([k for _, k in rows])


def _rewards(scored: Sequence[Scored], action: torch.Tensor, turn: torch.Tensor) -> torch.Tensor:
    """(B, T): every row's rewards (:func:`rlmap.rollout.columns.row_rewards`) in place."""
    turns = [[e.turns for e in s.episode.rows] for s in scored]
    per_row = [
        x for s, n in zip(scored, turns, strict=True) for x in row_rewards(s.reward, s.per_turn, n)
    ]
    return reward_columns(per_row, action, turn)


def _has_step_rewards(scored: Sequence[Scored]) -> bool:
    return any(s.per_turn is not None and any(r != 0 for r in s.per_turn[:-1]) for s in scored)
