"""The rows TRL's GRPOConfig and RLOOConfig share: transformers' ``TrainingArguments``
(batch sizes per device, the schedule, AdamW) and the sampling fields. Sources in
:mod:`.trl`; HF: transformers' ``training_args.py``.
"""

from __future__ import annotations

import math
from typing import Any

from rlmap.core.errors import ConfigError
from rlmap.recipes.translate.rows import (
    NO_TOP_K,
    NULL,
    Lookup,
    Mapped,
    Mapping,
    field,
    off,
    read_with,
    transformers_schedule,
    transformers_warmup,
)

HF = "transformers 5.19 transformers/training_args.py"


def steps_per_generation(get: Lookup, world_size: int) -> int:
    """TRL's optimiser-batch count per generation (GRPOConfig.__post_init__): the field, else
    generation_batch_size / (per-device batch × processes), else gradient_accumulation_steps."""
    given, batch = get("steps_per_generation"), get("generation_batch_size")
    if given:
        return int(given)
    if batch:
        return int(batch) // (get("per_device_train_batch_size") * world_size)
    return int(get("gradient_accumulation_steps"))


def updates_per_batch(get: Lookup, world_size: int) -> int:
    """rlmap optimiser steps per rollout batch: mini-batches × num_iterations."""
    minibatches = max(
        1, steps_per_generation(get, world_size) // get("gradient_accumulation_steps")
    )
    return minibatches * int(get("num_iterations"))


def prompts(world_size: int) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        steps = steps_per_generation(get, world_size)
        batch = value or get("per_device_train_batch_size") * world_size * steps
        group = get("num_generations")
        if batch % group:
            raise ConfigError(
                f"generation_batch_size: {batch} is not a multiple of num_generations {group}"
            )
        minibatches = steps // get("gradient_accumulation_steps")
        return Mapped(
            {
                "sampling.prompts_per_step": batch // group,
                "optim.minibatches_per_epoch": max(1, minibatches),
            },
            note=f"{batch} completions / G={group}, {world_size} procs",
        )

    return convert


def max_steps(world_size: int) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        if value is None or value < 0:
            return Mapped({}, note="unset: TRL runs num_train_epochs over the dataset")
        per_batch = updates_per_batch(get, world_size)
        steps = math.ceil(value / per_batch)
        kind = "exact" if steps * per_batch == value else "approximate"
        return Mapped(
            {"optim.steps": steps},
            kind,
            f"TRL counts optimiser steps: {value} / {per_batch} a batch",
        )

    return convert


def scheduler(value: Any, get: Lookup) -> Mapped:
    """lr_scheduler_type: linear (the default), cosine, constant(_with_warmup)."""
    mapped = transformers_schedule(value, "warmup_steps", get)
    if value not in ("linear", "cosine"):
        return mapped
    if (get("max_steps") or -1) < 0:
        return Mapped(
            mapped.fields,
            "approximate",
            "with max_steps unset TRL decays over "
            "num_train_epochs × the data's batches, rlmap over optim.steps",
        )
    return Mapped(mapped.fields, note="trap: TRL's default is linear decay to 0")


def warmup(value: Any, get: Lookup) -> Mapped:
    """warmup_steps: optimiser steps (≥ 1) or a ratio of the total (< 1)."""
    if not value or value >= 1:
        return transformers_warmup(int(value or 0))
    if (get("max_steps") or -1) <= 0:
        return Mapped({}, "none", "a warm-up ratio of a run whose length is set by the dataset")
    return transformers_warmup(math.ceil(get("max_steps") * value))


def adam_betas(value: Any, get: Lookup) -> Mapped:
    return Mapped({"optim.adam_betas": [float(get("adam_beta1")), float(value)]})


def shared(world_size: int, src: str, lines: dict[str, int]) -> tuple[Mapping, ...]:
    """TrainingArguments rows and the sampling rows GRPOConfig and RLOOConfig share; ``src``
    and ``lines`` cite the config file and the line of each field's default there."""

    def at(key: str) -> str:
        return f"{src}:{lines[key]}"

    return (
        Mapping(
            "per_device_train_batch_size",
            field("optim.micro_batch_size", "completions"),
            8,
            f"{HF}:775",
        ),
        Mapping("gradient_accumulation_steps", read_with("generation_batch_size"), 1, f"{HF}:847"),
        Mapping(
            "steps_per_generation",
            read_with("generation_batch_size"),
            None,
            at("steps_per_generation"),
        ),
        Mapping(
            "generation_batch_size",
            prompts(world_size),
            NULL,
            f"{at('generation_batch_size')} (None: per_device × world × steps_per_generation)",
        ),
        Mapping("num_iterations", field("optim.epochs_per_batch"), 1, at("num_iterations")),
        Mapping(
            "mask_truncated_completions",
            off("rlmap cannot mask truncated completions", (False,)),
            False,
            at("mask_truncated_completions"),
        ),
        Mapping("temperature", field("generation.temperature"), 1.0, at("temperature")),
        Mapping("top_p", field("generation.top_p"), 1.0, at("top_p")),
        Mapping("top_k", off(NO_TOP_K, (0, -1, None)), 0, at("top_k")),
        Mapping("min_p", off("rlmap has no min_p", (None, 0, 0.0)), NULL, at("min_p")),
        Mapping(
            "max_completion_length",
            field("generation.max_new_tokens"),
            512,
            at("max_completion_length"),
        ),
        Mapping("learning_rate", field("optim.lr"), 1e-6, at("learning_rate")),
        Mapping("max_steps", max_steps(world_size), -1, f"{HF}:777"),
        Mapping("lr_scheduler_type", scheduler, "linear", f"{HF}:786"),
        Mapping("warmup_steps", warmup, 0, f"{HF}:796"),
        Mapping("weight_decay", field("optim.weight_decay"), 0.0, f"{HF}:820"),
        Mapping("adam_beta1", read_with("adam_beta2"), 0.9, f"{HF}:826"),
        Mapping("adam_beta2", adam_betas, 0.999, f"{HF}:832"),
        Mapping("max_grad_norm", field("optim.max_grad_norm"), 1.0, f"{HF}:864"),
        Mapping(
            "model_name_or_path", field("model.path", "the source's model"), None, "TRL ModelConfig"
        ),
    )
