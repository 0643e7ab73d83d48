"""LoRA policies through peft: the adapters, their merge, and the base model behind them.

Notation (Hu et al. 2021): a targeted linear layer y = W x becomes

    y = W x + (α / r) · B A x,    A ∈ R^{r × in}, B ∈ R^{out × r}, B = 0 at the start,

with W frozen and only A, B trained (``model.lora_rank`` = r, ``model.lora_alpha`` = α,
``model.lora_targets`` the layers). Three consequences the rest of rlmap relies on:

- **π_ref is the base.** W never changes, so the reference policy of the KL term is the
  policy itself with the adapters switched off (:func:`adapters_off`): no second model.
- **Rollout engines get merged weights.** An engine samples from a plain copy of the base
  architecture holding W' = W + (α / r) · B A (:func:`merged_stream`), computed each
  update, one layer at a time, without touching the trained model: merging into the model
  and unmerging after would leave W + Δ − Δ, which is not W in floating point, and W would
  drift.
- **Checkpoints hold the adapter.** ``save_pretrained`` of a peft model writes
  ``adapter_config.json`` + ``adapter_model.safetensors``; the base is the run's start
  model. :func:`merged_copy` gives the plain model to save beside it on request.

Differs from the paper: no LoRA dropout (it would make π_θ's forward random, and the
learner's log-probs would no longer be those of the policy that sampled). peft is an
optional dependency (``pip install 'rlmap[lora]'``); nothing here imports it until a run
asks for LoRA.
"""

from __future__ import annotations

import contextlib
import copy
import re
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlmap.core.device import cuda_indices, model_device
from rlmap.core.errors import ConfigError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MERGED_DIR = "merged"
"""Subdirectory of a LoRA checkpoint with the merged model (``run.save_merged``)."""
TARGET_NAME = re.compile(r"[A-Za-z0-9_.]+")
"""What a ``model.lora_targets`` entry may look like: a module name or a dotted suffix."""


def require_peft() -> None:
    """ConfigError naming ``model.lora_rank`` when peft is not installed."""
    try:
        import peft  # noqa: F401
    except ImportError:
        raise ConfigError(
            "model.lora_rank: LoRA needs peft installed (pip install 'rlmap[lora]')"
        ) from None


def is_lora(model: nn.Module) -> bool:
    """``model`` is a peft model (if peft was never imported, no model can be one)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def attach(
    model: nn.Module,
    *,
    rank: int,
    alpha: float,
    targets: tuple[str, ...],
    seed: int,
    adapter: Path | None = None,
) -> nn.Module:
    """``model`` with LoRA adapters on ``targets``: new ones (A drawn from ``seed``, B = 0),
    or the saved adapter at ``adapter`` (a checkpoint of this run, to resume). Only the
    adapters require gradients. A target that names no module is a ConfigError."""
    require_peft()
    from peft import LoraConfig, PeftModel, get_peft_model

    check_targets(model, targets)
    # peft draws A on the CPU and moves it after; the model's device's generator is saved
    # too, should a peft version draw there
    with (
        torch.random.fork_rng(devices=cuda_indices(model_device(model))),
        warnings.catch_warnings(),
    ):
        torch.manual_seed(seed)  # A's initialisation, seeded; the run's RNG is left alone
        # peft asks transformers 5 a question it has deprecated; nothing for a user to act on
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        if adapter is not None:
            return PeftModel.from_pretrained(
                model, adapter, is_trainable=True, torch_device=str(model_device(model))
            )
        # peft annotates lora_alpha as int, but only ever divides it by r: any α > 0 works
        config = LoraConfig(
            r=rank,
            lora_alpha=alpha,  # type: ignore[arg-type]
            target_modules=list(targets),
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, config)


def adaptable(module: nn.Module) -> bool:
    """peft's LoRA can wrap ``module``: a Linear, Embedding, Conv or transformers' Conv1D
    layer (the kinds its default dispatcher takes; not a norm, an activation or a container
    of layers). nn.MultiheadAttention, which peft also takes, is left out: its weights are
    ``in_proj_weight``/``out_proj``, not the ``weight`` the merge rewrites."""
    from transformers.pytorch_utils import Conv1D

    kinds = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, Conv1D)
    return isinstance(module, kinds)


def check_targets(model: nn.Module, targets: tuple[str, ...]) -> None:
    """ConfigError naming ``model.lora_targets`` when a target selects no module of
    ``model``, or a module LoRA cannot adapt (peft would refuse it mid-setup with the whole
    module printed); either way the line lists the valid targets: the last names of the
    model's adaptable layers, less tied ones (which :func:`refuse_tied` refuses). ``model``
    may be on the meta device: only names, types and tensor identities are read, so a run
    checks its targets before any weight loads. Tied targets are refused too
    (:func:`refuse_tied`)."""
    modules = list(model.named_modules())
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    valid = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in modules
            if name and adaptable(m) and uses[id(getattr(m, "weight", None))] < 2
        }
    )
    listing = f"valid targets of {type(model).__name__}: {','.join(valid)}"
    for target in targets:
        chosen = [(name, m) for name, m in modules if _matches(name, target)]
        if not chosen:
            raise ConfigError(
                f"model.lora_targets: no module named {target!r} in the model; {listing}"
            )
        for name, module in chosen:
            if not adaptable(module):
                raise ConfigError(
                    f"model.lora_targets: {target!r} names {name}, a "
                    f"{type(module).__name__}, which LoRA cannot adapt (only "
                    f"Linear, Embedding and Conv layers); {listing}"
                )
    refuse_tied(model, targets)


def _matches(name: str, target: str) -> bool:
    """A module name that a ``model.lora_targets`` entry selects (peft's rule: the name or a
    dotted suffix of it)."""
    return name == target or name.endswith(f".{target}")


def refuse_tied(model: nn.Module, targets: tuple[str, ...]) -> None:
    """ConfigError naming ``model.lora_targets`` when a target's weight is tied to another
    module's (``tie_word_embeddings``: ``lm_head`` and ``embed_tokens`` are one tensor).

    peft adapts only the targeted side of a tie, so the learner's policy has W on one side
    and W + ΔW on the other, which no tied plain model can hold: a rollout engine's merged
    copy (HF or vLLM) would load W + ΔW into both sides, or W into both, and sample from
    another policy than the learner's (κ ≠ 1, growing with ΔW)."""
    owners: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(name.removesuffix(".weight"))
    for target in targets:
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            if not _matches(name, target) or not isinstance(weight, nn.Parameter):
                continue
            others = [n for n in owners.get(id(weight), []) if n != name]
            if others:
                raise ConfigError(
                    f"model.lora_targets: {target!r} ({name}) shares its weight with "
                    f"{others[0]} (tied embeddings), so a rollout engine could not sample "
                    "from the adapted policy; target untied layers (e.g. q_proj,v_proj)"
                )


