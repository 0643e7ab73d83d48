"""Time every estimator, objective, correction and reduction at B = 512, T = 1024 on CPU.

Each figure is the median of several runs, printed next to the time of one
(B×T)·(T×T) float32 matrix multiply measured in the same process, so the ratio
column is comparable across machines. Objectives and corrections are timed
forward + backward (that is what a learner pays); estimators and reductions
forward only (their outputs are detached or trivially differentiable).

    python bench/algos.py [--batch 512] [--time 1024] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch

from rlmap import correction, estimators, reduction
from rlmap.core.batch import Batch, End
from rlmap.correction import BehaviourParams, Correction, Objective, PolicyTerms
from rlmap.estimators import CreditParams
from rlmap.reduction import ReductionParams, reduce, token_weights


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (allocations, lazy init)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def make_batch(b: int, t: int, group: int, gen: torch.Generator) -> Batch:
    prompt = t // 8
    lengths = torch.randint(t // 4, t - prompt + 1, (b,), generator=gen)
    pos = torch.arange(t)
    mask = (pos >= prompt) & (pos < prompt + lengths.unsqueeze(-1))  # (B, T)
    behaviour = torch.where(mask, -torch.rand(b, t, generator=gen), 0.0)
    return Batch(
        tokens=torch.zeros(b, t, dtype=torch.long),
        action_mask=mask,
        behavior_logprobs=behaviour,
        rewards=torch.randint(0, 2, (b,), generator=gen).float(),
        group_id=torch.arange(b) // group,
        end=torch.where(torch.rand(b, generator=gen) < 0.2, End.TRUNCATED, End.TERMINAL),
        reward_status=torch.zeros(b, dtype=torch.long),
        policy_version=torch.zeros(b, t, dtype=torch.long),
        old_logprobs=behaviour + 0.01 * torch.randn(b, t, generator=gen),
        ref_logprobs=behaviour + 0.05 * torch.randn(b, t, generator=gen),
        values=torch.randn(b, t, generator=gen),
        bootstrap_values=torch.randn(b, generator=gen),
    )


def bench_estimators(batch: Batch, repeats: int) -> list[tuple[str, float]]:
    rows = []
    for name in estimators.registry.names():
        fn, params = estimators.registry.get(name).fn, CreditParams(estimator=name)
        rows.append((f"estimator {name}", median_ms(partial(fn, batch, params), repeats)))
    adaptive = CreditParams(estimator="gae", lam_critic=1.0, adaptive_alpha=0.05)
    gae = estimators.registry.get("gae").fn
    rows.append(
        ("estimator gae (decoupled, adaptive λ)", median_ms(lambda: gae(batch, adaptive), repeats))
    )
    return rows


def _terms(batch: Batch, logprobs: torch.Tensor, advantages: torch.Tensor) -> PolicyTerms:
    assert batch.old_logprobs is not None
    return PolicyTerms(
        logprobs=logprobs,
        old_logprobs=batch.old_logprobs,
        behavior_logprobs=batch.behavior_logprobs,
        advantages=advantages,
        mask=batch.action_mask,
        policy_version=batch.policy_version,
        learner_version=0,
    )


def bench_behaviour(batch: Batch, gen: torch.Generator, repeats: int) -> list[tuple[str, float]]:
    leaf = batch.behavior_logprobs + 0.02 * torch.randn(batch.tokens.shape, generator=gen)
    leaf = leaf.requires_grad_(True)
    weights = token_weights(batch.action_mask, ReductionParams(name="token_mean"))
    advantages = torch.randn(batch.tokens.shape, generator=gen)

    def step(objective: Objective, corr: Correction | None, p: BehaviourParams) -> None:
        leaf.grad = None
        terms = _terms(batch, leaf, advantages)
        j = objective.fn(terms, p)[0]
        if corr is not None:
            j = j * corr.fn(terms, p)[0]
        reduce(j, weights).backward()

    rows = []
    base = BehaviourParams()
    for name in correction.registry.names():
        run = partial(step, correction.registry.get(name), None, replace(base, objective=name))
        rows.append((f"objective {name} (fwd+bwd)", median_ms(run, repeats)))
    ppo = correction.registry.get("ppo_clip")
    for name in correction.corrections.names():
        run = partial(step, ppo, correction.corrections.get(name), base)
        rows.append((f"ppo_clip × {name} (fwd+bwd)", median_ms(run, repeats)))
    return rows


def bench_reductions(batch: Batch, gen: torch.Generator, repeats: int) -> list[tuple[str, float]]:
    loss = torch.randn(batch.tokens.shape, generator=gen)
    rows = []
    for name in reduction.registry.names():
        p = ReductionParams(name=name, max_len=batch.tokens.shape[1])
        run = partial(
            lambda p: reduce(loss, token_weights(batch.action_mask, p, group_id=batch.group_id)), p
        )
        rows.append((f"reduction {name}", median_ms(run, repeats)))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--time", type=int, default=1024)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    batch = make_batch(args.batch, args.time, args.group, gen)
    a = torch.randn(args.batch, args.time, generator=gen)
    w = torch.randn(args.time, args.time, generator=gen)
    matmul = median_ms(lambda: a @ w, args.repeats)
    rows = bench_estimators(batch, args.repeats)
    rows += bench_behaviour(batch, gen, args.repeats)
    rows += bench_reductions(batch, gen, args.repeats)
    print(
        f"B={args.batch} T={args.time} G={args.group}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, median of {args.repeats}"
    )
    print(f"{'matmul (B×T)·(T×T) reference':<44} {matmul:9.2f} ms   1.00×")
    for name, ms in rows:
        print(f"{name:<44} {ms:9.2f} ms {ms / matmul:6.2f}×")
    worst = max(rows, key=lambda r: r[1])
    print(f"slowest: {worst[0]} at {worst[1] / matmul:.1f}× the matmul")


if __name__ == "__main__":
    main()
