"""Held-out evaluation: pass@1 and pass@k (unbiased), mean length, answer diversity.

Sampling uses its own fixed seed inside ``torch.random.fork_rng``: every
evaluation of a run sees the same sampling noise (curves compare like with
like), and the training random stream is left untouched (resume stays exact).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from rlmap import feedback
from rlmap.core.errors import ConfigError
from rlmap.diagnostics.passk import pass_at_k_tensor
from rlmap.system.engine import RolloutEngine
from rlmap.system.hf_engine import HFEngine
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.prompts import decode_response, encode_prompt


def evaluate(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    verify: Callable[[str, str], float],
    *,
    samples: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
) -> dict[str, float]:
    """``eval/pass@1``, ``eval/pass@k`` (k = ``eval/k`` = samples), ``eval/length`` (mean
    response tokens) and ``eval/diversity`` (mean distinct answers per prompt)."""
    prompts = [encode_prompt(tokenizer, e.prompt) for e in examples]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        groups = engine.generate(
            prompts, n=samples, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p
        )
    correct, lengths, distinct = [], [], []
    for example, group in zip(examples, groups, strict=True):
        answers = [decode_response(tokenizer, c.response_ids) for c in group]
        correct.append(sum(_safe(verify, a, example.answer) > 0 for a in answers))
        lengths += [len(c.response_ids) for c in group]
        distinct.append(len(set(answers)))
    n = torch.full((len(examples),), samples)
    c = torch.tensor(correct)
    return {
        "eval/pass@1": float(pass_at_k_tensor(n, c, 1).mean()),
        "eval/pass@k": float(pass_at_k_tensor(n, c, samples).mean()),
        "eval/k": float(samples),
        "eval/length": sum(lengths) / max(len(lengths), 1),
        "eval/diversity": sum(distinct) / max(len(distinct), 1),
    }


def _safe(verify: Callable[[str, str], float], response: str, reference: str) -> float:
    try:
        return float(verify(response, reference))
    except Exception:  # a crashing verifier scores 0 in evaluation, never aborts it
        return 0.0


def evaluate_checkpoint(
    checkpoint: Path, *, samples: int | None = None, overrides: Sequence[str] = ()
) -> dict[str, float]:
    """Evaluate a checkpoint on the held-out set of the run that wrote it (or the default)."""
    from rlmap.recipes import build_config, load_config
    from rlmap.system import setup

    if not (checkpoint / "config.json").exists():
        raise ConfigError(f"{checkpoint}: not a Hugging Face checkpoint directory")
    run_config = checkpoint.parent.parent / "config.yaml"
    cfg = load_config(run_config, overrides) if run_config.exists() else build_config(
        None, None, overrides)  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    engine = HFEngine(model, pad_token_id=int(tokenizer.pad_token_id),
                      eos_token_id=int(tokenizer.eos_token_id))  # fmt: skip
    _, heldout = setup.load_data(cfg)
    g = cfg.generation
    return evaluate(engine, tokenizer, heldout, feedback.registry.get(cfg.feedback.verifier).fn,
                    samples=samples or g.eval_samples, max_new_tokens=g.max_new_tokens,
                    temperature=g.temperature, top_p=g.top_p, seed=0)  # fmt: skip