def plain_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft model (its targeted layers carry the adapters,
    so a forward pass is still π_θ's); any other model as it is."""
    if is_lora(model):
        inner: nn.Module = model.get_base_model()  # type: ignore[operator]
        return inner
    return model


def adapters_off(model: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """A block in which ``model`` computes its base (peft's ``disable_adapter``); a plain
    model is its own base (a no-op). rlmap never loads a peft model other than the LoRA
    policy, so a peft reference is always that policy, and off is its base."""
    if is_lora(model):
        off: contextlib.AbstractContextManager[Any] = model.disable_adapter()  # type: ignore[operator]
        return off
    return contextlib.nullcontext()


def _lora_layers(model: nn.Module) -> Iterator[tuple[str, Any]]:
    """(name in the plain model, peft LoRA layer) of every adapted layer."""
    from peft.tuners.lora import LoraLayer

    for name, module in plain_model(model).named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


@torch.no_grad()
def merged_stream(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of the base architecture's state dict with W' = W + (α / r) · B A in
    every adapted layer, one tensor at a time: a layer's W' is computed when it is yielded,
    so at most one merged layer exists at once (all of them would be a second copy of every
    adapted weight).

    Keys are the plain model's (``...q_proj.weight``, not ``...q_proj.base_layer.weight``),
    in its state dict's order, so they load into ``AutoModelForCausalLM`` of the base.
    Unadapted tensors are the model's own (shared, not copied); the model is not changed.
    """
    adapted = {f"{name}.weight": layer for name, layer in _lora_layers(model)}
    for key, value in plain_model(model).state_dict().items():
        if ".lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        layer = adapted.get(plain)
        if layer is None:
            yield plain, value
            continue
        (adapter,) = layer.active_adapters
        # peft's own (α / r) · B A, laid out as the base weight, for every layer kind
        # (Linear, Embedding, Conv1D): the rule is the one its forward pass applies.
        yield plain, value + layer.get_delta_weight(adapter).to(value.dtype)


def merged_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """:func:`merged_stream` as one dict (what ``run.save_merged`` loads into a plain copy)."""
    return dict(merged_stream(model))


def rollout_stream(
    model: nn.Module,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of the weights a rollout engine samples from, one tensor at a time,
    in the state dict's order: a LoRA policy's merged layer by layer (:func:`merged_stream`),
    any other model's own. An engine copies each into place as it comes, so a weight sync
    never holds a second whole copy of the model.

    An FSDP2 shard (a DTensor parameter) is gathered with ``full_tensor()`` when its turn
    comes: a collective, so every learner rank must run through the whole stream, in the
    same order, even one that keeps nothing (no ``world`` argument: the DTensor carries its
    own mesh, and a plain tensor needs no gather). ``dtype``: floating parameters cast to it
    (the rollout's), before the gather, so that a bfloat16 rollout gathers half the bytes;
    buffers keep theirs, as ``from_pretrained(dtype=...)`` and the HF engine's own copy
    keep them. ``device``: each whole tensor moved there. A tensor that needs none of this
    is the model's own, not a copy: a consumer that keeps it must copy it (the async
    board does).
    """
    named = merged_stream(model) if is_lora(model) else model.state_dict().items()
    buffers = {n.replace(".base_layer.", ".") for n, _ in plain_model(model).named_buffers()}
    for name, tensor in named:
        yield name, _for_rollout(tensor, None if name in buffers else dtype, device)


def _for_rollout(
    tensor: Tensor, dtype: torch.dtype | None, device: torch.device | str | None
) -> Tensor:
    """One tensor of :func:`rollout_stream`: cast, gathered whole if it is a shard, moved."""
    if dtype is not None and tensor.is_floating_point():
        tensor = tensor.to(dtype)
    gather = getattr(tensor, "full_tensor", None)  # a DTensor's (FSDP2: a collective)
    if gather is not None:
        tensor = gather()
    return tensor if device is None else tensor.to(device)


def rollout_weights(model: nn.Module) -> dict[str, Tensor]:
    """The state dict a rollout engine samples from (:func:`rollout_stream` as one dict):
    merged for a LoRA policy, else the model's own tensors (FSDP2: gathered)."""
    return dict(rollout_stream(model))


def merged_copy(model: nn.Module) -> nn.Module:
    """A plain copy of the base architecture holding the merged weights (not sharing any
    tensor with ``model``): what a rollout engine runs, and ``run.save_merged`` writes."""
    plain: nn.Module = copy.deepcopy(model).unload()  # type: ignore[operator]
    plain.load_state_dict(merged_state_dict(model))
    return plain
