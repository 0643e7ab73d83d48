"""The learner: log-probs agree with the rollout engine, and micro-batching changes nothing."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlmap.core.batch import RewardStatus
from rlmap.correction import BehaviourParams, KLParams
from rlmap.reduction import ReductionParams
from rlmap.system.hf_engine import HFEngine
from rlmap.system.learner import UpdateSettings, prepare_batch, update_policy
from rlmap.system.logprobs import token_logprobs
from rlmap.system.rollout import Scored, single_turn, to_batch
from rlmap.tasks.prompts import encode_prompt


def _rollouts(model_dir: Path, n: int = 4) -> tuple[torch.nn.Module, list[Scored], int]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id)  # fmt: skip
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
        epochs=1,
        minibatches=1,
        micro_batch_size=micro,
        max_grad_norm=1e9,
        temperature=1.0,
    )


@pytest.mark.parametrize("reduction", ["response_mean", "token_mean", "fixed_budget"])
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
        update_policy(policy, optimizer, scheduler, prepared, advantages.double(), s,
                      learner_version=0, generator=torch.Generator().manual_seed(0))  # fmt: skip
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
    twice = UpdateSettings(**{**once.__dict__, "epochs": 2})
    prepared, timings = prepare_batch(batch, model, None, twice)
    old = prepared.old_logprobs
    assert old is not None and torch.allclose(old[batch.action_mask],
                                              batch.behavior_logprobs[batch.action_mask],
                                              atol=1e-4)  # fmt: skip
    assert set(timings) == {"system/old_logprobs_s"} and timings["system/old_logprobs_s"] > 0
    bypass = UpdateSettings(**{**twice.__dict__, "behaviour": BehaviourParams(mode="bypass")})
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
    on = UpdateSettings(**{**off.__dict__, "kl": KLParams(placement="loss", beta=0.1)})
    prepared, timings = prepare_batch(batch, model, None, on)
    assert prepared.ref_logprobs is None and timings == {}  # KL on, but no reference model
    prepared, timings = prepare_batch(batch, model, reference, on)
    assert prepared.ref_logprobs is not None
    assert set(timings) == {"system/reference_s"} and timings["system/reference_s"] > 0
    both = UpdateSettings(**{**on.__dict__, "epochs": 2})
    _, timings = prepare_batch(batch, model, reference, both)
    assert set(timings) == {"system/old_logprobs_s", "system/reference_s"}
