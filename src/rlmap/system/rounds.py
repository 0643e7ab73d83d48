"""One round of rollouts: prompts in the data order, G episodes each, every one scored.

A round runs its episodes batched on one engine (:func:`rollout_round`), then scores
them: the verifier's or environment's return, a learned reward model's score, shaping
(:mod:`rlmap.rollout.scoring`). The synchronous loop runs rounds until its batch is full
(:func:`rlmap.system.sync.collect`); an asynchronous worker runs one round per claim
(:mod:`rlmap.system.async_loop`, :mod:`rlmap.system.ray_workers`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch

from rlmap.assembly.parts import Parts
from rlmap.core.batch import RewardStatus
from rlmap.engines.engine import RolloutEngine
from rlmap.learned.reward_model import score_batch
from rlmap.learner.distributed import gather
from rlmap.learner.memory import autocast_to
from rlmap.rollout.branch import branch_groups
from rlmap.rollout.episodes import Episode, run_episodes
from rlmap.rollout.packing import Scored
from rlmap.rollout.scoring import score_episodes, trajectories
from rlmap.rollout.segments import run_context_policy
from rlmap.tasks.arithmetic import Example


def next_prompts(train: list[Example], cursor: int, n: int, seed: int) -> list[Example]:
    """Prompts ``cursor .. cursor + n`` of the seeded epoch-by-epoch shuffle of ``train``."""
    out: list[Example] = []
    while len(out) < n:
        epoch, offset = divmod(cursor + len(out), len(train))
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed + epoch))
        take = order[offset : offset + n - len(out)].tolist()
        out += [train[i] for i in take]
    return out


def rollout_round(
    p: Parts,
    examples: list[Example],
    first_group: int,
    *,
    engine: RolloutEngine | None = None,
    before_turn: Callable[[], None] | None = None,
) -> list[Scored]:
    """G episodes per prompt, each scored: base reward + shaping (:mod:`rlmap.rollout.scoring`).

    ``engine`` defaults to the run's; an asynchronous worker passes its own, and
    ``before_turn`` (partial rollout: pick up new weights between turns).
    """
    g, group_size = p.cfg.generation, p.cfg.sampling.group_size
    b = p.cfg.behaviour
    kept_sets = b.sampling_set_cap if b.replay_sampling_set else 0  # top-p replay
    run = partial(
        run_episodes,
        p.engine if engine is None else engine,
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        before_turn=before_turn,
        max_turns=p.cfg.data.turn_budget,
        kept_sets=kept_sets,
        next_context=run_context_policy(p.cfg.data, p.tokenizer),
    )
    if p.cfg.sampling.group_scope == "branch":  # G continuations of one replayed state
        turns = p.cfg.data.turn_budget
        branched = branch_groups(
            run, p.environment, examples, first_group, group_size, p.cfg.seed, turns
        )
        episodes = [row for x in branched for row in x.rows]
    else:
        episodes = run([p.environment(e) for e in examples for _ in range(group_size)])
    learned, rm_failed = None, False
    if p.reward_model is not None:
        try:
            learned = learned_rewards(p, episodes)
        except Exception:  # the reward model failed: this round's rewards cannot be trusted
            learned, rm_failed = [0.0] * len(episodes), True
    limit = g.max_new_tokens * p.cfg.data.turn_budget  # the episode's length limit, all turns
    references = [examples[k // group_size].answer for k in range(len(episodes))]
    comparing = p.cfg.feedback.source == "comparison"  # the scores are compared, not summed
    rewards = (
        None
        if learned is None or comparing
        else [(*[0.0] * (len(e.rewards) - 1), r) for e, r in zip(episodes, learned, strict=True)]
    )
    groups = [first_group + k // group_size for k in range(len(episodes))]
    seen = trajectories(
        p.tokenizer, episodes, references, limit, rewards, groups, learned if comparing else None
    )
    verdicts = score_episodes(p.base_reward, p.shaping, seen)
    if rm_failed:
        verdicts = [replace(v, status=RewardStatus.INFRA_ERROR) for v in verdicts]
    return [
        Scored(e, first_group + k // group_size, v.outcome, v.reward, v.status, v.per_turn)
        for k, (e, v) in enumerate(zip(episodes, verdicts, strict=True))
    ]


def shared_round(p: Parts, examples: list[Example], first_group: int) -> list[Scored]:
    """:func:`rollout_round` of this rank's contiguous share of ``examples``, then every
    rank's episodes in rank order — the same list on every rank, in the order one process
    would have produced it (one rank: the round itself)."""
    w = p.world
    if not w.parallel:
        return rollout_round(p, examples, first_group)
    bounds = torch.arange(len(examples)).tensor_split(w.size)
    start = int(bounds[w.rank][0]) if len(bounds[w.rank]) else len(examples)
    mine = examples[start : start + len(bounds[w.rank])]
    scored = rollout_round(p, mine, first_group + start) if mine else []
    everyone = gather(w, [replace(x, rank=w.rank) for x in scored])
    return [x for share in everyone for x in share]


def learned_rewards(p: Parts, episodes: list[Episode]) -> list[float]:
    """The reward model's score of each episode's tokens (prompt, turns, observations),
    batched; 0.0 for an episode without tokens (aborted at reset: excluded anyway)."""
    assert p.reward_model is not None
    rows = [list(e.prompt_ids + e.response_ids) for e in episodes if e.prompt_ids]
    if not rows:
        return [0.0] * len(episodes)
    with autocast_to(p.reward_model, p.settings.train_dtype):
        scores = iter(
            score_batch(
                p.reward_model, rows, int(p.tokenizer.pad_token_id), p.cfg.optim.micro_batch_size
            ).tolist()
        )
    return [next(scores) if e.prompt_ids else 0.0 for e in episodes]
