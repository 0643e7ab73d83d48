"""The run's rollout engine (``system.engine``), and the room it needs on the learner's GPU."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from rlmap.assembly.settings import DTYPES
from rlmap.engines.engine import RolloutEngine
from rlmap.engines.hf import HFEngine
from rlmap.learner.distributed import SINGLE, World
from rlmap.learner.memory import check_engine_room, resident_bytes
from rlmap.recipes.config import RecipeConfig


def make_engine(
    cfg: RecipeConfig,
    model_dir: Path,
    policy: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    *,
    own_copy: bool = False,
    world: World = SINGLE,
    learner: Sequence[torch.nn.Module | None] = (),
    trains: bool = True,
) -> RolloutEngine:
    """The run's rollout engine (``system.engine``) holding ``policy``'s weights.

    vLLM builds the architecture of ``model_dir`` and takes the weights from ``policy``. In
    the asynchronous loop it is shared by the learner and every in-process worker, each
    through its own :class:`rlmap.engines.vllm.PinnedView` (its own weight version).
    On the policy's GPU it is built only once its share is known to fit beside the
    ``learner``'s models (:func:`check_gpu_room`), with sleep mode at ``system.engine_sleep``'s
    level (:func:`rlmap.engines.vllm_settings.sleep_level`); with several learner ranks each
    rank builds its own, which joins the ranks' world.
    """
    s = cfg.system
    if s.engine == "vllm":
        from rlmap.engines.vllm import PinnedView, VLLMEngine
        from rlmap.engines.vllm_settings import sleep_level

        device = next(policy.parameters()).device
        check_gpu_room(cfg, device, [m for m in learner if m is not None], world, trains=trains)
        sleep = sleep_level(s.engine_sleep, engine=s.engine, mode=s.mode, device=device)
        engine = VLLMEngine(
            model_dir,
            policy,
            eos_token_id=int(tokenizer.eos_token_id),
            dtype=DTYPES[s.rollout_dtype],
            memory=s.engine_memory,
            sampling_masks=cfg.behaviour.replay_sampling_set,
            sleep=sleep,
            rank=world.rank if world.parallel else None,
        )
        return PinnedView(engine, 0, policy) if s.mode == "async" else engine
    return HFEngine(
        policy,
        pad_token_id=int(tokenizer.pad_token_id),
        eos_token_id=int(tokenizer.eos_token_id),
        dtype=DTYPES[s.rollout_dtype],
        own_copy=own_copy,
    )


def check_gpu_room(
    cfg: RecipeConfig,
    device: torch.device,
    learner: Sequence[torch.nn.Module],
    world: World,
    *,
    trains: bool = True,
) -> None:
    """Before vLLM is built on the learner's GPU (``device``): its share and the ``learner``'s
    models, with their gradients and AdamW state (FSDP2: this rank's shard), must fit in what
    the GPU had free before the learner came — free now, plus what this process's PyTorch
    cache holds, the models placed so far (:func:`rlmap.learner.memory.check_engine_room`). A
    learner elsewhere shares nothing with vLLM, which checks its own share."""
    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device)
    shards = world.size if world.parallel and world.sharding == "fsdp2" else 1
    resident = resident_bytes(learner, shards, trains=trains)
    check_engine_room(resident, cfg.system.engine_memory, free, total)
