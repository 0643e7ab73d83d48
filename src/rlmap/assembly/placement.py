"""Where a run's Ray actors go: the GPUs each rollout actor asks for, the placement group
of colocated actors, the GPUs the run's own Ray starts with, and the one-line refusals (before
anything starts) for GPUs this machine cannot give. The actors themselves are
:mod:`rlmap.system.ray_workers`."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from rlmap.core.errors import ConfigError
from rlmap.recipes.system_params import SystemParams

if TYPE_CHECKING:
    from rlmap.recipes.config import RecipeConfig


def actor_device(gpu_ids: list[Any]) -> str:
    """An actor's ``system.device``: the GPU Ray gave it (``ray.get_gpu_ids()``; Ray narrows
    its CUDA_VISIBLE_DEVICES to it, so ``cuda:0``), else the CPU — even on a GPU machine,
    where Ray leaves an actor that asked for none every GPU in sight."""
    return "cuda:0" if gpu_ids else "cpu"


def actor_gpus(s: SystemParams, learner: torch.device) -> float:
    """``system.actor_gpus`` resolved: as set; else 0 beside a CPU learner, 1 on separate
    GPUs, or an equal share of the learner's GPU rounded down to Ray's unit of 1e-4 (so
    the shares never sum past one GPU)."""
    if s.actor_gpus is not None:
        return s.actor_gpus
    if learner.type != "cuda":
        return 0.0
    return 1.0 if s.actor_placement == "separate" else math.floor(1e4 / s.workers) / 1e4


def per_gpu(gpus: float) -> int:
    """How many actors asking ``gpus`` (0 < gpus ≤ 1) Ray fits on one GPU: ⌊1/gpus⌋ (a
    fraction is a share of one GPU, never split across two)."""
    return math.floor(1 / gpus + 1e-9)  # 1e-9: 1/0.1 must count 10, whatever its rounding


def actor_options(gpus: float) -> dict[str, Any]:
    """Ray's options for a rollout actor: one CPU, and ``num_gpus`` when it asks for any."""
    return {"num_cpus": 1, "num_gpus": gpus} if gpus > 0 else {"num_cpus": 1}


def bundles(workers: int, gpus: float) -> list[dict[str, float]]:
    """The colocated actors' placement group: one bundle per actor, its CPU and its share of
    the GPU; packed (``PACK``) onto the one GPU Ray is given, the learner's."""
    return [{"CPU": 1, "GPU": gpus} for _ in range(workers)]


def colocated_options(gpus: float, group: Any, workers: int) -> list[dict[str, Any]]:
    """Actor ``i``'s options: :func:`actor_options` in bundle ``i`` of ``group``, so an actor
    that dies and restarts takes its own bundle back."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return [
        actor_options(gpus)
        | {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=i
            )
        }
        for i in range(workers)
    ]


def visible_gpus() -> list[str]:
    """This process's GPUs as CUDA_VISIBLE_DEVICES names them (their indices when unset)."""
    if not torch.cuda.is_available():
        return []
    count, named = torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is None:
        return [str(i) for i in range(count)]
    return [g.strip() for g in named.split(",")][:count]


def ray_gpus(placement: str, learner: torch.device, visible: list[str]) -> list[str]:
    """The GPUs the run's own Ray is started with: all of ``visible`` beside a CPU learner;
    beside a CUDA learner the others (``separate``) or the learner's alone (``colocate``)."""
    if learner.type != "cuda":
        return visible
    own = visible[learner.index or 0]
    return [own] if placement == "colocate" else [g for g in visible if g != own]


@contextmanager
def cuda_visible(devices: list[str]) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES set to ``devices`` while Ray starts: its raylet and every actor
    inherit it, and Ray hands out only these. The learner's own CUDA context, made before,
    does not move."""
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def check_gpus(cfg: RecipeConfig, learner: torch.device) -> None:
    """One-line ConfigError, before the run starts, for GPUs the actors ask of this machine
    and it cannot give (``learner``: the learner's device, resolved)."""
    s = cfg.system
    if s.actor_placement == "colocate" and learner.type != "cuda":
        raise ConfigError(
            f"system.actor_placement: colocate shares the learner's GPU, and "
            f"the learner is on the CPU (system.device={s.device})"
        )
    gpus = actor_gpus(s, learner)
    if gpus == 0:
        if s.engine == "vllm" and torch.cuda.is_available():
            raise ConfigError(
                "system.actor_gpus: 0, and vLLM's CUDA build needs a GPU in each "
                "rollout actor; set system.actor_gpus > 0"
            )
        return
    if not torch.cuda.is_available():
        raise ConfigError(
            f"system.actor_gpus: {gpus:g} GPU per rollout actor, and this torch "
            f"sees no CUDA (torch {torch.__version__}); use 0"
        )
    if os.environ.get("RAY_ADDRESS"):  # a cluster of the user's: its GPUs are not this machine's
        if s.actor_placement == "colocate":
            raise ConfigError(
                "system.actor_placement: colocate needs the run's own Ray (it "
                "gives Ray the learner's GPU alone); unset RAY_ADDRESS or use "
                "separate"
            )
        return
    have = len(ray_gpus(s.actor_placement, learner, visible_gpus()))
    need = math.ceil(s.workers / per_gpu(gpus))
    if need > have:
        mine = " (the learner's own)" if s.actor_placement == "colocate" else ""
        raise ConfigError(
            f"system.actor_gpus: {s.workers} rollout actors at {gpus:g} GPU "
            f"each need {need} GPU(s), and Ray gets {have}{mine}; lower "
            "system.workers or system.actor_gpus"
        )
    if s.engine == "vllm":
        _check_engine_memory(s, gpus)


def _check_engine_memory(s: SystemParams, gpus: float) -> None:
    """vLLM instances sharing a GPU each take ``engine_memory`` of it — colocated, the
    learner's own engine (built in the learner's process, for its evaluations) among them,
    and the learner needs some too: a share that cannot fit stops the run before it starts."""
    sharing = min(s.workers, per_gpu(gpus))
    colocated = s.actor_placement == "colocate"
    engines = sharing + colocated  # the learner's own engine shares the colocated GPU
    total = engines * s.engine_memory
    if total > 1 or (colocated and total >= 1):
        whose = f" ({sharing} actors' and the learner's)" if colocated else " (actors')"
        beside = " beside the learner" if colocated else ""
        raise ConfigError(
            f"system.engine_memory: {engines} vLLM engines on one GPU{whose} at "
            f"{s.engine_memory:g} each take {total:g} of its memory{beside}; "
            "lower system.engine_memory"
        )
