"""Hyper-parameters of the system axis (the loops that use them: :mod:`rlmap.system`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator


def _yaml_switch(value: Any) -> Any:
    """YAML reads a bare ``off`` (and ``no``, ``false``) as False: the setting ``off``; and
    ``on`` (``yes``, ``true``) as True, kept a word so that it is refused by name, not taken
    for 1."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


EngineSleep = Annotated[Literal["auto", "off", 1, 2], BeforeValidator(_yaml_switch)]
"""``system.engine_sleep``'s values, resolved by :func:`rlmap.engines.vllm_settings.sleep_level`."""


@dataclass(frozen=True)
class SystemParams:
    """How rollout and learning are scheduled and where they run."""

    mode: Literal["sync", "async"] = "sync"
    """sync: every group finishes before the learner steps (barrier); async: finished
    trajectories enter a queue and the learner does not wait for their group."""
    workers: int = 2
    """async: rollout worker threads, each with its own copy of the weights."""
    worker_prompts: int | None = None
    """async: prompts a worker rolls out together in one batched ``generate`` (their
    trajectories enter the queue as that round finishes); None: prompts_per_step / workers."""
    publish_every: int = 1
    """async: learner steps between weight publications (a new policy version)."""
    partial_rollout: bool = False
    """Pause unfinished trajectories at a weight update and resume them later (Kimi k1.5)."""
    deterministic: bool = False
    """async, for debugging: the workers' rounds run one at a time in a fixed order, driven
    by the learner's thread (in this process, or on the Ray actors), each seeded from (run
    seed, worker, round), as far ahead as the staleness bound admits; learner step k
    always consumes the same trajectories and a run repeats exactly (resume included).
    Slower: no rollout overlaps learning."""
    device: str = "auto"
    """Where the learner's models and micro-batches live (:mod:`rlmap.core.device`): auto
    (``cuda:LOCAL_RANK`` when CUDA is available, else the CPU), cpu, cuda or cuda:N. A GPU
    machine trains on the CPU only when asked to (``cpu``)."""
    deterministic_kernels: bool = False
    """On a GPU: PyTorch's deterministic algorithms and a fixed cuBLAS workspace, so a run and
    its resume repeat bit for bit (slower; an op without a deterministic kernel raises).
    Without it a GPU resume is equal within float tolerance. On a CPU: nothing to change."""
    engine: Literal["hf", "vllm"] = "hf"
    """Rollout engine: Hugging Face ``generate`` or vLLM (:mod:`rlmap.engines.vllm`; its
    CUDA build on a GPU, its CPU build elsewhere), both in the learner's process."""
    engine_memory: float = 0.5
    """vLLM on a GPU: the fraction of GPU memory it may take (weights, activations, KV
    cache), its ``gpu_memory_utilization``; the learner shares the rest. With the engine asleep
    the learner has nearly all of it while it steps; the fraction is what it must leave vLLM
    while vLLM samples, beside the learner's weights, gradients and AdamW state."""
    engine_sleep: EngineSleep = "auto"
    """vLLM sharing the learner's GPU in the synchronous loop: it sleeps while the learner steps
    and wakes for the weight reload. 1: its weights go to CPU memory and its KV cache is
    dropped; 2: both are dropped (the reload refills the weights). off: it stays resident.
    auto: 2 where it can (vLLM's CUDA build, the learner on CUDA, ``mode=sync``), else off."""
    backend: Literal["inprocess", "ray"] = "inprocess"
    """Where rollout workers and the learner live: one process, or Ray actors."""
    actor_gpus: float | None = None
    """Ray: the GPUs each rollout actor asks Ray for (its ``num_gpus``, 0 to 1; a fraction
    packs ⌊1/x⌋ actors onto one GPU). None: 0 with the learner on the CPU; with it on CUDA,
    1 (``separate``) or an equal share of the learner's GPU (``colocate``)."""
    actor_placement: Literal["separate", "colocate"] = "separate"
    """Ray with a CUDA learner: separate: the actors on the other GPUs (Ray is started without
    the learner's); colocate: the actors share the learner's GPU (one PACK placement group)."""
    rollout_dtype: Literal["float32", "bfloat16"] = "float32"
    """Precision of the rollout engine; differing from ``train_dtype`` makes κ ≠ 1 real."""
    learners: int = 1
    """Data-parallel learner ranks (:mod:`rlmap.learner.distributed`): rlmap starts them on
    this machine, or ``torchrun`` does (then ``WORLD_SIZE`` must equal this). Each rank rolls
    out its share of the prompts and trains on it; the gradient is the single-process one."""
    learner_sharding: Literal["ddp", "fsdp2"] = "ddp"
    """ddp: every rank holds the whole model and optimiser state; fsdp2: parameters,
    gradients and optimiser state sharded over the ranks (``fully_shard``)."""
    train_dtype: Literal["float32", "bfloat16"] = "float32"
    """Precision of the learner's forward passes: bfloat16 runs them under autocast, the
    weights, gradients and optimiser state staying float32 (:mod:`rlmap.learner.memory`)."""
