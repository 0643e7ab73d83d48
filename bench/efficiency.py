"""How much rlmap's rollout and update phases cost over the bare Hugging Face / PyTorch calls.

Both figures are ratios ``bare_time / rlmap_time`` measured in one process, on the
same inputs, with the sides alternated (the order rotates every repeat) and the
median taken over the per-repeat ratios, so load from other processes on the
machine hits both sides alike. 1.0 means rlmap adds nothing; the target is >= 0.9.

Rollout, on the same P prompts × G samples, max_new_tokens, temperature, top_k=0, top_p=1:

- bare: ``model.generate`` on the prompts already left-padded into tensors, under
  ``inference_mode`` in eval mode, returning only the token ids.
- rlmap ``HFEngine.generate``: left padding, ``generate`` with ``output_scores``,
  behaviour log-probs log μ from the processed scores, response lengths and
  ``Completion`` records.
- rlmap ``rollout_round`` (the headline): prompt encoding + ``HFEngine.generate`` +
  decoding every response + the verifier + reward shaping + ``Scored`` records —
  the whole rollout phase of :func:`rlmap.system.sync.collect` for one round.

Every call is preceded by ``torch.manual_seed`` with the same seed, so all sides sample
the very same tokens and run the same number of decoding steps (checked and printed).
The last rollout line is the round against its own engine, the issue's target (>= 0.9):
``rollout_round / HFEngine.generate: generate_time / round_time = X``.

Update, on one real batch of the preset (sampled by ``rollout_round`` from the warm start):

- bare: logits → log-softmax → gather the tokens' log-probs → ``(−A·logp)`` mean over
  response tokens → backward → AdamW step, on the whole batch at once.
- bare, micro-batched: the same, in micro-batches of ``optim.micro_batch_size`` with the
  loss summed over them (what micro-batching alone costs).
- rlmap ``update_policy`` (the headline): one optimiser step of the preset — per
  micro-batch the forward pass, log-probs and entropy, the PPO-clip objective with
  the KL term, the pinned response-mean reduction, backward; then gradient clipping,
  AdamW, the LR scheduler. Not included: ``prepare_batch`` (π_ref forward pass) and
  the advantage estimator, which run once before.

    python bench/efficiency.py [--prompts 8] [--group 8] [--max-new-tokens 16]
                               [--micro-batch-size 16] [--repeats 15] [--threads N]
                               [override ...]

Overrides are the config's (``model.path=DIR`` runs on another checkpoint: the smoke
test's tiny model). With ``system.engine=vllm`` the rollout part times the vLLM engine's
``generate`` against ``rollout_round`` on it (vLLM's own sampling is then the bare side).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import transformers
from torch import Tensor

from rlmap import estimators
from rlmap.assembly.models import model_path
from rlmap.assembly.parts import Parts, build
from rlmap.core.batch import Batch
from rlmap.engines.engine import Completion
from rlmap.engines.hf import left_pad
from rlmap.learner.logprobs import position_ids
from rlmap.learner.policy import prepare_batch, update_policy
from rlmap.recipes.build import build_config
from rlmap.rollout.packing import to_batch
from rlmap.system.rounds import next_prompts, rollout_round
from rlmap.tasks.prompts import encode_prompt

SAMPLING_SEED = 1234


def environment() -> str:
    return (
        f"python {platform.python_version()} · torch {torch.__version__} · "
        f"transformers {transformers.__version__} · torch threads {torch.get_num_threads()} "
        f"(inter-op {torch.get_num_interop_threads()}) · {os.cpu_count()} CPUs · "
        f"load avg {', '.join(f'{x:.1f}' for x in os.getloadavg())} · "
        f"{platform.system()} {platform.machine()}"
    )


def alternate(sides: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each side per repeat; one warm-up call each, then the order rotates."""
    names = list(sides)
    for name in names:
        sides[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - start)
    return times


def ratio(times: dict[str, list[float]], over: str, side: str) -> float:
    """The median over repeats of ``over``'s time / ``side``'s time in the same repeat."""
    return statistics.median(a / b for a, b in zip(times[over], times[side], strict=True))


