"""From sampled completions to the padded batch record, and scoring them.

Layout of a row: ``[left-padded prompt | response, right-padded]``; every prompt
ends at the same column, so prompt and response columns line up across the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rlmap.core.batch import Batch, End, RewardStatus
from rlmap.system.engine import Completion


@dataclass(frozen=True)
class Scored:
    """A completion with its verdict."""

    completion: Completion
    group: int
    """Index of the prompt it answers (its group)."""
    outcome: float
    """The verifier's reward before any shaping (what "correct" means in metrics)."""
    reward: float
    """The reward trained on: outcome + shaping (e.g. DAPO soft overlong punishment)."""
    status: RewardStatus


def score_completion(
    verify: Callable[[str, str], float], response: str, reference: str
) -> tuple[float, RewardStatus]:
    """The verifier's reward, isolating failures: a crash is an infra error, not a zero."""
    try:
        return float(verify(response, reference)), RewardStatus.OK
    except Exception:  # any verifier failure is infrastructure, counted apart
        return 0.0, RewardStatus.INFRA_ERROR


def to_batch(scored: Sequence[Scored], *, pad_token_id: int) -> Batch:
    """The batch record of a list of scored completions (one row each)."""
    prompt_len = max(len(s.completion.prompt_ids) for s in scored)
    response_len = max(max(len(s.completion.response_ids) for s in scored), 1)
    b, t = len(scored), prompt_len + response_len
    tokens = torch.full((b, t), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, t), dtype=torch.bool)
    action = torch.zeros((b, t), dtype=torch.bool)
    behaviour = torch.zeros((b, t))
    version = torch.zeros((b, t), dtype=torch.long)
    for i, s in enumerate(scored):
        c = s.completion
        p, r = len(c.prompt_ids), len(c.response_ids)
        tokens[i, prompt_len - p : prompt_len] = torch.tensor(c.prompt_ids, dtype=torch.long)
        tokens[i, prompt_len : prompt_len + r] = torch.tensor(c.response_ids, dtype=torch.long)
        attention[i, prompt_len - p : prompt_len + r] = True
        action[i, prompt_len : prompt_len + r] = True
        behaviour[i, prompt_len : prompt_len + r] = torch.tensor(c.logprobs)
        version[i, prompt_len : prompt_len + r] = c.version
    eos = torch.tensor([s.completion.eos for s in scored])
    return Batch(
        tokens=tokens,
        action_mask=action,
        behavior_logprobs=behaviour,
        rewards=torch.tensor([s.reward for s in scored], dtype=torch.float32),
        group_id=torch.tensor([s.group for s in scored], dtype=torch.long),
        end=torch.where(eos, int(End.TERMINAL), int(End.TRUNCATED)),
        reward_status=torch.tensor([int(s.status) for s in scored], dtype=torch.long),
        attention_mask=attention,
        eos=eos,
        policy_version=version,
    )
