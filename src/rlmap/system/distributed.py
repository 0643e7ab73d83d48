"""Data-parallel learners on torch.distributed: the ranks, their collectives, the wrappers.

``system.learners = N`` runs N learner ranks (gloo on CPU, NCCL on GPU), started by rlmap
itself on one machine (:func:`launch`) or by ``torchrun`` (multi-node). Each rank rolls out
its share of the step's prompts — a prompt's G samples never straddle ranks — and the
scored trajectories are all-gathered, so that every rank holds the step's *global* batch.
Everything that reads the batch as a whole (the dynamic-sampling filter, group statistics,
batch-wide advantage normalisation, every diagnostic) then sees exactly what one process
would. Each rank trains on the rows it generated (``owner``), with the reduction weights
of the *global* mini-batch (B, the token count, B·L_max are the whole mini-batch's), and
the gradients are **summed** over ranks, never averaged (DDP: a summing communication
hook; FSDP2: a divide factor of 1). The sum of the ranks' Σ w·j gradients is then the
single-process gradient, whatever the split, the micro-batching or the world size.

FSDP2 runs a collective in every forward and backward, so all ranks must run the same
number of them: a rank with fewer micro-batches in a mini-batch runs zero-weight ones
(:func:`micro_steps`), and the π_old / π_ref passes run over the global batch on every
rank. The rollout engine never sees the sharded module: with DDP it shares the plain
policy (identical on every rank); with FSDP2 it keeps its own copy, refreshed from the
gathered full state dict (:func:`full_state_dict`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlmap.system.logprobs import Scorer

Sharding = Literal["ddp", "fsdp2"]
T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among the learner ranks (size 1: a single process)."""

    rank: int = 0
    size: int = 1
    sharding: Sharding = "ddp"

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


def world_of_env(sharding: Sharding) -> World:
    """The world a launcher (rlmap's own or ``torchrun``) set up in the environment, joined:
    ``RANK`` / ``WORLD_SIZE`` read, the process group initialised (NCCL when CUDA is there,
    else gloo). Without ``WORLD_SIZE`` (or with 1) a single process."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return SINGLE
    rank = int(os.environ["RANK"])
    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=size,
                                timeout=datetime.timedelta(minutes=30))  # fmt: skip
    return World(rank=rank, size=size, sharding=sharding)


def _device() -> torch.device:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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
    if not world.parallel:
        return scorer
    if world.sharding == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device = _device()
        ids = [device.index] if device.type == "cuda" else None
        ddp = DistributedDataParallel(scorer, device_ids=ids, broadcast_buffers=False)
        ddp.register_comm_hook(None, _sum_hook)
        return ddp
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for layer in decoder_layers(policy):
        fully_shard(layer)
    fully_shard(scorer)
    for module in scorer.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # a sum over ranks, not a mean
    return scorer


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (the units FSDP2 shards), found as
    the largest ``nn.ModuleList``; empty when there is none (then the root is the unit)."""
    lists = [list(m) for m in model.modules() if isinstance(m, nn.ModuleList)]
    return max(lists, key=len) if lists else []


@contextlib.contextmanager
def accumulating(learner: nn.Module, world: World, *, last: bool) -> Iterator[None]:
    """A micro-batch's backward: gradients are communicated only on the mini-batch's last
    one (DDP ``no_sync`` / FSDP2 ``set_requires_gradient_sync``); a no-op in one process."""
    if not world.parallel:
        yield
        return
    if world.sharding == "ddp":
        with contextlib.nullcontext() if last else learner.no_sync():  # type: ignore[operator]
            yield
        return
    learner.set_requires_gradient_sync(last)  # type: ignore[operator]
    try:
        yield
    finally:
        learner.set_requires_gradient_sync(True)  # type: ignore[operator]


def local(t: Tensor) -> Tensor:
    """A tensor's local part (a DTensor's shard; a plain tensor as it is)."""
    to_local: Callable[[], Tensor] | None = getattr(t, "to_local", None)
    return t if to_local is None else to_local()


def full_state_dict(learner: nn.Module, world: World) -> dict[str, Tensor]:
    """The policy's full state dict, keyed as the plain Hugging Face model's, on every rank
    (FSDP2: gathered, a collective; otherwise the module's own tensors)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not (world.parallel and world.sharding == "fsdp2"):
        return policy_of(learner).state_dict()
    state = get_model_state_dict(learner, options=StateDictOptions(full_state_dict=True))
    return {k.removeprefix("model."): cast(Tensor, v) for k, v in state.items()}  # Scorer.model


def policy_of(learner: nn.Module) -> nn.Module:
    """The Hugging Face model inside the learner's wrappers."""
    inner = getattr(learner, "module", learner)  # DDP
    return inner.model if isinstance(inner, Scorer) else inner
