"""The learner: log-probs agree with the rollout engine, and micro-batching changes nothing."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlmap.core.batch import RewardStatus
from rlmap.correction import BehaviourParams, KLParams, PolicyTerms, policy_loss
from rlmap.engines.hf import HFEngine
from rlmap.learner.logprobs import token_logprobs
from rlmap.learner.policy import UpdateSettings, approx_kl, prepare_batch, update_policy
from rlmap.learner.update_loop import Schedule
from rlmap.reduction import ReductionParams, reduce, token_weights
from rlmap.rollout.episodes import single_turn
from rlmap.rollout.packing import Scored, to_batch
from rlmap.tasks.prompts import encode_prompt


def _rollouts(model_dir: Path, n: int = 4) -> tuple[torch.nn.Module, list[Scored], int]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFEngine(
        model, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    prompts = [encode_prompt(tokenizer, p) for p in ("1+2=", "37+85=", "9+9=")]  # uneven lengths
    torch.manual_seed(0)
    groups = engine.generate(prompts, n=n, max_new_tokens=6, temperature=1.0, top_p=1.0)
    gen = torch.Generator().manual_seed(1)
    scored = [
        Scored(single_turn(c), g, float(r), float(r), RewardStatus.OK)
        for g, group in enumerate(groups)
        for c, r in zip(group, torch.randint(0, 2, (n,), generator=gen).tolist(), strict=True)
    ]
    return model, scored, tokenizer.pad_token_id


def test_learner_logprobs_match_the_engine_behaviour_logprobs(tiny_model_dir: Path) -> None:
    # Same weights, same precision, left padding in both: κ = π_old/μ_old must be 1 up to
    # float32 noise. Position ids counted over real tokens are what makes this hold.
    model, scored, pad = _rollouts(tiny_model_dir)
    batch = to_batch(scored, pad_token_id=pad)
    assert batch.attention_mask is not None
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, batch.tokens, batch.attention_mask)
    gap = (logprobs - batch.behavior_logprobs)[batch.action_mask].abs().max()
    assert float(gap) < 1e-4


def _settings(reduction: str, micro: int, **behaviour: object) -> UpdateSettings:
    return UpdateSettings(
        behaviour=BehaviourParams(**behaviour),  # type: ignore[arg-type]
        kl=KLParams(),
        reduction=ReductionParams(name=reduction, max_len=8),
        schedule=Schedule(epochs=1, minibatches=1, micro_batch_size=micro, max_grad_norm=1e9),
        temperature=1.0,
    )


def rescheduled(s: UpdateSettings, **fields: Any) -> UpdateSettings:
    """``s`` with some of its schedule's fields replaced."""
    return replace(s, schedule=replace(s.schedule, **fields))


@pytest.mark.parametrize(
    "reduction",
    [
        "response_mean",
        "token_mean",
        "fixed_budget",
        "prompt_mean",
        "token_sum",
        "seq_mean_token_sum",
    ],
)
def test_update_does_not_depend_on_micro_batch_size(tiny_model_dir: Path, reduction: str) -> None:
    model, scored, pad = _rollouts(tiny_model_dir)
    batch = to_batch(scored, pad_token_id=pad)
    advantages = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(2))
    advantages = advantages * batch.action_mask
    results = []
    for micro in (batch.size, 5, 1):
        policy = copy.deepcopy(model).double()
        optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        s = _settings(reduction, micro, positive_nll=0.1)
        prepared, _ = prepare_batch(batch, policy, None, s)
        update_policy(
            policy,
            optimizer,
            scheduler,
            prepared,
            advantages.double(),
            s,
            learner_version=0,
            generator=torch.Generator().manual_seed(0),
        )
        results.append(torch.cat([p.detach().flatten() for p in policy.parameters()]))
    start = torch.cat([p.detach().flatten().double() for p in model.parameters()])
    assert not torch.allclose(results[0], start)  # the update did something
    for other in results[1:]:
        assert torch.allclose(results[0], other, atol=1e-10, rtol=0)


