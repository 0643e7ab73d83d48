"""What a step logs of its rollouts and of its time, with one meaning in both loops.

``reward/*``, ``length/*``, ``errors/*``, ``env/*`` and ``judge/*`` over the generated
episodes (:func:`rollout_metrics`), and the ``system/*`` split of a step's wall time into
the wait for its batch and the rest (:func:`step_times`). Names and meanings:
docs/metrics.md.
"""

from __future__ import annotations

import math

import torch

from rlmap.assembly.parts import Parts
from rlmap.core.batch import trains
from rlmap.feedback.judge import judge_metrics
from rlmap.rollout.episode_stats import episode_metrics, segment_metrics
from rlmap.rollout.evaluate import final_answer
from rlmap.rollout.packing import Scored
from rlmap.runs.samples import Judged, class_fractions, error_class


def step_times(waited: float, update_s: float, tokens: float) -> dict[str, float]:
    """The ``system/*`` timings both loops log with one meaning (docs/metrics.md): the
    learner's wait for its batch (synchronous: the whole rollout; asynchronous: the queue),
    the rest of the step, the share the learner computed, and the generated tokens per
    second of the whole step."""
    total = max(waited + update_s, 1e-9)
    return {
        "system/learner_wait_s": waited,
        "system/update_s": update_s,
        "system/learner_utilisation": update_s / total,
        "system/tokens_per_s": tokens / total,
    }


def valid(x: Scored) -> bool:
    """The episode trains (:func:`rlmap.core.batch.trains`, the rule ``Batch.valid`` applies)."""
    return trains(x.status, x.episode.end)


def rollout_metrics(scored: list[Scored], p: Parts) -> dict[str, float]:
    """reward/*, length/* (generated tokens), errors/* (each error class's share,
    :func:`rollout_errors`) and, for multi-turn tasks, env/* (turns, tool calls:
    :func:`rlmap.rollout.episode_stats.episode_metrics`; with ``data.context_policy`` segments,
    :func:`rlmap.rollout.episode_stats.segment_metrics`) over every generated episode; with a
    learned reward or a judge, what the task's verifier says of the same rollouts
    (``reward/verifier_mean``), and the judge's ``judge/*`` since the last step (this
    process's requests: with data-parallel learners, rank 0's share)."""
    episodes = [x.episode for x in scored]
    lengths = torch.tensor([e.action_tokens for e in episodes], dtype=torch.float32)
    multi_turn = p.cfg.data.multi_turn
    env = {f"env/{k}": v for k, v in episode_metrics(episodes).items()} if multi_turn else {}
    if p.cfg.data.context_policy != "fail":
        env |= {f"env/{k}": v for k, v in segment_metrics(episodes).items()}
    verifier = {}
    if p.reward_model is not None or p.cfg.feedback.source in ("judge", "comparison"):
        ok = [x.episode.outcome for x in scored if valid(x)]
        verifier["reward/verifier_mean"] = sum(ok) / len(ok) if ok else math.nan
    return (
        reward_metrics(scored)
        | env
        | verifier
        | judge_metrics(p.base_reward)
        | rollout_errors(scored, p)
        | {
            "length/mean": float(lengths.mean()),
            "length/p95": float(lengths.quantile(0.95)),
            "length/truncated_frac": sum(not e.eos for e in episodes) / len(episodes),
        }
    )


def rollout_errors(scored: list[Scored], p: Parts) -> dict[str, float]:
    """``errors/<class>_frac``: the share of the rollouts failing with each error class
    (:mod:`rlmap.runs.samples`): whether the reward can be trusted from its status,
    whether the answer was right from the environment's return (the verifier's, even when a
    learned reward model is trained on), as for the held-out samples."""
    pattern = p.cfg.feedback.format_pattern
    classes = [
        error_class(
            Judged(
                x.episode.outcome,
                x.status,
                x.episode.end,
                x.episode.eos,
                x.episode.tool_errors,
                final_answer(p.tokenizer, x.episode),
            ),
            pattern,
        )
        for x in scored
    ]
    return {k.removeprefix("eval/"): v for k, v in class_fractions(classes).items()}


def reward_metrics(scored: list[Scored]) -> dict[str, float]:
    """reward/*: the shaped return's mean and spread and the outcome's mean over the episodes
    whose reward can be trusted (a failed verifier's 0 never enters them); none when no
    episode can be. The share of each failure is ``errors/<class>_frac``
    (:func:`rollout_errors`), its one name."""
    ok = [x for x in scored if valid(x)]
    rewards = torch.tensor([x.reward for x in ok])
    if not ok:
        return {}
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(ok) > 1 else 0.0,
        "reward/outcome_mean": sum(x.outcome for x in ok) / len(ok),
    }
