"""Data-parallel learners on torch.distributed: the ranks, their collectives, the wrappers.

``system.learners = N`` runs N learner ranks, started by rlmap itself on one machine or by
``torchrun`` (one per node; both in :mod:`rlmap.learner.launch`). Each rank's learner lives on
``system.device`` resolved with its ``LOCAL_RANK``: on the CPU the ranks talk over gloo; on
GPUs rank r of a node takes ``cuda:r`` and the process group is ``cpu:gloo,cuda:nccl``, so
that the gradients (CUDA tensors) go over NCCL while rlmap's scalar and object collectives
(CPU tensors, pickles) stay on gloo (:func:`backend`). Each rank rolls out
its share of the step's prompts — a prompt's G samples never straddle ranks — and the
scored trajectories are all-gathered, so that every rank holds the step's *global* batch.
Everything that reads the batch as a whole (the dynamic-sampling filter, group statistics,
batch-wide advantage normalisation, every diagnostic) then sees exactly what one process
would. Each rank trains on the rows it generated (``owner``), with the reduction weights
of the *global* mini-batch (B, the token count, B·L_max are the whole mini-batch's), and
the gradients are **summed** over ranks, never averaged (DDP: a summing communication
hook; FSDP2: a divide factor of 1). The sum of the ranks' Σ w·j gradients is then the
single-process gradient, whatever the split, the micro-batching or the world size. The
critic is trained the same way (:func:`parallel`); its values are computed on the global
batch by every rank.

FSDP2 runs a collective in every forward and backward, so all ranks must run the same
number of them: a rank with fewer micro-batches in a mini-batch runs zero-weight ones
(:func:`micro_steps`), also in the π_old pass, where each rank scores the rows it owns
and the ranks exchange the scores. The rollout engine never sees the sharded module: with
DDP it shares the plain policy (identical on every rank); with FSDP2 it keeps its own copy,
refreshed one gathered parameter at a time (:func:`rlmap.models.lora.rollout_stream`). FSDP2 with
``system.train_dtype=bfloat16`` computes with bfloat16 parameters (:func:`mixed_precision`),
so there the sum equals the single-process gradient only to bfloat16's rounding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlmap.core.errors import ConfigError
from rlmap.learner.logprobs import Scorer

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

Sharding = Literal["ddp", "fsdp2"]
T = TypeVar("T")
CPU = torch.device("cpu")


@dataclass(frozen=True)
class World:
    """This process's place among the learner ranks (size 1: a single process)."""

    rank: int = 0
    size: int = 1
    sharding: Sharding = "ddp"
    device: torch.device = CPU
    """The rank's learner device (``system.device`` resolved with ``LOCAL_RANK``): it picks
    the backend, DDP's device ids and FSDP2's mesh."""
    train_dtype: str = "float32"
    """``system.train_dtype``: FSDP2's parameter dtype in the forward (:func:`mixed_precision`)."""

    @property
    def parallel(self) -> bool:
        """More than one rank: collectives run."""
        return self.size > 1

    @property
    def main(self) -> bool:
        """The rank that writes the run directory and evaluates."""
        return self.rank == 0


SINGLE = World()
"""One process: every collective here is the identity."""


