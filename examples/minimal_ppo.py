"""PPO with a critic and GAE on the embedded default in one page, from rlmap's public pieces.

Read examples/minimal_grpo.py first: this page keeps its sampling and swaps the credit axis.
One answer per prompt (no group to compare with), so the baseline is a learned value V(s_t):
a critic model scores every state, GAE turns its values and the reward into per-token
advantages and critic targets, PPO's clipped objective takes the policy step on the token
mean, and the critic takes a clipped value-loss step toward its targets.
`rlmap train --recipe ppo` runs the same composition with everything around it.

The critic is the ppo preset's: the start checkpoint's trunk plus a fresh one-output head
(``AutoModelForTokenClassification``), a model of its own with its own AdamW (lr 3e-4).
Its output at column p reads tokens ≤ p: V(state after p). The action at column t is chosen
after tokens < t, so V(s_t) = output[t − 1]; an answer cut at MAX_NEW tokens is truncated,
not ended, and bootstraps with V(s_final) = the output at its last token.

How it departs from the full trainer: no KL, no failure handling, and one optimiser step per
batch (the preset's schedule), so π_old = π_θ and V_old = V: neither clip fires on it.

    python examples/minimal_ppo.py                      # the embedded default (warm start)
    python examples/minimal_ppo.py --model DIR --steps 5
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from minimal_grpo import pass_at_1, sample  # the same sampling, verifier and pass@1
from torch import Tensor, nn

from rlmap.core.batch import Batch, End
from rlmap.engines.hf import HFEngine
from rlmap.learner.critic import load_critic
from rlmap.learner.logprobs import attention_of, position_ids, token_logprobs
from rlmap.reduction import ReductionParams, reduce, token_weights
from rlmap.rollout.packing import to_batch
from rlmap.tasks.arithmetic import make_splits

PROMPTS, LR, CRITIC_LR = 64, 5e-5, 3e-4  # the ppo preset on the embedded default (G = 1)
GAMMA, LAM, CLIP, VALUE_CLIP = 1.0, 0.95, 0.2, 0.5  # credit, behaviour and critic sections
MAX_GRAD_NORM, WEIGHT_DECAY = 1.0, 0.0  # the optim section's AdamW


def values(critic: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
    """(V(s_t) on the action columns (B, T), V(s_final) (B,)): the critic's output one back."""
    attention_BT = attention_of(batch)
    positions_BT = position_ids(attention_BT)  # counted over real tokens, as for the policy
    out = critic(input_ids=batch.tokens, attention_mask=attention_BT, position_ids=positions_BT)
    out_BT = out.logits[..., 0]  # (B, T, 1) -> (B, T): V(state after tokens ≤ p)
    before_BT = torch.cat([torch.zeros_like(out_BT[:, :1]), out_BT[:, :-1]], dim=1)
    last_B = attention_BT.long().cumsum(-1).argmax(-1)  # the first max: the last real token
    return torch.where(batch.action_mask, before_BT, 0.0), out_BT.gather(1, last_B[:, None])[:, 0]


def gae(batch: Batch, values_BT: Tensor, final_B: Tensor) -> tuple[Tensor, Tensor]:
    """(advantages Â, critic targets Â + V), (B, T), right to left over the action tokens:

    δ_t = r_t + γ V_{t+1} − V_t,  Â_t = δ_t + γ λ Â_{t+1};  after the last action V = V(s_final)
    if the answer was truncated, 0 if it ended, and the trace stops.
    """
    mask_BT = batch.action_mask & batch.valid[:, None]  # invalid rows get no credit
    truncated_B = (batch.end == End.TRUNCATED) & batch.valid
    next_value_B = torch.where(truncated_B, final_B, 0.0)
    next_adv_B = torch.zeros_like(final_B)
    adv_BT = torch.zeros_like(values_BT)
    for t in reversed(range(values_BT.shape[1])):  # off the mask V and Â carry through
        delta_B = batch.step_rewards[:, t] + GAMMA * next_value_B - values_BT[:, t]
        adv_B = delta_B + GAMMA * LAM * next_adv_B
        on = mask_BT[:, t]
        adv_BT[:, t] = torch.where(on, adv_B, 0.0)
        next_value_B = torch.where(on, values_BT[:, t], next_value_B)
        next_adv_B = torch.where(on, adv_B, next_adv_B)
    return adv_BT, torch.where(mask_BT, adv_BT + values_BT, 0.0)