def test_reused_batch_recomputes_old_logprobs_only_when_needed(tiny_model_dir: Path) -> None:
    model, scored, pad = _rollouts(tiny_model_dir)
    batch = to_batch(scored, pad_token_id=pad)
    once = _settings("token_mean", 4)
    prepared, timings = prepare_batch(batch, model, None, once)
    assert prepared.old_logprobs is None and timings == {}  # π_old = sg(π_θ): nothing ran
    twice = rescheduled(once, epochs=2)
    prepared, timings = prepare_batch(batch, model, None, twice)
    old = prepared.old_logprobs
    assert old is not None and torch.allclose(
        old[batch.action_mask], batch.behavior_logprobs[batch.action_mask], atol=1e-4
    )
    assert set(timings) == {"system/old_logprobs_s"} and timings["system/old_logprobs_s"] > 0
    bypass = replace(twice, behaviour=BehaviourParams(mode="bypass"))
    prepared, timings = prepare_batch(batch, model, None, bypass)
    assert prepared.old_logprobs is None and timings == {}


def test_reference_time_is_reported_only_when_the_reference_runs(tiny_model_dir: Path) -> None:
    # The ledger charges π_ref's forward pass to the reference; it must not see a time
    # (not even 0.0) when there is no reference or the KL is off.
    model, scored, pad = _rollouts(tiny_model_dir)
    batch = to_batch(scored, pad_token_id=pad)
    reference = copy.deepcopy(model)
    off = _settings("token_mean", 4)  # KLParams() places no KL
    prepared, timings = prepare_batch(batch, model, reference, off)
    assert prepared.ref_logprobs is None and timings == {}
    on = replace(off, kl=KLParams(placement="loss", beta=0.1))
    prepared, timings = prepare_batch(batch, model, None, on)
    assert prepared.ref_logprobs is None and timings == {}  # KL on, but no reference model
    prepared, timings = prepare_batch(batch, model, reference, on)
    assert prepared.ref_logprobs is not None
    assert set(timings) == {"system/reference_s"} and timings["system/reference_s"] > 0
    both = rescheduled(on, epochs=2)
    _, timings = prepare_batch(batch, model, reference, both)
    assert set(timings) == {"system/old_logprobs_s", "system/reference_s"}


@pytest.mark.parametrize("corrections", [(), ("tis",), ("icepop",)])
def test_diagnostics_do_not_depend_on_micro_batch_size(
    tiny_model_dir: Path, corrections: tuple[str, ...]
) -> None:
    # Before: each figure was averaged over micro-batches, so the same batch gave
    # ratio/d/max_abs_log 0.707 with micro-batches of 12 and 0.436 with micro-batches of 1.
    model, scored, pad = _rollouts(tiny_model_dir)
    batch = to_batch(scored, pad_token_id=pad)
    noise = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(3))
    stale = batch.replace(behavior_logprobs=batch.behavior_logprobs + 0.5 * noise)  # μ ≠ π
    advantages = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(2))
    figures = []
    for micro in (batch.size, 5, 1):
        policy = copy.deepcopy(model).double()
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        s = rescheduled(
            _settings("token_mean", micro, corrections=corrections), epochs=2, minibatches=2
        )
        prepared, _ = prepare_batch(stale, policy, None, s)
        figures.append(
            update_policy(
                policy,
                optimizer,
                scheduler,
                prepared,
                advantages.double() * batch.action_mask,
                s,
                learner_version=0,
                generator=torch.Generator().manual_seed(0),
            )
        )
    keys = [k for k in figures[0] if k.startswith(("ratio/", "entropy", "kl/", "approx_kl"))]
    assert {
        "ratio/d/max_abs_log",
        "ratio/d/p99_abs_log",
        "ratio/rho/clipped_frac",
        "ratio/kappa/p99_abs_log",
        "entropy",
        "approx_kl",
    } <= set(keys)
    assert figures[0]["ratio/d/max_abs_log"] > 0.5  # the noise is there to be seen
    # 2 epochs × 2 mini-batches: every update after the first sees π_θ ≠ π_old
    assert figures[0]["approx_kl"] > 0
    for other in figures[1:]:
        for key in keys:
            assert other[key] == pytest.approx(figures[0][key], rel=1e-9, abs=1e-12), key


