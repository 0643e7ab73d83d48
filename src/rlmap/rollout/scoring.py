"""Scoring episodes: the base reward (environment return, learned or process reward) plus
the configured shaping terms, through the one reward interface (:mod:`rlmap.feedback.reward`).

- **base** — ``feedback.source``: ``verifier`` or ``environment`` (the environment's
  return; the built-in tasks' environments judge the answer with ``feedback.verifier``),
  ``reward_model`` (the learned score, computed in a batch before
  and passed in), ``process_reward`` (a per-turn scorer), ``judge`` or ``comparison`` (an
  AI judge's rating, or its pairwise verdicts within each group:
  :mod:`rlmap.feedback.judge`; the trajectories carry their group in ``metadata``).
  Its value is the episode's *outcome*: what "correct" means in metrics and for the
  group filter.
- **shaping** — DAPO's soft overlong punishment (weight 1), the format reward and the
  length reward, each present only when configured; placed on the last turn.

The reward trained on is base + shaping; per-turn scores are kept when the base gives
them (environment step rewards, process rewards), with the shaping on the last turn.
A status other than OK from either part excludes the episode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from itertools import groupby

from transformers import PreTrainedTokenizerBase

from rlmap.core.batch import End, RewardStatus
from rlmap.feedback import process
from rlmap.feedback.judge import judge_reward
from rlmap.feedback.reward import Reward, Score, Trajectory, score_batch, worst
from rlmap.feedback.reward_terms import ProcessReward, compose
from rlmap.recipes.config import RecipeConfig
from rlmap.rollout.episodes import Episode
from rlmap.tasks.prompts import decode_response


@dataclass(frozen=True)
class EpisodeReturn:
    """The environment's per-turn rewards, as the trajectory's metadata carries them."""

    name: str = "environment"

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        out = []
        for t in batch:
            status = RewardStatus(t.metadata["status"])
            rewards = tuple(t.metadata["rewards"])
            if status != RewardStatus.OK:
                out.append(Score.failed(status, "the environment's reward failed"))
            elif len(rewards) != len(t.turns):
                out.append(Score.failed(RewardStatus.INFRA_ERROR, "no reward for a turn"))
            else:
                out.append(Score(sum(rewards), per_turn=rewards))
        return out


def base_reward(cfg: RecipeConfig) -> Reward:
    """The base term of ``feedback.source``."""
    if cfg.feedback.source in ("judge", "comparison"):
        return judge_reward(cfg.feedback, cfg.seed)
    name = cfg.feedback.process_reward
    if cfg.feedback.source == "process_reward" and name is not None:
        return ProcessReward(process.registry.get(name).fn, name)
    return EpisodeReturn()


def shaping_reward(cfg: RecipeConfig) -> Reward | None:
    """Σ of the configured shaping terms (:func:`rlmap.feedback.reward_terms.compose` without a
    verifier), or None when there is none."""
    f = cfg.feedback
    return compose(
        None,
        format_pattern=f.format_pattern,
        format_weight=f.format_weight,
        overlong_cache=f.overlong_cache,
        length_target=f.length_target,
        length_weight=f.length_weight,
    )


Decode = Callable[[tuple[int, ...]], str]
"""Token ids → text, as :func:`rlmap.tasks.prompts.decode_response` makes it."""


def trajectory(
    tokenizer: PreTrainedTokenizerBase,
    e: Episode,
    reference: str,
    max_length: int,
    rewards: Sequence[float] | None = None,
    *,
    decode: Decode | None = None,
    group: int | None = None,
    learned: float | None = None,
) -> Trajectory:
    """The reward interface's view of an episode: decoded turns and observations.

    ``rewards`` replaces the environment's per-turn rewards (a learned reward's score).
    ``decode`` defaults to ``decode_response`` with ``tokenizer`` (:func:`trajectories`
    passes a memo of it). ``group``: the prompt's group id, in ``metadata["group"]`` (what a
    comparison reward compares within); ``learned``: the reward model's score, in
    ``metadata["learned"]`` (what a learned comparison compares). An episode's carried
    context (``Episode.carried``: a branch row's replayed turns, :mod:`rlmap.rollout.branch`)
    is read as part of its prompt: the state its own turns answer.
    """
    text = partial(decode_response, tokenizer) if decode is None else decode
    turns: dict[int, tuple[int, ...]] = {}
    observations: list[tuple[int, ...]] = []
    start = e.carried
    for turn, run in groupby(e.turn_ids[start:]):  # runs of a turn's tokens or an observation's
        end = start + sum(1 for _ in run)
        ids = e.response_ids[start:end]
        if turn >= 0:
            turns[turn] = turns.get(turn, ()) + ids
        else:
            observations.append(ids)
        start = end
    return Trajectory(
        prompt=text(e.prompt_ids + e.response_ids[: e.carried]),
        turns=tuple(text(ids) for _, ids in sorted(turns.items())),
        observations=tuple(text(ids) for ids in observations),
        reference=reference,
        metadata={
            "rewards": tuple(e.rewards if rewards is None else rewards),
            "status": int(e.status),
            "tool_results": tuple(e.tool_results),
            **({} if group is None else {"group": group}),
            **({} if learned is None else {"learned": learned}),
        },
        length=e.action_tokens - e.summary_tokens,  # summaries have a budget of their own
        max_length=max_length,
        truncated=e.end == End.TRUNCATED,
    )


def trajectories(
    tokenizer: PreTrainedTokenizerBase,
    episodes: Sequence[Episode],
    references: Sequence[str],
    max_length: int,
    rewards: Sequence[Sequence[float] | None] | None = None,
    groups: Sequence[int] | None = None,
    learned: Sequence[float] | None = None,
) -> list[Trajectory]:
    """:func:`trajectory` of each episode (``rewards``: each one's, or None for all;
    ``groups``: each one's group id, or None; ``learned``: each one's reward-model score,
    or None), each distinct token sequence decoded once:
    the G episodes of a prompt share its ids, and often their answers; a tokenizer's
    ``decode`` costs about 7 µs a call."""
    decode: Decode = lru_cache(maxsize=None)(partial(decode_response, tokenizer))
    per_episode = [None] * len(episodes) if rewards is None else rewards
    group_of = [None] * len(episodes) if groups is None else groups
    score_of = [None] * len(episodes) if learned is None else learned
    return [
        trajectory(tokenizer, e, reference, max_length, r, decode=decode, group=g, learned=s)
        for e, reference, r, g, s in zip(
            episodes, references, per_episode, group_of, score_of, strict=True
        )
    ]


@dataclass(frozen=True)
class Verdict:
    """An episode's scores: the outcome (base), the reward trained on, per turn, status."""

    outcome: float
    reward: float
    per_turn: tuple[float, ...] | None
    status: RewardStatus


def score_episodes(
    base: Reward, shaping: Reward | None, trajectories: Sequence[Trajectory]
) -> list[Verdict]:
    """Base and shaping scores of a batch of trajectories, combined (module docstring)."""
    bases = score_batch(base, trajectories)
    extras = score_batch(shaping, trajectories) if shaping is not None else [None] * len(bases)
    out = []
    for t, b, x in zip(trajectories, bases, extras, strict=True):
        env = RewardStatus(t.metadata["status"])  # a process scorer does not see it
        status = worst([env, b.status] + ([] if x is None else [x.status]))
        extra = 0.0 if x is None else x.value
        per_turn = None
        if b.per_turn:
            per_turn = (*b.per_turn[:-1], b.per_turn[-1] + extra)
        out.append(Verdict(b.value, b.value + extra, per_turn, status))
    return out
