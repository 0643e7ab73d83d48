"""Two (or more) gloo learner ranks run one policy update on a saved global batch.

Run as ``python dp_worker.py CASES OUT``: CASES is a ``torch.save``d list of dicts (model
dir, batch, advantages, owner, settings, sharding, world size, bug), all of one world size;
rank 0 writes to OUT, per case, the gradients each optimiser step saw (full tensors,
before the step) and the parameters after.
``bug`` plants a known defect, so that the test can show it catches it: ``per_rank``
pins each rank's own denominator, ``averaged`` divides the loss by the world size.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from rlmap.learner import distributed, launch, update_loop
from rlmap.learner import policy as learner
from rlmap.learner.critic import CriticSettings, compute_values, load_critic, update_critic
from rlmap.learner.distributed import World
from rlmap.models.lora import rollout_stream
from rlmap.reduction import token_weights


class Recording(torch.optim.AdamW):
    """AdamW that records the full gradients it is about to apply."""

    def __init__(self, params: Any, **kw: Any) -> None:
        super().__init__(params, **kw)
        self.seen: list[list[torch.Tensor]] = []

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        grads = [p.grad for g in self.param_groups for p in g["params"]]
        self.seen.append([_full(g).clone() for g in grads])
        return super().step(closure)


def _full(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)
    return t if full is None else full()


ORIGINAL = update_loop._accumulate


def _plant(case: dict[str, Any], world: World) -> None:
    """Replace the pinned weights of every mini-batch with a known-wrong version."""
    original = ORIGINAL
    reduction = case["settings"].reduction

    def planted(model: Any, mb: Any, rows: Any, weights: Any, owner_rows: Any, *rest: Any) -> Any:
        if case["bug"] == "per_rank":  # this rank's rows only: a per-rank denominator
            mine = (owner_rows == world.rank)[:, None]
            weights = (
                token_weights(mb.action_mask & mine, reduction, group_id=mb.group_id),
                *weights[1:],
            )
        elif case["bug"] == "averaged":  # divided by the world size once more
            weights = tuple(w / world.size for w in weights)
        return original(model, mb, rows, weights, owner_rows, *rest)

    update_loop._accumulate = planted  # type: ignore[assignment]


def _rank(rank: int, cases: list[dict[str, Any]], out: str, port: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(cases[0]["world"]),
    )
    torch.set_num_threads(1)
    results = [_update(case) for case in cases]
    if rank == 0:
        torch.save(results, out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def critic_update(case: dict[str, Any], world: World = distributed.SINGLE) -> dict[str, Any]:
    """The critic's values and optimiser steps on the case's batch, toward its returns (the
    same code for the two-rank run and the single-process one it is compared with)."""
    critic = load_critic(Path(case["model_dir"]), dtype=torch.float64, seed=0)
    trained = distributed.parallel(critic, world) if world.parallel else critic
    optimizer = Recording(trained.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    s = CriticSettings(
        value_clip=0.2,
        updates=1,
        schedule=update_loop.Schedule(
            epochs=1, minibatches=2, micro_batch_size=2, max_grad_norm=1e9
        ),
    )
    batch = case["batch"]
    values, bootstrap = compute_values(trained, batch, s.schedule.micro_batch_size)
    batch = batch.replace(values=values, bootstrap_values=bootstrap)
    owner = case["owner"] if world.parallel else None
    metrics = update_critic(
        trained,
        optimizer,
        scheduler,
        batch,
        case["advantages"],
        s,
        generator=torch.Generator().manual_seed(0),
        world=world,
        owner=owner,
    )
    params = distributed.full_state_dict(trained, world, prefix="")
    return {"grads": optimizer.seen, "params": params, "metrics": metrics}


def streams(policy: torch.nn.Module, world: World) -> list[dict[str, Any]]:
    """Every rank's rollout stream of ``policy`` (FSDP2: each parameter gathered as its turn
    comes) as (name, tensor) pairs, as they are and cast to bfloat16, and the names of the
    parameters that were shards; in rank order, on every rank. Every rank runs through both
    streams whole: each gather is a collective."""
    sharded = [name for name, p in policy.named_parameters() if hasattr(p, "full_tensor")]
    mine = {
        "full": list(rollout_stream(policy)),
        "sharded": sharded,
        "bf16": list(rollout_stream(policy, dtype=torch.bfloat16)),
    }
    return distributed.gather(world, mine)


def _update(case: dict[str, Any]) -> dict[str, Any]:
    world = launch.world_of_env(case["sharding"])
    if case.get("stream_only"):  # the start weights, sharded and streamed back whole
        policy = AutoModelForCausalLM.from_pretrained(case["model_dir"]).double()
        wrapped = distributed.wrap(policy, world)  # FSDP2 shards the policy in place
        return {"streams": streams(policy, world), "wrapper": type(wrapped).__name__}
    _plant(case, world)
    if case.get("critic"):
        return critic_update(case, world)
    policy = AutoModelForCausalLM.from_pretrained(case["model_dir"]).double()
    policy.train()
    wrapped = distributed.wrap(policy, world)
    optimizer = Recording(wrapped.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    s = case["settings"]
    reference = None
    if case.get("reference"):
        reference = AutoModelForCausalLM.from_pretrained(case["model_dir"]).double().eval()
    batch, _ = learner.prepare_batch(
        case["batch"], wrapped, reference, s, world=world, owner=case["owner"]
    )
    metrics = learner.update_policy(
        wrapped,
        optimizer,
        scheduler,
        batch,
        case["advantages"],
        s,
        learner_version=0,
        generator=torch.Generator().manual_seed(0),
        world=world,
        owner=case["owner"],
    )
    params = distributed.full_state_dict(wrapped, world)
    result = {"grads": optimizer.seen, "params": params, "metrics": metrics}
    return result | ({"streams": streams(policy, world)} if case.get("stream") else {})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    cases = torch.load(sys.argv[1], weights_only=False)
    mp.start_processes(
        _rank,
        args=(cases, sys.argv[2], _free_port()),
        nprocs=cases[0]["world"],
        start_method="spawn",
    )
