"""FSDP2's mixed precision for real, on one gloo rank, in a process of its own (run by
test_system_nccl.py): a process that has run FSDP2's backward may segfault in a child it
forks later (the verifier workers of the tests that follow), so the pytest worker never
runs it. Prints the figures as one JSON line."""

from __future__ import annotations

import json
import sys
import tempfile

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from rlmap.learner.distributed import World, parallel
from rlmap.learner.logprobs import Scorer
from rlmap.learner.memory import autocast_to


def main(model_dir: str) -> None:
    tokens = torch.randint(0, 20, (2, 12), generator=torch.Generator().manual_seed(0))
    attention = torch.ones_like(tokens)
    plain = Scorer(AutoModelForCausalLM.from_pretrained(model_dir))
    with autocast_to(plain, torch.bfloat16):
        expected, _ = plain(tokens, attention)
    store = dist.FileStore(tempfile.mktemp(), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        policy = AutoModelForCausalLM.from_pretrained(model_dir)
        world = World(size=1, sharding="fsdp2", train_dtype="bfloat16")  # parallel() at size 1
        learner = parallel(Scorer(policy), world, blocks_of=policy)
        seen: list[str] = []
        policy.model.layers[0].register_forward_pre_hook(  # after FSDP2's all-gather
            lambda module, args: seen.append(str(next(module.parameters()).dtype))
        )
        with autocast_to(learner, torch.bfloat16):
            got, _ = learner(tokens, attention)
        got.sum().backward()
        shards = [
            (str(p.dtype), None if p.grad is None else str(p.grad.dtype))
            for p in learner.parameters()
        ]
        print(
            json.dumps(
                {
                    "seen": seen,
                    "shards": shards,
                    "out": str(got.dtype),
                    "gap": (got - expected).abs().max().item(),
                }
            )
        )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