def test_the_max_is_the_max_and_p99_the_quantile_of_every_token_of_every_update(
    tiny_model_dir: Path,
) -> None:
    # A reference loop: the same two optimiser steps done by hand, |log d| collected over
    # every action token of both steps, reduced once.
    model, scored, pad = _rollouts(tiny_model_dir)
    batch = to_batch(scored, pad_token_id=pad)
    noise = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(3))
    stale = batch.replace(behavior_logprobs=batch.behavior_logprobs + 0.5 * noise)
    advantages = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(2))
    advantages = advantages.double() * batch.action_mask
    s = rescheduled(_settings("token_mean", 4), minibatches=2)
    policy = copy.deepcopy(model).double()
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    prepared, _ = prepare_batch(stale, policy, None, s)
    reference = copy.deepcopy(policy)
    got = update_policy(
        policy,
        optimizer,
        scheduler,
        prepared,
        advantages,
        s,
        learner_version=0,
        generator=torch.Generator().manual_seed(0),
    )

    values = []
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    order = torch.randperm(batch.size, generator=torch.Generator().manual_seed(0))
    for rows in order.tensor_split(2):
        mb = prepared.select(rows)
        logprobs, _ = token_logprobs(reference, mb.tokens, mb.attention_mask)
        values.append((logprobs.detach() - mb.behavior_logprobs)[mb.action_mask].abs())
        terms = PolicyTerms(
            logprobs=logprobs,
            old_logprobs=logprobs.detach(),
            behavior_logprobs=mb.behavior_logprobs,
            advantages=advantages[rows],
            mask=mb.action_mask,
            policy_version=None,
            learner_version=0,
        )
        j, _ = policy_loss(terms, s.behaviour, s.kl, None)
        reduce(j, token_weights(mb.action_mask, s.reduction)).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    every = torch.cat(values).double()
    # float32 inside the ratio math: agreement to 1e-6, not to the last bit
    assert got["ratio/d/max_abs_log"] == pytest.approx(float(every.max()), rel=1e-6)
    assert got["ratio/d/p99_abs_log"] == pytest.approx(float(every.quantile(0.99)), rel=1e-6)
    assert got["ratio/d/mean_abs_log"] == pytest.approx(float(every.mean()), rel=1e-6)


def test_vtrace_reads_the_learners_policy_on_a_stale_batch_with_one_optimiser_step(
    tiny_model_dir: Path,
) -> None:
    # Before: π_old was computed only for several optimiser steps, so with one step V-trace
    # fell back to π := μ and every ratio was 1 — exactly the asynchronous, stale case.
    from rlmap.estimators import CreditParams
    from rlmap.estimators import registry as estimators

    model, scored, pad = _rollouts(tiny_model_dir)
    batch = to_batch(scored, pad_token_id=pad)
    noise = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(3))
    stale = batch.replace(
        behavior_logprobs=batch.behavior_logprobs + 0.5 * noise,
        values=torch.zeros(batch.tokens.shape),
        bootstrap_values=torch.zeros(batch.size),
    )
    entry, params = estimators.get("vtrace"), CreditParams(estimator="vtrace")
    assert entry.needs_policy_logprobs
    for mode in ("bypass", "decoupled"):
        s = _settings("token_mean", 4, mode=mode)  # one optimiser step
        skipped, _ = prepare_batch(stale, model, None, s)
        assert skipped.old_logprobs is None
        prepared, timings = prepare_batch(stale, model, None, s, policy_logprobs=True)
        assert prepared.old_logprobs is not None and "system/old_logprobs_s" in timings
        as_if_fresh = entry.fn(skipped, params).advantages
        corrected = entry.fn(prepared, params).advantages
        assert not torch.allclose(as_if_fresh, corrected)  # the ratios now differ from 1


