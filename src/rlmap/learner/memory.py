"""The learner's memory and precision options: autocast over float32 weights, and
activation checkpointing.

``system.train_dtype=bfloat16`` is mixed precision, not a bfloat16 model. Every model the
learner holds (policy, π_ref, critic, reward model) keeps float32 weights, and the policy's
and the critic's gradients and AdamW state are float32 too; their forward passes run under
``torch.autocast(device_type, bfloat16)``, which casts the inputs of the matrix products
(linear layers, attention) to bfloat16 and leaves norms, softmaxes, residual sums and the
log-prob reductions (:class:`rlmap.learner.logprobs.ChunkedLogprobs`) in float32.

Why not bfloat16 weights, as this option loaded them before: bfloat16 has 8 significant
bits, so rounding to nearest drops any update smaller than half a unit in the last place,
2⁻⁹ to 2⁻⁸ of the weight. An AdamW step moves a weight by about the learning rate, so at
lr = 1e-5 every weight larger than about 512 · lr = 0.005 in magnitude stops moving: a
pure-bfloat16 learner silently stops learning (or needs stochastic rounding or
Kahan-compensated updates, which ``torch.optim.AdamW`` does not do; checked: 100 AdamW
steps at lr = 1e-5 on bfloat16 weights of scale 0.05, with gradients of one sign, moved none
of those above 0.005, and every one in float32). The price is memory:
weight, gradient and AdamW's two moments cost 4 + 4 + 8 = 16 bytes per parameter, against
2 + 2 + 4 = 8 in bfloat16, plus autocast's bfloat16 copy of each weight while a forward pass
runs. So this is a speed option for GPUs' bfloat16 matrix units, not a memory option: the
activations saved for backward are bfloat16 only where a matrix product made them, and one
forward + backward of ``bench/memory.py --options`` peaked at 1.14x float32's (on a CPU
without bfloat16 instructions, where it also ran 23x slower).

π_ref runs under the same autocast over the same float32 start weights, so at step 0 it
computes what π_θ computes (up to the rounding of a different micro-batch); a bfloat16
reference would start away from the policy, a KL made of nothing but rounding.

The rollout engine is not the learner: it samples in ``system.rollout_dtype``, sharing the
float32 policy (without autocast) when that is float32 and keeping its own bfloat16 copy
otherwise. Either way its numerics differ from the learner's autocast, and κ ≠ 1 says by
how much (docs/mismatch.md).

Room beside vLLM on one GPU: the learner's weights, gradients and AdamW state stay on the
device while vLLM samples, so they and vLLM's share (``system.engine_memory`` × the GPU) must
fit together in what was free before either came (:func:`learner_bytes`,
:func:`check_engine_room`; ``bench/scaling.py`` tabulates the same arithmetic).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from contextlib import AbstractContextManager

import torch
from torch import nn

from rlmap.core.errors import ConfigError

MASTER_DTYPE = torch.float32
"""The dtype of every learner-side model's weights (and the optimisers' state)."""
LOW_PRECISION = (torch.bfloat16, torch.float16)
"""The dtypes autocast runs forward passes in."""


def autocast_to(model: nn.Module, dtype: torch.dtype) -> AbstractContextManager[object]:
    """``torch.autocast`` to ``dtype`` on ``model``'s device when ``dtype`` is a 16-bit float
    other than its weights' dtype; otherwise a context that does nothing (float32 training,
    or a float64 model in a test, runs as it is)."""
    weights = next(p for p in model.parameters() if p.is_floating_point())
    if dtype not in LOW_PRECISION or dtype == weights.dtype:
        return contextlib.nullcontext()
    return torch.autocast(device_type=weights.device.type, dtype=dtype)


def checkpoint_activations(model: nn.Module, field: str = "optim.gradient_checkpointing") -> None:
    """The Hugging Face model's own activation checkpointing on every decoder layer.

    Non-reentrant (``torch.utils.checkpoint`` with ``use_reentrant=False``): it needs no
    input that requires a gradient (frozen embeddings, LoRA) and replays the forward's
    autocast state in the recomputation. Transformers checkpoints a layer only in train
    mode with gradients on, so the no-grad passes (π_old, π_ref, values) and generation
    (eval mode, ``inference_mode``, KV cache on) run as without it. ConfigError naming
    ``field`` for a model that has none.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(f"{field}: {type(model).__name__} does not support checkpointing")
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # transformers >= 5.24; gradient_checkpointing_enable is deprecated
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(  # type: ignore[operator]
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )


COPIES_TRAINED = 4
"""Copies a trained parameter keeps on the learner's device, each of its dtype: the weight,
its gradient and AdamW's two moments (16 bytes in float32). A frozen one keeps its weight."""
GIB = 2**30


def learner_bytes(trained: int, frozen: int, *, element: int = 4, shards: int = 1) -> int:
    """Bytes the learner keeps on its device through a step, activations aside: ``trained``
    parameters × ``COPIES_TRAINED`` and ``frozen`` ones (π_ref, a reward model, LoRA's base)
    × 1, ``element`` bytes each (float32, ``MASTER_DTYPE``: 16 and 4 bytes a parameter); the
    trained state split over ``shards`` FSDP2 ranks (the frozen models are whole on each)."""
    return element * (COPIES_TRAINED * trained // shards + frozen)


def resident_bytes(models: Iterable[nn.Module], shards: int = 1, *, trains: bool = True) -> int:
    """:func:`learner_bytes` of ``models``' parameters, each counted once (LoRA's π_ref is the
    policy itself) at its own element size, trained = ``requires_grad`` (none when the process
    does not train: a rollout actor's copy of the policy is its weights alone). With FSDP2
    ``shards`` the larger of the step's sharded state and the whole weights every rank holds
    until the learner is wrapped (vLLM is built, and checks its room, before that)."""
    params = {id(p): p for model in models for p in model.parameters()}.values()
    every = sum(p.numel() * p.element_size() for p in params)
    trained = sum(p.numel() * p.element_size() for p in params if p.requires_grad and trains)
    return max(every, learner_bytes(trained, every - trained, element=1, shards=shards))


def check_engine_room(learner: int, engine_memory: float, free: int, total: int) -> None:
    """ConfigError naming ``system.engine_memory`` unless vLLM's share of the GPU
    (``engine_memory`` × ``total`` bytes) and the ``learner``'s bytes fit in the ``free``
    bytes the GPU had before either was placed; it says the largest share that fits, or that
    the learner alone does not."""
    engine = engine_memory * total
    if learner + engine <= free:
        return
    room = math.floor(100 * (free - learner) / total) / 100  # the largest share, rounded down
    fix = (
        f"lower system.engine_memory to {room:.2f} or less"
        if room > 0
        else "the learner alone does not fit: train LoRA adapters (model.lora_rank) or shard it "
        "(system.learners, system.learner_sharding=fsdp2)"
    )
    raise ConfigError(
        f"system.engine_memory: vLLM's {engine_memory} of the GPU "
        f"({engine / GIB:.1f} GiB) and the learner's weights, gradients and AdamW "
        f"state ({learner / GIB:.1f} GiB) exceed its {free / GIB:.1f} GiB free; "
        f"{fix}"
    )
