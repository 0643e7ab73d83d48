"""The batch record: everything between rollout and loss, as one padded record.

Shapes: ``B`` trajectories, ``T`` token positions (prompt + response +
observations, right-padded). Per-token fields are ``(B, T)``; per-trajectory
fields are ``(B,)``. A component reads the fields it needs and ignores the rest;
optional fields are ``None`` when the run does not produce them.

Three different events end things and are recorded separately:

- a token EOS (``eos``): the policy chose to stop its last assistant turn;
- the end of an assistant turn (``turn_id`` changes, observation tokens follow);
- the end of the episode (``end``): terminal, truncated (a final state exists to
  bootstrap from: length limit, turn budget) or aborted (no usable final state;
  the trajectory is excluded from training and counted).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, overload

import torch
from torch import Tensor


class End(IntEnum):
    """How a trajectory (episode) ended."""

    TERMINAL = 0
    """EOS that ends the episode, or an environment terminal: no bootstrap, trace stops."""
    TRUNCATED = 1
    """Length limit or turn budget with a final state: bootstrap from V(s_final), trace stops."""
    ABORTED = 2
    """No usable final state (crash, lost worker): excluded from training and counted."""


class RewardStatus(IntEnum):
    """Whether the reward of a trajectory can be trusted; anything but OK is excluded."""

    OK = 0
    INVALID = 1
    """The verifier could not parse or judge the response format it was promised."""
    INFRA_ERROR = 2
    """The reward infrastructure failed (sandbox crash, RM server down): not a zero reward."""
    TIMEOUT = 3


@overload
def trains(status: RewardStatus | int, end: End | int) -> bool: ...
@overload
def trains(status: Tensor, end: Tensor) -> Tensor: ...
def trains(status: Any, end: Any) -> Any:
    """The one validity rule: a trajectory trains when its reward can be trusted
    (``RewardStatus.OK``) and it was not aborted; one trajectory's (bool) or a batch's
    ((B,) bool tensors in, (B,) bool out). Everything else is excluded, and still counted."""
    return (status == RewardStatus.OK) & (end != End.ABORTED)


def cross(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` on ``device``: how a micro-batch crosses from the host to the learner's
    device. Host to GPU, the copy is staged in page-locked memory and does not block the
    host (``non_blocking``): the kernels that read it are queued after it on the same
    stream, and PyTorch's pinned-memory cache keeps the staging buffer until the copy is
    done. Anything else is a plain ``.to`` (none at all when ``tensor`` is already there).
    """
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


_TRAILING = {"routed_experts": ("L", "K"), "sampling_set": ("K",)}
"""Per-token fields with dimensions after (B, T), and their names."""