def _pi_old_passes(
    model_dir: Path, run: Path, monkeypatch: pytest.MonkeyPatch, recipe: str, *extra: str
) -> list[bool]:
    """Whether each step's batch came out of ``prepare_batch`` with π_old (a 1-step toy run)."""
    from conftest import _toy_overrides

    from rlmap.experiments.train import run_training
    from rlmap.recipes import build_config
    from rlmap.system import learner_step

    seen, real = [], learner_step.prepare_batch

    def spy(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        batch, timings = real(*args, **kwargs)  # type: ignore[arg-type]
        seen.append(batch.old_logprobs is not None)
        return batch, timings

    monkeypatch.setattr(learner_step, "prepare_batch", spy)
    cfg = build_config(recipe, None, [*_toy_overrides(model_dir, steps=1), *extra])
    assert cfg.optim.epochs_per_batch * cfg.optim.minibatches_per_epoch == 1
    run_training(cfg, run)
    return seen


def test_the_synchronous_loop_hands_vtrace_the_policys_logprobs(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _pi_old_passes(
        tiny_model_dir, tmp_path / "run", monkeypatch, "ppo", "credit.estimator=vtrace"
    )
    assert seen == [True]


@pytest.mark.parametrize(("mode", "computed"), [("decoupled", True), ("bypass", False)])
def test_the_kl_in_the_reward_reads_the_trainers_policy_not_the_engines(
    mode: str,
    computed: bool,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: with one optimiser step π_old was never computed and k1 used μ_old, the
    # engine's log-probs, so a bf16 rollout's mismatch leaked into the KL penalty. In
    # bypass mode π_old := μ by definition, so no pass runs.
    kl = ("kl.placement=reward", "kl.beta=0.1", f"behaviour.mode={mode}")
    seen = _pi_old_passes(tiny_model_dir, tmp_path / "run", monkeypatch, "grpo", *kl)
    assert seen == [computed]


def test_a_kl_penalty_in_the_reward_reaches_grpos_group_statistics(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: `grpo kl.placement=reward` trained exactly as without KL (the penalty sat in
    # token_rewards, GRPO read the outcome). From step 2 the policy has left π_ref (a shaped
    # reward gives step 1 non-zero advantages), so R_i − β·Σ k1 ≠ R_i on some row.
    from conftest import _toy_overrides

    from rlmap.estimators import adapters
    from rlmap.experiments.train import run_training
    from rlmap.recipes import build_config

    seen: list[torch.Tensor] = []
    real = adapters.grpo_advantages

    def spy(rewards_B: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        seen.append(rewards_B.clone())
        return real(rewards_B, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(adapters, "grpo_advantages", spy)
    shaped = ["feedback.length_target=2", "feedback.length_weight=1", "optim.lr=1e-2"]
    overrides = [
        *_toy_overrides(tiny_model_dir, steps=2),
        "kl.placement=reward",
        "kl.beta=2",
        *shaped,
    ]
    run_training(build_config("grpo", None, overrides), tmp_path / "run")
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kl = [r["kl/mean"] for r in records if "kl/mean" in r]
    assert len(seen) == 2 and kl[0] == 0.0 and kl[1] != 0.0
    # The rewards are whole multiples of 1/2 (a 0/1 outcome plus −|length − 2| / 2); the
    # returns GRPO saw at step 2 carry −β·Σ_t k1_t, which is not.
    assert torch.all(seen[0] * 2 == torch.round(seen[0] * 2))
    assert not torch.all(seen[1] * 2 == torch.round(seen[1] * 2))


def test_approx_kl_is_k3_of_the_ratio_by_hand() -> None:
    # log r = ln 2, ln ½ on the two masked tokens; the third (r = e) is off the mask:
    # ((2 − 1 − ln 2) + (½ − 1 + ln 2)) / 2 = (1 − ½) / 2 = 0.25
    log_r = torch.tensor([[math.log(2.0), math.log(0.5), 1.0]])
    mask = torch.tensor([[True, True, False]])
    assert float(approx_kl(log_r, mask)) == pytest.approx(0.25, abs=1e-6)
    # r = 1 everywhere (one optimiser step: π_θ = π_old) gives 0, as does an empty mask
    assert float(approx_kl(torch.zeros(1, 3), mask)) == 0.0
    assert float(approx_kl(log_r, torch.zeros(1, 3, dtype=torch.bool))) == 0.0
    # each term is ≥ 0 even where float32 exp(x) rounds to 1: expm1, not exp − 1
    assert float(approx_kl(torch.tensor([[1e-9]]), torch.tensor([[True]]))) >= 0.0
