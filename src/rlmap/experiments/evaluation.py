"""``rlmap eval``: a checkpoint evaluated on the held-out set of the run that wrote it.

It builds what a run builds (config, data, tokenizer, model, scoring) from the checkpoint's run
directory, so it sits above :mod:`rlmap.assembly`; the evaluation itself is
:func:`rlmap.rollout.evaluate.evaluate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from rlmap.assembly.data import load_data
from rlmap.assembly.environments import evaluation_scoring
from rlmap.assembly.models import check_model_dir, load_causal_lm, load_tokenizer
from rlmap.core.errors import ConfigError, InputError
from rlmap.engines.hf import HFEngine
from rlmap.models.lora import ADAPTER_CONFIG
from rlmap.recipes import build_config, load_config
from rlmap.rollout.evaluate import evaluate
from rlmap.rollout.segments import run_context_policy


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
        next_context=run_context_policy(cfg.data, tokenizer),
        rescore_items=items,
    )