def report(times: dict[str, list[float]], bare: str) -> None:
    """Median ms per side, and the median over repeats of bare_time / side_time."""
    for name, ts in times.items():
        line = f"  {name:<46} {1e3 * statistics.median(ts):8.2f} ms (min {1e3 * min(ts):7.2f})"
        if name != bare:
            line += f"   bare/this = {ratio(times, bare, name):.3f}"
        print(line)


def bare_generate(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention: Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    pad_token_id: int,
    eos_token_id: int,
) -> Tensor:
    """``model.generate`` with the sampling settings spelled out; (B, P + T) token ids."""
    model.eval()
    with torch.inference_mode():
        return model.generate(  # type: ignore[operator]
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_token_id,
            eos_token_id=eos_token_id,
        )


def bench_rollout(p: Parts, repeats: int) -> None:
    cfg, g = p.cfg, p.cfg.generation
    n = cfg.sampling.group_size
    examples = next_prompts(p.train, 0, cfg.sampling.prompts_per_step, cfg.seed)
    prompts = [encode_prompt(p.tokenizer, e.prompt) for e in examples]
    pad, eos = int(p.tokenizer.pad_token_id), int(p.tokenizer.eos_token_id)
    ids, attention = left_pad([q for q in prompts for _ in range(n)], pad, torch.device("cpu"))
    model = p.policy
    width = ids.shape[1]

    def bare() -> Tensor:
        torch.manual_seed(SAMPLING_SEED)
        return bare_generate(
            model,
            ids,
            attention,
            max_new_tokens=g.max_new_tokens,
            temperature=g.temperature,
            pad_token_id=pad,
            eos_token_id=eos,
        )

    def engine() -> list[list[Completion]]:
        torch.manual_seed(SAMPLING_SEED)
        return p.engine.generate(
            prompts, n=n, max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p
        )

    def rollout() -> object:
        torch.manual_seed(SAMPLING_SEED)
        return rollout_round(p, examples, first_group=0)

    model.train()  # as the loop leaves it: the engine and bare() switch to eval themselves
    name = f"rlmap {type(p.engine).__name__}.generate"
    if cfg.system.engine != "hf":  # vLLM: its own generate is the bare side
        responses = [c.response_ids for group in engine() for c in group]
        print(
            f"\nrollout on {cfg.system.engine}: {len(responses)} sequences, "
            f"{sum(map(len, responses))} response tokens"
        )
        times = alternate({name: engine, "rlmap rollout_round (headline)": rollout}, repeats)
        report(times, name)
        own = ratio(times, name, "rlmap rollout_round (headline)")
        print(
            f"  rollout_round / {name.removeprefix('rlmap ')}: generate_time / round_time = "
            f"{own:.3f} (target >= 0.9)"
        )
        return
    sequences = bare()[:, width:]
    responses = [c.response_ids for group in engine() for c in group]
    same = all(
        list(row[: len(r)]) == list(r) for row, r in zip(sequences.tolist(), responses, strict=True)
    )
    print(
        f"\nrollout: {len(responses)} sequences, prompt width {width}, "
        f"{sequences.shape[1]} decoding steps, {sum(map(len, responses))} response tokens; "
        f"same tokens on every side: {'yes' if same else 'NO'}"
    )
    times = alternate(
        {
            "bare model.generate": bare,
            "rlmap HFEngine.generate": engine,
            "rlmap rollout_round (headline)": rollout,
        },
        repeats,
    )
    report(times, "bare model.generate")
    own = ratio(times, "rlmap HFEngine.generate", "rlmap rollout_round (headline)")
    print(
        f"  rollout_round / HFEngine.generate: generate_time / round_time = {own:.3f} "
        f"(target >= 0.9)"
    )


def real_batch(p: Parts) -> tuple[Batch, Tensor]:
    """A batch of the preset sampled from the warm start, with π_ref and its advantages."""
    examples = next_prompts(p.train, 0, p.cfg.sampling.prompts_per_step, p.cfg.seed)
    torch.manual_seed(SAMPLING_SEED)
    batch = to_batch(rollout_round(p, examples, 0), pad_token_id=int(p.tokenizer.pad_token_id))
    batch, _ = prepare_batch(batch, p.policy, p.reference, p.settings)
    credit = estimators.registry.get(p.cfg.credit.estimator).fn(batch, p.cfg.credit)
    return batch, credit.advantages


