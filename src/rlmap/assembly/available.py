"""Whether this machine has what a config asks for: its packages, GPUs and placements.

Checked before anything is built (``rlmap train``, ``advise``'s proposals); light to import
(torch, no transformers): each check imports what it needs only when its field asks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlmap.core.device import resolve
from rlmap.core.errors import ConfigError
from rlmap.models.lora import require_peft

if TYPE_CHECKING:
    from rlmap.recipes.config import RecipeConfig


def refuse_unavailable(cfg: RecipeConfig) -> None:
    """One-line ConfigError, naming the field, for parts of a recipe rlmap does not have yet."""
    if cfg.model.lora_rank:
        require_peft()
    if cfg.system.engine == "vllm":
        from rlmap.engines.vllm_settings import require_vllm

        require_vllm()
        device = resolve(cfg.system.device)
        if cfg.system.learners == 1 and device.type == "cuda" and (device.index or 0) != 0:
            # vLLM's one-process executor builds on its local rank's GPU, cuda:0, whatever the
            # learner's: the two would not share a GPU (nor would the memory checks hold)
            raise ConfigError(
                f"system.device: {device} with system.engine=vllm, which builds "
                "its engine on cuda:0; pick the GPU with CUDA_VISIBLE_DEVICES "
                "and system.device=cuda"
            )
    if cfg.system.backend == "ray":  # the GPUs its actors ask for (an actor's own is inprocess)
        from rlmap.assembly.placement import check_gpus

        check_gpus(cfg, resolve(cfg.system.device))
