"""GRPO on the embedded default in one page, from rlmap's public pieces.

This is the whole algorithm with the machinery left out: sample G answers per prompt with
the rollout engine, score them with the verifier, normalise rewards within each group
(the credit axis), take one PPO-clip step (the behaviour axis) on the token-mean loss
(the reduction axis). `rlmap train --recipe grpo` runs the same composition with
everything around it: evaluation, checkpoints, the ledger, resume, plots, faults.

How it departs from the full trainer (and from the paper):
1) No KL to a reference model: the trust region is the clip alone.
2) One optimiser step per batch, so π_old is the current policy and ρ = 1 on the first
   (only) step; the clip never fires. The ratio that is not 1 is d = π/μ, which is
   logged, not corrected.
3) No failure handling: a verifier that raises stops the script.

    python examples/minimal_grpo.py                      # the embedded default (warm start)
    python examples/minimal_grpo.py --model DIR --steps 5
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase as Tokenizer

from rlmap.core.batch import Batch, RewardStatus
from rlmap.correction import BehaviourParams, KLParams, PolicyTerms, policy_loss
from rlmap.engines.hf import HFEngine
from rlmap.estimators import grpo_advantages
from rlmap.feedback.verifiers import exact_match
from rlmap.learner.logprobs import attention_of, token_logprobs
from rlmap.reduction import ReductionParams, reduce, token_weights
from rlmap.rollout.episodes import single_turn
from rlmap.rollout.packing import Scored, to_batch
from rlmap.tasks.arithmetic import Example, make_splits
from rlmap.tasks.prompts import decode_response, encode_prompt

G, PROMPTS, MAX_NEW, LR = 8, 8, 16, 5e-5  # the grpo preset's sizes on the embedded default


def sample(engine: HFEngine, tokenizer: Tokenizer, examples: list[Example], n: int) -> list[Scored]:
    """n answers per prompt, each scored by the exact-match verifier (its group: the prompt)."""
    prompts = [encode_prompt(tokenizer, e.prompt) for e in examples]
    groups = engine.generate(prompts, n=n, max_new_tokens=MAX_NEW, temperature=1.0, top_p=1.0)
    scored = []
    for g, (example, completions) in enumerate(zip(examples, groups, strict=True)):
        for c in completions:
            r = exact_match(decode_response(tokenizer, c.response_ids), example.answer)
            scored.append(Scored(single_turn(c), g, r, r, RewardStatus.OK))
    return scored


def grpo_step(
    policy: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch
) -> dict[str, float]:
    """Advantages, objective, reduction, one step: the four axes a sync GRPO step touches."""
    adv_B = grpo_advantages(batch.rewards, batch.group_id, batch.valid)  # (B,) (R − mean) / std
    adv_BT = adv_B[:, None] * batch.action_mask  # the outcome's advantage on every action token
    logprobs_BT, _ = token_logprobs(policy, batch.tokens, attention_of(batch))  # log π_θ
    terms = PolicyTerms(
        logprobs=logprobs_BT,
        old_logprobs=logprobs_BT.detach(),  # π_old = π_θ
        behavior_logprobs=batch.behavior_logprobs,  # log μ, from the engine
        advantages=adv_BT,
        mask=batch.action_mask,
    )
    j_BT, diag = policy_loss(terms, BehaviourParams(objective="ppo_clip"), KLParams())
    loss = reduce(j_BT, token_weights(batch.action_mask, ReductionParams(name="token_mean")))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    return {
        "loss": float(loss.detach()),
        "reward": float(batch.rewards.mean()),
        "max|log d|": float(diag["ratio/d/max_abs_log"]),
    }


def pass_at_1(engine: HFEngine, tokenizer: Tokenizer, heldout: list[Example]) -> float:
    with torch.random.fork_rng():
        torch.manual_seed(12345)
        return sum(s.reward for s in sample(engine, tokenizer, heldout, 1)) / len(heldout)


def main(model_dir: Path | None, steps: int, heldout_size: int) -> tuple[float, float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model_dir is None:  # the embedded default: built and warm-started once, then cached
        from rlmap.assembly.models import model_path
        from rlmap.recipes import build_config

        model_dir = model_path(build_config())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFEngine(
        policy, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )  # shares the policy's weights
    optimizer = torch.optim.AdamW(policy.parameters(), lr=LR)
    train, heldout = make_splits(0, 6000, 256)
    heldout = heldout[:heldout_size]
    torch.manual_seed(0)
    before = pass_at_1(engine, tokenizer, heldout)
    for step in range(steps):
        examples = train[step * PROMPTS : (step + 1) * PROMPTS]
        batch = to_batch(
            sample(engine, tokenizer, examples, G), pad_token_id=tokenizer.pad_token_id
        )
        stats = grpo_step(policy, optimizer, batch)
        print(f"step {step + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in stats.items()))
    after = pass_at_1(engine, tokenizer, heldout)
    print(f"held-out pass@1 {before:.3f} -> {after:.3f}")
    return before, after


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, default=None, help="a model directory (default: embedded)"
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--heldout", type=int, default=256, help="held-out prompts scored")
    args = parser.parse_args()
    main(args.model, args.steps, args.heldout)