def bare_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    adv_BT: Tensor,
    micro_batch_size: int,
) -> None:
    """−A·log π averaged over response tokens, backward, AdamW: nothing else."""
    tokens, mask = batch.tokens, batch.action_mask[:, 1:]
    attention = batch.attention_mask if batch.attention_mask is not None else mask
    count = mask.sum()
    for i in range(0, batch.size, micro_batch_size):
        rows = slice(i, i + micro_batch_size)
        logits = model(
            input_ids=tokens[rows],
            attention_mask=attention[rows],
            position_ids=position_ids(attention[rows]),
        ).logits[:, :-1]
        logp = logits.float().log_softmax(-1).gather(-1, tokens[rows, 1:, None]).squeeze(-1)
        loss = (-adv_BT[rows, 1:] * logp)[mask[rows]].sum() / count
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def bench_update(p: Parts, repeats: int) -> None:
    batch, adv_BT = real_batch(p)
    mbs = p.settings.schedule.micro_batch_size
    bare_model = copy.deepcopy(p.policy).train()
    bare_optimizer = torch.optim.AdamW(
        bare_model.parameters(), lr=p.cfg.optim.lr, weight_decay=p.cfg.optim.weight_decay
    )
    generator = torch.Generator().manual_seed(0)

    def rlmap() -> object:
        return update_policy(
            p.policy,
            p.optimizer,
            p.scheduler,
            batch,
            adv_BT,
            p.settings,
            learner_version=0,
            generator=generator,
        )

    print(
        f"\nupdate: {batch.size} rows × {batch.tokens.shape[1]} tokens, "
        f"{int(batch.action_mask.sum())} response tokens, one optimiser step "
        f"(rlmap: {p.settings.schedule.optimizer_steps} step, micro-batches of {mbs}, "
        f"KL {p.cfg.kl.placement}, reduction {p.cfg.reduction.name})"
    )
    times = alternate(
        {
            "bare fwd+bwd+AdamW, whole batch": lambda: bare_step(
                bare_model, bare_optimizer, batch, adv_BT, batch.size
            ),
            f"bare fwd+bwd+AdamW, micro-batches of {mbs}": lambda: bare_step(
                bare_model, bare_optimizer, batch, adv_BT, mbs
            ),
            "rlmap update_policy (headline)": rlmap,
        },
        repeats,
    )
    report(times, "bare fwd+bwd+AdamW, whole batch")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="grpo", help="preset whose sizes are used")
    parser.add_argument("--prompts", type=int, help="sampling.prompts_per_step (preset's)")
    parser.add_argument("--group", type=int, help="sampling.group_size G (preset's)")
    parser.add_argument("--max-new-tokens", type=int, help="generation.max_new_tokens")
    parser.add_argument("--micro-batch-size", type=int, help="optim.micro_batch_size")
    parser.add_argument("--repeats", type=int, default=15, help="alternating repeats (>= 7)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value config overrides")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = {
        "sampling.prompts_per_step": args.prompts,
        "sampling.group_size": args.group,
        "generation.max_new_tokens": args.max_new_tokens,
        "optim.micro_batch_size": args.micro_batch_size,
    }
    overrides = [f"{k}={v}" for k, v in sizes.items() if v is not None] + args.overrides
    cfg = build_config(args.recipe, None, overrides)
    transformers.utils.logging.disable_progress_bar()
    start = model_path(cfg)
    torch.manual_seed(cfg.seed)
    parts = build(cfg, start)
    s, g = cfg.sampling, cfg.generation
    print(environment())
    print(
        f"recipe {cfg.recipe}, checkpoint {start}\n"
        f"P={s.prompts_per_step} prompts × G={s.group_size} = {s.prompts_per_step * s.group_size} "
        f"rollouts, max_new_tokens={g.max_new_tokens}, temperature={g.temperature}, "
        f"top_p={g.top_p}, top_k=0; {args.repeats} alternating repeats, medians"
    )
    bench_rollout(parts, args.repeats)
    bench_update(parts, args.repeats)


if __name__ == "__main__":
    main()