def backend(device: torch.device) -> str:
    """The process group's backend for learners on ``device``: gloo on the CPU; on GPUs the
    composite ``cpu:gloo,cuda:nccl``, which routes each collective by its tensors' device:
    the gradients (CUDA) over NCCL, rlmap's scalar collectives (:func:`all_sum`: CPU
    tensors) and object collectives (:func:`gather`, :func:`broadcast`: torch picks the CPU
    when a group has it) over gloo — no copy to the GPU, no CUDA stream, and the same code
    on both."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def _device() -> torch.device:
    """Where the scalar collectives' tensors live: the CPU, whatever the learner's device, so
    that the composite group sends them over gloo (:func:`backend`)."""
    return CPU


def gather(world: World, obj: T) -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if not world.parallel:
        return [obj]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def broadcast(world: World, obj: T) -> T:
    """Rank 0's ``obj`` on every rank."""
    if not world.parallel:
        return obj
    box: list[Any] = [obj if world.main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_sum(world: World, values: Sequence[float]) -> list[float]:
    """Each value summed over the ranks (float64, so that a sum does not round)."""
    if not world.parallel or not values:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    dist.all_reduce(t)
    return t.tolist()


def all_max(world: World, values: Sequence[float]) -> list[float]:
    """Each value's maximum over the ranks."""
    if not world.parallel or not values:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def any_rank(world: World, flag: bool) -> bool:
    """True when ``flag`` holds on some rank (so that all ranks take the same branch)."""
    return bool(all_max(world, [float(flag)])[0]) if world.parallel else flag


def barrier(world: World) -> None:
    if world.parallel:
        dist.barrier()


def micro_steps(owner_rows: Tensor, world: World, micro_batch_size: int) -> int:
    """Micro-batches every rank runs in a mini-batch whose rows belong to ``owner_rows``:
    the most any rank needs (FSDP2 and DDP need the same count of forward/backward passes
    on every rank; a rank with fewer rows pads with zero-weight ones)."""
    counts = torch.bincount(owner_rows, minlength=world.size)
    return int(((counts + micro_batch_size - 1) // micro_batch_size).max())


def _sum_hook(_: Any, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """DDP communication hook: sum the gradients over ranks (the default averages)."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


# DDP checks the hook's annotations as objects; this module's are strings (PEP 563).
_sum_hook.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[Tensor]}


def wrap(policy: nn.Module, world: World) -> nn.Module:
    """The policy as the learner trains it: a :class:`Scorer` (log-probs as the forward),
    wrapped for data parallelism when there are several ranks. The scorer's parameters
    *are* the policy's (FSDP2 shards them in place)."""
    scorer = Scorer(policy)
    return parallel(scorer, world, blocks_of=policy) if world.parallel else scorer


def parallel(module: nn.Module, world: World, *, blocks_of: nn.Module | None = None) -> nn.Module:
    """``module`` wrapped for the learner ranks: DDP (on the rank's GPU: ``device_ids``)
    with gradients summed over ranks, or FSDP2 (``fully_shard`` on each transformer block of
    ``blocks_of`` — default the module — then on the root, over a mesh of the learner's
    device type, in :func:`mixed_precision`) with a divide factor of 1. The policy's scorer
    and the critic both go through here."""
    if world.sharding == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(module, **ddp_options(world.device), **_no_buffer_sync())
        ddp.register_comm_hook(None, _sum_hook)
        return ddp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if not hasattr(FSDPModule, "set_force_sum_reduction_for_comms"):
        raise ConfigError(
            f"system.learner_sharding: fsdp2 needs a newer torch than "
            f"{torch.__version__} (FSDP2 with sum-only reductions)"
        )
    mesh = init_device_mesh(mesh_type(world.device), (world.size,))
    policy = mixed_precision(world.train_dtype)
    options: dict[str, Any] = {} if policy is None else {"mp_policy": policy}
    for layer in decoder_layers(module if blocks_of is None else blocks_of):
        fully_shard(layer, mesh=mesh, **options)
    fully_shard(module, mesh=mesh, **options)
    for part in module.modules():
        if isinstance(part, FSDPModule):
            part.set_gradient_divide_factor(1.0)  # a sum over ranks, not a mean
            part.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    return module


def ddp_options(device: torch.device) -> dict[str, Any]:
    """DDP's placement for a replica on ``device``: ``device_ids=[index]`` on a GPU (the one
    device of a single-device module, where DDP puts its buckets and the forward's inputs),
    nothing on the CPU (where DDP refuses device ids)."""
    return {"device_ids": [device.index]} if device.type == "cuda" else {}


def mesh_type(device: torch.device) -> str:
    """FSDP2's device-mesh type for learners on ``device``: ``cuda`` on GPUs (the shards and
    the all-gathers there, over NCCL), else ``cpu`` (gloo) — the learner's, never a guess
    from CUDA's mere presence."""
    return "cuda" if device.type == "cuda" else "cpu"


def mixed_precision(train_dtype: str) -> MixedPrecisionPolicy | None:
    """FSDP2's policy for ``system.train_dtype``: for bfloat16, bfloat16 parameters in the
    forward and backward (the all-gathered, unsharded copies) and float32 gradients for the
    reduce-scatter; None (float32 throughout) otherwise. The same on the CPU and on GPUs.

    Why, when the learner's bfloat16 is autocast over float32 weights
    (:mod:`rlmap.learner.memory`): over float32 shards, autocast alone would all-gather
    float32 (twice bfloat16's bytes), and its cast cache would hold a bfloat16 copy of every
    layer's *unsharded* weight until the forward ends — the whole model on every rank,
    undoing the sharding (docs/scaling.md, "Learner state"). The two compose: the float32
    shards stay the master weights (AdamW steps them; checkpoints and the engine's copy
    gather them), and autocast, still entered, finds the matrix products' inputs in
    bfloat16 already and keeps its float32 ops (softmax, log-softmax) in float32.
    ``reduce_dtype`` float32: each micro-batch's bfloat16 gradient is cast up before the
    reduce-scatter, so the sum over ranks and micro-batches is float32's, as in one process.

    The price: the forward is not the one-process learner's bit for bit — the embedding's
    output and the residual stream are bfloat16 here, float32 under autocast alone — so the
    gradient equals the one-process one only to bfloat16's rounding (on a 2-layer toy on
    the CPU, 1.6 % of the largest entry; autocast's own distance from float32 was 1.3 %),
    and π_ref (unsharded, autocast over float32) differs from π_θ at step 0 by as much. A
    float32 run gets no policy: the gloo equality suite is exact.
    """
    if train_dtype != "bfloat16":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _no_buffer_sync() -> dict[str, Any]:
    """DDP's switch for not broadcasting buffers in every forward (a collective the π_old
    and rollout passes would have to match), by its name in this torch."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    known = inspect.signature(DistributedDataParallel.__init__).parameters
    return {
        "forward_sync_buffers" if "forward_sync_buffers" in known else "broadcast_buffers": False
    }


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (the units FSDP2 shards): the
    modules of the classes the model names in ``_no_split_modules``, else the largest
    ``nn.ModuleList``; empty when there is none (then the root is the unit)."""
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    named = [m for m in model.modules() if type(m).__name__ in blocks]
    if named:
        return named
    lists = [list(m) for m in model.modules() if isinstance(m, nn.ModuleList)]
    return max(lists, key=len) if lists else []


@contextlib.contextmanager
def accumulating(learner: nn.Module, world: World, *, last: bool) -> Iterator[None]:
    """A micro-batch's backward. DDP communicates only on the mini-batch's last one
    (``no_sync`` before it); FSDP2 reduce-scatters every micro-batch's gradient into the
    shards, since deferring it would keep each parameter's *unsharded* gradient (4 bytes a
    parameter on every rank, whatever the world size). A no-op in one process."""
    if world.parallel and world.sharding == "ddp" and not last:
        with learner.no_sync():  # type: ignore[operator]
            yield
        return
    yield


def local(t: Tensor) -> Tensor:
    """A tensor's local part (a DTensor's shard; a plain tensor as it is)."""
    to_local: Callable[[], Tensor] | None = getattr(t, "to_local", None)
    return t if to_local is None else to_local()


def full_state_dict(
    learner: nn.Module, world: World, *, main_only: bool = False, prefix: str = "model."
) -> dict[str, Tensor]:
    """The policy's full state dict, keyed as the plain Hugging Face model's (FSDP2:
    gathered, a collective — on every rank, or with ``main_only`` on rank 0 alone, the
    others getting an empty dict; otherwise the module's own tensors). ``prefix`` is what
    the wrapper adds to the Hugging Face names (the policy's :class:`Scorer`: ``model.``;
    the critic: nothing)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not (world.parallel and world.sharding == "fsdp2"):
        return policy_of(learner).state_dict()
    options = StateDictOptions(full_state_dict=True, cpu_offload=main_only)
    state = get_model_state_dict(learner, options=options)
    return {k.removeprefix(prefix): cast(Tensor, v) for k, v in state.items()}  # Scorer.model


def policy_of(learner: nn.Module) -> nn.Module:
    """The Hugging Face model inside the learner's wrappers."""
    inner = getattr(learner, "module", learner)  # DDP
    return inner.model if isinstance(inner, Scorer) else inner


def on_main(world: World, make: Callable[[], T]) -> T:
    """``make()`` on rank 0 only, its result sent to every rank (e.g. the warm start, built
    and cached once). Its error is raised on every rank, so that none waits for ever."""
    if not world.parallel:
        return make()
    result: tuple[bool, Any] = (True, None)
    if world.main:
        try:
            result = (True, make())
        except Exception as exc:  # re-raised below, on every rank
            result = (False, exc)
    ok, value = broadcast(world, result)
    if not ok:
        if not world.main:
            value.echo = True  # rank 0 reports it; the others only exit  # type: ignore[attr-defined]
        raise value
    return cast(T, value)


def _sharded(world: World) -> bool:
    return world.parallel and world.sharding == "fsdp2"


def optimizer_state(learner: nn.Module, optimizer: torch.optim.Optimizer, world: World) -> Any:
    """What a checkpoint stores of the optimiser: its state dict; FSDP2: the full one,
    gathered from the shards onto rank 0 (a collective; keyed by parameter name)."""
    if not _sharded(world):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(learner, optimizer, options=options)


def load_optimizer_state(
    learner: nn.Module, optimizer: torch.optim.Optimizer, state: Any, world: World
) -> None:
    """Put back :func:`optimizer_state`'s dict (FSDP2: every rank keeps its own shard)."""
    if not _sharded(world):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(learner, optimizer, state, options=options)
