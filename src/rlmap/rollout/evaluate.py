"""Held-out evaluation: pass@1 and pass@k (unbiased), mean length, answer diversity.

Sampling uses its own fixed seed inside ``torch.random.fork_rng``: every
evaluation of a run sees the same sampling noise (curves compare like with
like), and the training random stream is left untouched (resume stays exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from rlmap.core.batch import End, RewardStatus
from rlmap.core.device import cuda_indices, model_device
from rlmap.diagnostics.passk import pass_at_k_tensor
from rlmap.engines.engine import RolloutEngine
from rlmap.rollout.episode_stats import episode_metrics, segment_metrics
from rlmap.rollout.episodes import Episode, run_episodes
from rlmap.rollout.segments import ContextPolicy
from rlmap.runs.samples import CORRECT, Judged, class_fractions, error_class
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvFactory, Environment, Verifier, reference_for, verify_safely
from rlmap.tasks.prompts import decode_response


def evaluate(
    engine: RolloutEngine,
    environment: EnvFactory,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    *,
    samples: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    multi_turn: bool = False,
    rescore: Verifier | None = None,
    max_turns: int | None = None,
    keep: int = 0,
    samples_out: list[dict[str, Any]] | None = None,
    format_pattern: str | None = None,
    rescore_items: bool = False,
    next_context: ContextPolicy | None = None,
) -> dict[str, float]:
    """``eval/pass@1``, ``eval/pass@k`` (k = ``eval/k`` = samples), ``eval/length`` (mean
    generated tokens), ``eval/diversity`` (mean distinct final answers per prompt) and, with
    ``multi_turn``, the turn and tool statistics (``eval/turns``, ``eval/tool_call_rate``, …).

    A sample is correct when its episode's return is positive with an OK status: a
    crashing verifier or environment counts as wrong here, and never stops evaluation.
    With ``rescore`` (the training verifier, when evaluation uses a stricter one), the
    same samples' final answers are also scored by it: ``eval/train_verifier_pass@1``
    (``rescore_items``: it reads the examples' item keys, not their answers).
    Examples that name their ``task`` (a mixture) are also scored per task:
    ``eval/<task>/pass@1`` and ``eval/<task>/pass@k``.

    Every sample gets an error class (:func:`rlmap.runs.samples.error_class`, with
    ``format_pattern``): ``eval/errors/<class>_frac``. With ``samples_out``, the first
    sample of each of the first ``keep`` prompts is appended to it, as text.
    ``next_context``: the run's ``data.context_policy`` (:func:`run_episodes`); with one,
    ``eval/segments``, ``eval/summary_tokens`` and ``eval/context_dropped_tokens`` too.
    """
    episodes = _sample(
        engine,
        [environment(e) for e in examples for _ in range(samples)],
        seed=seed,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        max_turns=max_turns,
        next_context=next_context,
    )
    groups = [episodes[k * samples : (k + 1) * samples] for k in range(len(examples))]
    answers = [[final_answer(tokenizer, e) for e in group] for group in groups]
    classes = [_error_classes(g, a, format_pattern) for g, a in zip(groups, answers, strict=True)]
    if samples_out is not None:  # the first sample of each of the first ``keep`` prompts
        samples_out += _rows(tokenizer, examples[: max(keep, 0)], groups, answers, classes)
    return (
        _scores(examples, episodes, groups, answers, samples)
        | class_fractions([c for judged in classes for c in judged])
        | (_prefixed(episode_metrics(episodes)) if multi_turn else {})
        | ({} if next_context is None else _prefixed(segment_metrics(episodes)))
        | ({} if rescore is None else _rescored(rescore, examples, answers, samples, rescore_items))
    )


def _sample(
    engine: RolloutEngine,
    envs: Sequence[Environment],
    *,
    seed: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    max_turns: int | None,
    next_context: ContextPolicy | None,
) -> list[Episode]:
    """The episodes of ``envs``, sampled under ``seed`` inside ``torch.random.fork_rng`` (the
    run's own random stream is left as it was)."""
    model = getattr(engine, "model", None)  # the HF engine's; vLLM's seeds are its own
    on = model_device(model) if isinstance(model, torch.nn.Module) else torch.device("cpu")
    with torch.random.fork_rng(devices=cuda_indices(on)):
        torch.manual_seed(seed)
        return run_episodes(
            engine,
            envs,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            max_turns=max_turns,
            next_context=next_context,
        )


def _error_classes(
    group: Sequence[Episode], answers: Sequence[str], format_pattern: str | None
) -> list[str]:
    """The error class of each sample of a prompt (:func:`rlmap.runs.samples.error_class`)."""
    return [
        error_class(Judged(e.outcome, e.status, e.end, e.eos, e.tool_errors, a), format_pattern)
        for e, a in zip(group, answers, strict=True)
    ]


def _scores(
    examples: Sequence[Example],
    episodes: Sequence[Episode],
    groups: Sequence[Sequence[Episode]],
    answers: Sequence[Sequence[str]],
    samples: int,
) -> dict[str, float]:
    """pass@1 and pass@k (k = ``samples``) overall and per task, mean length and mean
    distinct final answers per prompt. A sample is correct when its return is positive with
    an OK status."""
    correct = [sum(e.outcome > 0 and e.status == RewardStatus.OK for e in g) for g in groups]
    n = torch.full((len(examples),), samples)
    c = torch.tensor(correct)
    distinct = [len(set(said)) for said in answers]
    return per_task(examples, correct, samples) | {
        "eval/pass@1": float(pass_at_k_tensor(n, c, 1).mean()),
        "eval/pass@k": float(pass_at_k_tensor(n, c, samples).mean()),
        "eval/k": float(samples),
        "eval/length": sum(e.action_tokens for e in episodes) / max(len(episodes), 1),
        "eval/diversity": sum(distinct) / max(len(distinct), 1),
    }


def _rows(
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    groups: Sequence[Sequence[Episode]],
    answers: Sequence[Sequence[str]],
    classes: Sequence[Sequence[str]],
) -> list[dict[str, Any]]:
    """The first sample of each of ``examples`` (a prefix of the evaluated ones) as a row."""
    picked = zip(examples, groups, answers, classes, strict=False)  # examples: the first few
    return [sample_row(tokenizer, g[0], a[0], e, c[0]) for e, g, a, c in picked]


def _rescored(
    rescore: Verifier,
    examples: Sequence[Example],
    answers: Sequence[Sequence[str]],
    samples: int,
    rescore_items: bool,
) -> dict[str, float]:
    """``eval/train_verifier_pass@1``: the same final answers scored by ``rescore``."""
    loose = []
    for example, said in zip(examples, answers, strict=True):
        reference = reference_for(example, rescore_items)
        loose.append(sum(verify_safely(rescore, a, reference)[0] > 0 for a in said))
    n = torch.full((len(examples),), samples)
    return {"eval/train_verifier_pass@1": float(pass_at_k_tensor(n, torch.tensor(loose), 1).mean())}


def _prefixed(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` under ``eval/``."""
    return {f"eval/{k}": v for k, v in metrics.items()}


def per_task(examples: Sequence[Example], correct: Sequence[int], samples: int) -> dict[str, float]:
    """``eval/<task>/pass@1`` and ``eval/<task>/pass@k`` of each task the examples name
    (none when they name none)."""
    tasks = sorted({e.task for e in examples if e.task})
    out: dict[str, float] = {}
    for task in tasks:
        c = torch.tensor([k for e, k in zip(examples, correct, strict=True) if e.task == task])
        n = torch.full_like(c, samples)
        out[f"eval/{task}/pass@1"] = float(pass_at_k_tensor(n, c, 1).mean())
        out[f"eval/{task}/pass@k"] = float(pass_at_k_tensor(n, c, samples).mean())
    return out


def sample_row(
    tokenizer: PreTrainedTokenizerBase, e: Episode, answer: str, example: Example, klass: str
) -> dict[str, Any]:
    """One held-out sample as the run's ``samples/`` file holds it (text, not token ids)."""
    return {
        "prompt": decode_response(tokenizer, e.prompt_ids),
        "response": decode_response(tokenizer, e.response_ids),
        "answer": answer,
        "reference": example.answer,
        "reward": e.outcome,
        "status": e.status.name.lower(),
        "correct": klass == CORRECT,
        "length": e.action_tokens,
        "truncated": not e.eos or e.end == End.TRUNCATED,
        "turns": e.turns,
        "tool_calls": e.tool_calls,
        "tool_errors": e.tool_errors,
        "class": klass,
    }


def final_answer(tokenizer: PreTrainedTokenizerBase, episode: Episode) -> str:
    """The text of the episode's last policy turn that is not a compaction summary."""
    last = max(set(episode.turn_ids) - set(episode.summaries), default=-1)
    ids = [t for t, k in zip(episode.response_ids, episode.turn_ids, strict=True) if k == last]
    return decode_response(tokenizer, ids)