def step(model: nn.Module, optimizer: torch.optim.Optimizer, loss: Tensor) -> None:
    """One optimiser step on ``loss``, its gradient norm clipped (the preset's)."""
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()


def ppo_step(
    policy: nn.Module,
    critic: nn.Module,
    optimizer: torch.optim.Optimizer,
    critic_optimizer: torch.optim.Optimizer,
    batch: Batch,
) -> dict[str, float]:
    """Values, GAE, one policy step and one critic step: the ppo preset's sync step."""
    critic.eval()
    with torch.no_grad():
        old_values_BT, final_B = values(critic, batch)  # V_old, before either model moves
    critic.train()
    adv_BT, returns_BT = gae(batch, old_values_BT, final_B)

    logprobs_BT, _ = token_logprobs(policy, batch.tokens, attention_of(batch))  # log π_θ
    ratio_BT = (logprobs_BT - logprobs_BT.detach()).exp()  # π_θ / π_old, π_old = π_θ here
    j_BT = torch.maximum(-adv_BT * ratio_BT, -adv_BT * ratio_BT.clamp(1 - CLIP, 1 + CLIP))
    mask_BT = batch.action_mask
    loss = reduce(j_BT, token_weights(mask_BT, ReductionParams(name="token_mean")))
    step(policy, optimizer, loss)

    values_BT, _ = values(critic, batch)  # V with gradients, clipped to V_old ± ε_v
    clipped_BT = old_values_BT + (values_BT - old_values_BT).clamp(-VALUE_CLIP, VALUE_CLIP)
    v_BT = 0.5 * torch.maximum((values_BT - returns_BT) ** 2, (clipped_BT - returns_BT) ** 2)
    train_BT = batch.action_mask & batch.valid[:, None]  # every valid state weighs the same
    value_loss = reduce(v_BT, token_weights(train_BT, ReductionParams(name="token_mean")))
    step(critic, critic_optimizer, value_loss)
    return {
        "loss": float(loss.detach()),
        "value_loss": float(value_loss.detach()),
        "reward": float(batch.rewards.mean()),
        "mean V": float(old_values_BT[train_BT].mean()),
    }


def main(model_dir: Path | None, steps: int, heldout_size: int) -> tuple[float, float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model_dir is None:  # the embedded default: built and warm-started once, then cached
        from rlmap.assembly.models import model_path
        from rlmap.recipes import build_config

        model_dir = model_path(build_config("ppo"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    critic = load_critic(model_dir, dtype=torch.float32, seed=0)  # trunk + new value head
    engine = HFEngine(
        policy, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )  # shares the policy's weights
    optimizer = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    critic_optimizer = torch.optim.AdamW(
        critic.parameters(), lr=CRITIC_LR, weight_decay=WEIGHT_DECAY
    )
    train, heldout = make_splits(0, 6000, 256)
    heldout = heldout[:heldout_size]
    torch.manual_seed(0)
    before = pass_at_1(engine, tokenizer, heldout)
    for i in range(steps):
        examples = train[i * PROMPTS : (i + 1) * PROMPTS]
        batch = to_batch(
            sample(engine, tokenizer, examples, 1), pad_token_id=tokenizer.pad_token_id
        )
        stats = ppo_step(policy, critic, optimizer, critic_optimizer, batch)
        print(f"step {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in stats.items()))
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
