"""The value critic: alignment, bootstrap from V(s_final), masked gradients, micro-batching."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlmap.core.batch import Batch, End, RewardStatus
from rlmap.engines.engine import Completion
from rlmap.engines.hf import HFEngine
from rlmap.estimators import CreditParams, registry
from rlmap.learner.critic import (
    CriticSettings,
    align_values,
    compute_values,
    critic_loss,
    critic_outputs,
    load_critic,
    update_critic,
    value_weights,
)
from rlmap.learner.update_loop import Schedule
from rlmap.rollout.episodes import single_turn
from rlmap.rollout.packing import Scored, to_batch
from rlmap.system.loop_state import LoopState, warmup_progress
from rlmap.tasks.prompts import encode_prompt


def _critic(model_dir: Path, seed: int = 0) -> torch.nn.Module:
    """A critic whose head gives visibly different values at different positions."""
    critic = load_critic(model_dir, dtype=torch.float32, seed=seed)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        head = critic.get_submodule("score")
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen))
        head.bias.fill_(0.3)
    return critic


def test_value_alignment_hand_case() -> None:
    # outputs[i, p] = 10·i + p, so every entry names its own position.
    # Row 0: [pad | prompt prompt | a a a]        (left padding, no right padding)
    #   V(s_t) at action column t is the output at t − 1: columns 3, 4, 5 → 2, 3, 4;
    #   V(s_final) is the output at the last real column 5 → 5.
    # Row 1: [prompt prompt prompt | a | pad pad] (a shorter response, right padding)
    #   action column 3 → output at 2 = 12; last real column is 3 → 13 (not the padding's 15).
    outputs = torch.arange(6.0).repeat(2, 1) + torch.tensor([[0.0], [10.0]])
    attention = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    action = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 0, 0]], dtype=torch.bool)
    values, bootstrap = align_values(outputs, action, attention)
    torch.testing.assert_close(values, torch.tensor([[0, 0, 0, 2, 3, 4], [0, 0, 0, 12, 0, 0.0]]))
    torch.testing.assert_close(bootstrap, torch.tensor([5.0, 13.0]))


def _completion(prompt: tuple[int, ...], response: tuple[int, ...], stopped: bool) -> Completion:
    return Completion(prompt, response, tuple(0.0 for _ in response), stopped, 0)


def test_values_of_a_padded_row_equal_those_of_the_row_alone(tiny_model_dir: Path) -> None:
    # Uneven prompts and responses: left padding and right padding must change nothing,
    # which holds only with position ids counted over real tokens.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    critic = _critic(tiny_model_dir)
    rows = [
        _completion(tuple(encode_prompt(tokenizer, "1+2=")), (5, 6, 7, 8), stopped=True),
        _completion(tuple(encode_prompt(tokenizer, "37+85=")), (9,), stopped=False),
    ]
    scored = [Scored(single_turn(c), i, 0.0, 0.0, RewardStatus.OK) for i, c in enumerate(rows)]
    batch = to_batch(scored, pad_token_id=tokenizer.pad_token_id)
    values, bootstrap = compute_values(critic, batch, micro_batch_size=2)
    for i, c in enumerate(rows):
        alone = torch.tensor([[*c.prompt_ids, *c.response_ids]])
        with torch.no_grad():
            out = critic_outputs(critic, alone, torch.ones_like(alone, dtype=torch.bool))[0]
        p = len(c.prompt_ids)
        # V(s_t) of the k-th response token reads prompt + response[:k] = output at p + k − 1.
        torch.testing.assert_close(values[i][batch.action_mask[i]], out[p - 1 : -1])
        torch.testing.assert_close(bootstrap[i], out[-1])


def test_truncated_advantage_bootstraps_from_the_critic_terminal_does_not(
    tiny_model_dir: Path,
) -> None:
    # Two identical rows, one ended by EOS (terminal), one by the length limit (truncated),
    # both with reward 1. At the last action token (GAE, γ = 1):
    #   terminal:  Â = r − V_last
    #   truncated: Â = r + V(s_final) − V_last, V(s_final) = critic output at the last token.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    critic = _critic(tiny_model_dir)
    prompt, response = tuple(encode_prompt(tokenizer, "4+4=")), (5, 6, 7)
    rows = [
        _completion(prompt, response, stopped=True),
        _completion(prompt, response, stopped=False),
    ]
    scored = [Scored(single_turn(c), i, 1.0, 1.0, RewardStatus.OK) for i, c in enumerate(rows)]
    batch = to_batch(scored, pad_token_id=tokenizer.pad_token_id)
    assert batch.end.tolist() == [End.TERMINAL, End.TRUNCATED]
    values, bootstrap = compute_values(critic, batch, micro_batch_size=1)
    batch = batch.replace(values=values, bootstrap_values=bootstrap)
    credit = registry.get("gae").fn(batch, CreditParams(estimator="gae", gamma=1.0, lam=0.9))
    with torch.no_grad():
        ids = torch.tensor([[*prompt, *response]])
        out = critic_outputs(critic, ids, torch.ones_like(ids, dtype=torch.bool))[0]
    v_last, v_final = out[-2], out[-1]
    assert abs(float(v_final)) > 1e-3  # the bootstrap term is visible
    last = batch.action_mask[0].nonzero().max()
    torch.testing.assert_close(credit.advantages[0, last], 1.0 - v_last)
    torch.testing.assert_close(credit.advantages[1, last], 1.0 + v_final - v_last)
    assert credit.returns is not None  # the critic's target bootstraps as well
    torch.testing.assert_close(credit.returns[1, last] - credit.returns[0, last], v_final)


def test_prompt_observation_and_padding_positions_get_no_value_gradient() -> None:
    # Row 0: [pad | p p | a a | obs obs | a | pad]  — a second turn after an observation.
    # Row 1: the same layout, but its reward is an infrastructure error (excluded row).
    # Output p is V(state after token p); it is trained only where token p + 1 is an action
    # of a valid row (the state an action was chosen in): columns 2, 3, 6 of row 0.
    action = torch.tensor([[0, 0, 0, 1, 1, 0, 0, 1, 0]] * 2, dtype=torch.bool)
    attention = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1, 0]] * 2, dtype=torch.bool)
    gen = torch.Generator().manual_seed(0)
    outputs = torch.randn(action.shape, generator=gen, requires_grad=True)
    old, _ = align_values(outputs.detach() + 0.1, action, attention)
    batch = Batch(
        tokens=torch.zeros(action.shape, dtype=torch.long),
        action_mask=action,
        behavior_logprobs=torch.zeros(action.shape),
        rewards=torch.ones(2),
        group_id=torch.arange(2),
        end=torch.zeros(2, dtype=torch.long),
        reward_status=torch.tensor([RewardStatus.OK, RewardStatus.INFRA_ERROR]),
        attention_mask=attention,
        values=old,
    )
    returns = torch.randn(action.shape, generator=gen) * action
    weights = value_weights(batch)
    critic_loss(outputs, batch, returns, weights, value_clip=0.5).backward()
    assert outputs.grad is not None
    trained = torch.zeros_like(action)
    trained[0, [2, 3, 6]] = True
    assert (outputs.grad[~trained] == 0).all()
    assert (outputs.grad[trained] != 0).all()


def _rollout_batch(model_dir: Path) -> Batch:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFEngine(
        policy, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    prompts = [encode_prompt(tokenizer, p) for p in ("1+2=", "37+85=", "9+9=")]  # uneven
    torch.manual_seed(0)
    groups = engine.generate(prompts, n=4, max_new_tokens=6, temperature=1.0, top_p=1.0)
    rewards = torch.randint(0, 2, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    completions = [c for group in groups for c in group]
    scored = [
        Scored(single_turn(c), i // 4, float(r), float(r), RewardStatus.OK)
        for i, (c, r) in enumerate(zip(completions, rewards, strict=True))
    ]
    return to_batch(scored, pad_token_id=tokenizer.pad_token_id)


@pytest.mark.parametrize("minibatches", [1, 2])
def test_critic_update_does_not_depend_on_micro_batch_size(
    tiny_model_dir: Path, minibatches: int
) -> None:
    batch = _rollout_batch(tiny_model_dir)
    start = _critic(tiny_model_dir).double()
    values, bootstrap = compute_values(start, batch, micro_batch_size=4)
    batch = batch.replace(values=values, bootstrap_values=bootstrap)
    returns = torch.rand(batch.tokens.shape, generator=torch.Generator().manual_seed(2)).double()
    returns = returns * batch.action_mask
    results = []
    for micro in (batch.size, 5, 1):
        critic = copy.deepcopy(start)
        optimizer = torch.optim.SGD(critic.parameters(), lr=0.05)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        schedule = Schedule(
            epochs=1, minibatches=minibatches, micro_batch_size=micro, max_grad_norm=1e9
        )
        s = CriticSettings(value_clip=0.5, updates=2, schedule=schedule)
        metrics = update_critic(
            critic,
            optimizer,
            scheduler,
            batch,
            returns,
            s,
            generator=torch.Generator().manual_seed(0),
        )
        assert metrics["optim/critic_steps"] == 2 * minibatches
        results.append(torch.cat([p.detach().flatten() for p in critic.parameters()]))
    assert all(torch.isfinite(r).all() for r in results)
    before = torch.cat([p.detach().flatten() for p in start.parameters()])
    assert not torch.allclose(results[0], before)  # the update did something
    for other in results[1:]:
        assert torch.allclose(results[0], other, atol=1e-10, rtol=0)


def test_critic_update_lowers_the_value_loss(tiny_model_dir: Path) -> None:
    batch = _rollout_batch(tiny_model_dir)
    critic = _critic(tiny_model_dir)
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    returns = batch.rewards.unsqueeze(-1) * batch.action_mask  # Monte-Carlo return, γ = 1
    s = CriticSettings(
        value_clip=10.0,
        updates=1,
        schedule=Schedule(epochs=1, minibatches=1, micro_batch_size=4, max_grad_norm=1.0),
    )
    losses = []
    for _ in range(8):
        values, bootstrap = compute_values(critic, batch, micro_batch_size=4)
        step = batch.replace(values=values, bootstrap_values=bootstrap)
        metrics = update_critic(
            critic,
            optimizer,
            scheduler,
            step,
            returns,
            s,
            generator=torch.Generator().manual_seed(0),
        )
        losses.append(metrics["critic/value_loss"])
    assert losses[-1] < 0.5 * losses[0]


def test_load_critic_is_seeded_and_refuses_a_trunk_that_did_not_load(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    a = load_critic(tiny_model_dir, dtype=torch.float32, seed=3)
    torch.manual_seed(123)  # the global stream must not matter
    b = load_critic(tiny_model_dir, dtype=torch.float32, seed=3)
    assert torch.equal(a.get_submodule("score").weight, b.get_submodule("score").weight)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.testing.assert_close(
        a.get_submodule("model.embed_tokens").weight,
        policy.get_submodule("model.embed_tokens").weight,
    )
    trunkless = copy.deepcopy(policy)
    del trunkless.model.norm
    trunkless.model.norm = torch.nn.Identity()
    trunkless.save_pretrained(tmp_path / "broken")
    with pytest.raises(ValueError, match=r"model\.norm\.weight"):
        load_critic(tmp_path / "broken", dtype=torch.float32, seed=0)


def test_a_new_value_head_is_the_cpus_draw_from_the_seed_wherever_it_loads(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The head is N(0, 0.02²) drawn from a CPU generator seeded 3 (initializer_range 0.02,
    # the tiny config's), bias 0 — as transformers draws it on a CPU after manual_seed(3).
    # On a GPU transformers would draw from the GPU's generator; stand that in by making
    # manual_seed do nothing, so its draw comes from whatever the global stream holds.
    expected = torch.empty(1, 32).normal_(0.0, 0.02, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(99)
    monkeypatch.setattr(torch, "manual_seed", lambda seed: None)
    critic = load_critic(tiny_model_dir, dtype=torch.float32, seed=3)
    assert torch.equal(critic.get_submodule("score").weight.detach(), expected)
    assert torch.equal(critic.get_submodule("score").bias.detach(), torch.zeros(1))


def test_value_pretraining_stops_after_three_steps_without_a_better_explained_variance() -> None:
    # EVs 0.1, 0.3, 0.2, 0.3 (equal is no improvement), NaN (all returns equal), 0.35 → the
    # best stays 0.3 from the second step, and the third non-improving step in a row ends it.
    state = LoopState()
    for ev in (0.1, 0.3, 0.2, 0.3):
        state = warmup_progress(state, ev)
        assert not state.critic_warmup_done
    state = warmup_progress(state, math.nan)
    assert (state.critic_best_ev, state.critic_ev_stale, state.critic_warmup_done) == (0.3, 3, True)
    again = warmup_progress(warmup_progress(LoopState(), 0.1), 0.2)
    assert (again.critic_best_ev, again.critic_ev_stale) == (0.2, 0)
