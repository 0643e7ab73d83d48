"""Held-out evaluation: pass@1 and pass@k (unbiased), mean length, answer diversity.

Sampling uses its own fixed seed inside ``torch.random.fork_rng``: every
evaluation of a run sees the same sampling noise (curves compare like with
like), and the training random stream is left untouched (resume stays exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from rlmap.core.batch import End, RewardStatus
from rlmap.core.device import cuda_indices, model_device
from rlmap.core.errors import ConfigError, InputError
from rlmap.diagnostics.passk import pass_at_k_tensor
from rlmap.engines.engine import RolloutEngine
from rlmap.engines.hf import HFEngine
from rlmap.experiments.samples import CORRECT, Judged, class_fractions, error_class
from rlmap.models.lora import ADAPTER_CONFIG
from rlmap.rollout.episodes import Episode, episode_metrics, run_episodes
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvFactory, Verifier, reference_for, verify_safely
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

    Every sample gets an error class (:func:`rlmap.experiments.samples.error_class`, with
    ``format_pattern``): ``eval/errors/<class>_frac``. With ``samples_out``, the first
    sample of each of the first ``keep`` prompts is appended to it, as text.
    """
    envs = [environment(e) for e in examples for _ in range(samples)]
    model = getattr(engine, "model", None)  # the HF engine's; vLLM's seeds are its own
    on = model_device(model) if isinstance(model, torch.nn.Module) else torch.device("cpu")
    with torch.random.fork_rng(devices=cuda_indices(on)):
        torch.manual_seed(seed)
        episodes = run_episodes(
            engine,
            envs,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            max_turns=max_turns,
        )
    correct, distinct, loose, classes = [], [], [], []
    for k, example in enumerate(examples):
        group = episodes[k * samples : (k + 1) * samples]
        correct.append(sum(e.outcome > 0 and e.status == RewardStatus.OK for e in group))
        answers = [final_answer(tokenizer, e) for e in group]
        distinct.append(len(set(answers)))
        if rescore is not None:
            reference = reference_for(example, rescore_items)
            loose.append(sum(verify_safely(rescore, a, reference)[0] > 0 for a in answers))
        judged = [
            error_class(Judged(e.outcome, e.status, e.end, e.eos, e.tool_errors, a), format_pattern)
            for e, a in zip(group, answers, strict=True)
        ]
        classes += judged
        if samples_out is not None and k < keep:
            samples_out.append(sample_row(tokenizer, group[0], answers[0], example, judged[0]))
    n = torch.full((len(examples),), samples)
    c = torch.tensor(correct)
    return (
        per_task(examples, correct, samples)
        | {
            "eval/pass@1": float(pass_at_k_tensor(n, c, 1).mean()),
            "eval/pass@k": float(pass_at_k_tensor(n, c, samples).mean()),
            "eval/k": float(samples),
            "eval/length": sum(e.action_tokens for e in episodes) / max(len(episodes), 1),
            "eval/diversity": sum(distinct) / max(len(distinct), 1),
        }
        | class_fractions(classes)
        | ({f"eval/{k}": v for k, v in episode_metrics(episodes).items()} if multi_turn else {})
        | (
            {
                "eval/train_verifier_pass@1": float(
                    pass_at_k_tensor(n, torch.tensor(loose), 1).mean()
                )
            }
            if rescore is not None
            else {}
        )
    )


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
    """The text of the episode's last policy turn."""
    last = max(episode.turn_ids, default=-1)
    ids = [t for t, k in zip(episode.response_ids, episode.turn_ids, strict=True) if k == last]
    return decode_response(tokenizer, ids)


def evaluate_checkpoint(
    checkpoint: Path,
    *,
    samples: int | None = None,
    overrides: Sequence[str] = (),
    device: torch.device | None = None,
) -> dict[str, float]:
    """Evaluate a checkpoint on the held-out set of the run that wrote it (or the default),
    sampling on ``device`` (None: the CPU).

    A LoRA run's checkpoint (an adapter) loads on the base model its ``adapter_config.json``
    names (transformers' own peft integration), with the adapters on.
    """
    from rlmap.assembly.data import load_data
    from rlmap.assembly.environments import evaluation_scoring
    from rlmap.assembly.models import check_model_dir, load_causal_lm, load_tokenizer
    from rlmap.recipes import build_config, load_config

    if samples is not None and samples < 1:
        raise ConfigError(f"--samples: must be >= 1, got {samples}")
    if not any((checkpoint / name).is_file() for name in ("config.json", ADAPTER_CONFIG)):
        hint = ""
        if (checkpoint / "checkpoints").is_dir():
            hint = f"; it is a run directory, its checkpoints are in {checkpoint / 'checkpoints'}"
        raise InputError(f"{checkpoint}: not a Hugging Face checkpoint directory{hint}")
    check_model_dir(checkpoint, "checkpoint", adapter=True)
    run_config = checkpoint.parent.parent / "config.yaml"
    cfg = (
        load_config(run_config, overrides)
        if run_config.exists()
        else build_config(None, None, overrides)
    )
    _, heldout = load_data(cfg)  # a bad data file fails before the model loads
    tokenizer = load_tokenizer(checkpoint)
    model = load_causal_lm(checkpoint, device=device)
    engine = HFEngine(
        model, pad_token_id=int(tokenizer.pad_token_id), eos_token_id=int(tokenizer.eos_token_id)
    )
    g = cfg.generation
    environment, rescore, items = evaluation_scoring(cfg, tokenizer)
    return evaluate(
        engine,
        environment,
        tokenizer,
        heldout,
        samples=samples or g.eval_samples,
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        seed=0,
        multi_turn=cfg.data.multi_turn,
        rescore=rescore,
        max_turns=cfg.data.turn_budget,
        rescore_items=items,
    )