@dataclass(frozen=True)
class Batch:
    """A padded batch of trajectories (see module docstring for shapes)."""

    tokens: Tensor
    """(B, T) long: prompt + response (+ observation) token ids, right-padded."""
    action_mask: Tensor
    """(B, T) bool: True where the policy produced the token and it is trained on."""
    behavior_logprobs: Tensor
    """(B, T) float: log μ_old of each action token, as the rollout engine reported when it
    sampled (never recomputed later under this name); 0 off the action mask."""
    rewards: Tensor
    """(B,) float: the outcome reward R_i of each trajectory."""
    group_id: Tensor
    """(B,) long: trajectories sampled from the same prompt share a group id."""
    end: Tensor
    """(B,) long: an :class:`End` per trajectory."""
    reward_status: Tensor
    """(B,) long: a :class:`RewardStatus` per trajectory."""
    attention_mask: Tensor | None = None
    """(B, T) bool: True on real tokens (prompt, action, observation); None means all real."""
    eos: Tensor | None = None
    """(B,) bool: the last assistant turn ended with a stop token — EOS, or a tool call's end
    marker before a turn-budget truncation — and not by the length limit."""
    turn_id: Tensor | None = None
    """(B, T) long: index of the assistant turn of each action token, -1 off the action mask;
    None means one turn per trajectory."""
    turn_group: Tensor | None = None
    """(B, T) long: the anchor state of each action token's turn, -1 off the action mask:
    turns of one group that share an id are in the same state, and the group estimators
    take a second baseline over them (GiGPO, docs/formulas.md §2.4). Set by
    ``sampling.group_scope=turn`` (:func:`rlmap.estimators.adapters.turn_groups`); None
    means groups are per prompt (``group_id``) only."""
    token_rewards: Tensor | None = None
    """(B, T) float: per-step rewards r_t on action tokens (process reward, per-turn rewards at a
    turn's last token, KL in the reward). None means R_i at the last action token."""
    policy_version: Tensor | None = None
    """(B, T) long: weight version that produced each action token (may vary under partial
    rollout)."""
    old_logprobs: Tensor | None = None
    """(B, T) float: log π_old from the trainer's own forward pass (decoupled mode only)."""
    ref_logprobs: Tensor | None = None
    """(B, T) float: log π_ref of each token, when a KL term is active."""
    values: Tensor | None = None
    """(B, T) float: critic value V(s_t) of the state before each action token."""
    bootstrap_values: Tensor | None = None
    """(B,) float: V(s_final), the value of the state after the last step, used where TRUNCATED."""
    episode_id: Tensor | None = None
    """(B,) long: rows cut from one episode share an id (``data.context_policy=
    truncate_oldest``: an episode that outgrew the context continues in a new row, a
    *segment*); None means one row per episode. Ids are unique within the batch."""
    segment: Tensor | None = None
    """(B,) long: the row's index among its episode's segments (0, 1, …); set with
    ``episode_id``. A row whose episode has a segment ``segment + 1`` ends at a segment
    boundary: ``end`` TRUNCATED, bootstrapped from the next segment's first value
    (:func:`rlmap.estimators.segments.boundary_bootstrap`). The next segment is found by
    (episode, index), never by row number, so :meth:`select` keeps the link."""
    routed_experts: Tensor | None = None
    """(B, T, L, K) long: the experts the rollout engine routed each token column through, per
    MoE layer (L) and top-k slot (K); -1 where nothing was routed (padding, the last sampled
    token). Mixture-of-experts policies only (:mod:`rlmap.models.routing`)."""
    sampling_set: Tensor | None = None
    """(B, T, K) int32: the token ids the rollout engine's top-p filter kept when it sampled
    each action token (the set μ's reported log-prob is renormalised over), right-padded with
    -1; a column of -1 only means no set was recorded (observations, padding, a set larger
    than ``behaviour.sampling_set_cap``): that token is scored over the full vocabulary.
    K is the batch's largest recorded set. Dense rather than CSR ids + offsets so that
    :meth:`select` and :meth:`to` slice and move it as every other field; the cap bounds
    it. Only with ``behaviour.replay_sampling_set`` (docs/formulas.md §4.1)."""

    def __post_init__(self) -> None:
        b, t = self.tokens.shape
        for f in dataclasses.fields(self):
            x = getattr(self, f.name)
            if x is None:
                continue
            if f.name in _TRAILING:
                if x.dim() != 2 + len(_TRAILING[f.name]) or tuple(x.shape[:2]) != (b, t):
                    raise ValueError(
                        f"Batch.{f.name}: shape {tuple(x.shape)}, expected "
                        f"({b}, {t}, {', '.join(_TRAILING[f.name])})"
                    )
                continue
            per_token = x.dim() == 2
            want = (b, t) if per_token else (b,)
            if tuple(x.shape) != want:
                raise ValueError(f"Batch.{f.name}: shape {tuple(x.shape)}, expected {want}")

    @property
    def size(self) -> int:
        """B, the number of trajectories."""
        return int(self.tokens.shape[0])

    @property
    def lengths(self) -> Tensor:
        """(B,) long: |o_i|, the number of action tokens of each trajectory."""
        return self.action_mask.sum(-1)

    @property
    def valid(self) -> Tensor:
        """(B,) bool: trajectories that train (:func:`trains`, row by row)."""
        return trains(self.reward_status, self.end)

    @property
    def turns(self) -> Tensor:
        """(B, T) long: ``turn_id``, or 0 on action tokens and -1 elsewhere for one turn."""
        if self.turn_id is not None:
            return self.turn_id
        return torch.where(self.action_mask, 0, -1)

    @property
    def step_rewards(self) -> Tensor:
        """(B, T) float: ``token_rewards``, or R_i placed on the last action token."""
        if self.token_rewards is not None:
            return self.token_rewards
        return last_action_onehot(self.action_mask) * self.rewards.unsqueeze(-1)

    @property
    def total_rewards(self) -> Tensor:
        """(B,) float: the undiscounted return Σ_t r_t of each trajectory, what an outcome
        estimator's R_i is: ``rewards``, or the row sum of ``token_rewards`` where per-step
        rewards were placed (per-turn rewards sum to ``rewards`` already; the KL penalty in
        the reward, −β·Σ_t k1_t, is why the two can differ)."""
        if self.token_rewards is None:
            return self.rewards
        return self.token_rewards.sum(-1)

    def select(self, index: Tensor) -> Batch:
        """The trajectories at ``index`` (a long index or a (B,) bool mask), all fields sliced."""
        kw: dict[str, Any] = {
            f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[index])
            for f in dataclasses.fields(self)
        }
        return Batch(**kw)

    def to(self, device: torch.device | str) -> Batch:
        """Every field on ``device`` (None stays None): the crossing of one micro-batch from
        the host to the learner's device (:func:`cross`). A field already there is not
        copied."""
        device = torch.device(device)
        kw: dict[str, Any] = {
            f.name: (
                None if getattr(self, f.name) is None else cross(getattr(self, f.name), device)
            )
            for f in dataclasses.fields(self)
        }
        return Batch(**kw)

    def replace(self, **changes: Any) -> Batch:
        """A copy with some fields changed (the record itself is frozen)."""
        return dataclasses.replace(self, **changes)


def last_action_onehot(action_mask: Tensor) -> Tensor:
    """(B, T) float: 1 at the last action token of each row, 0 elsewhere (all 0 if none)."""
    t = action_mask.shape[-1]
    pos = torch.arange(t, device=action_mask.device).expand_as(action_mask)
    last = torch.where(action_mask, pos, -1).amax(-1, keepdim=True)  # (B, 1)
    return ((pos == last) & action_mask).to(torch.float32)


def make_batch(
    action_mask: Tensor,
    rewards: Tensor,
    *,
    group_id: Tensor | None = None,
    end: Tensor | None = None,
    **fields: Tensor | None,
) -> Batch:
    """A batch from the fields a formula needs, the rest filled with neutral values.

    For tests and small experiments: tokens are zeros, behaviour log-probs zeros,
    one group per trajectory, every trajectory terminal with an OK reward.
    """
    mask = action_mask.bool()
    b = mask.shape[0]
    behavior = fields.pop("behavior_logprobs", None)
    status = fields.pop("reward_status", None)
    return Batch(
        tokens=torch.zeros_like(mask, dtype=torch.long),
        action_mask=mask,
        behavior_logprobs=torch.zeros(mask.shape) if behavior is None else behavior,
        rewards=rewards.float(),
        group_id=torch.arange(b) if group_id is None else group_id,
        end=torch.full((b,), int(End.TERMINAL)) if end is None else end,
        reward_status=torch.zeros(b, dtype=torch.long) if status is None else status,
        **fields,
    )
