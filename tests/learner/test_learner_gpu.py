"""On a CUDA GPU (skipped elsewhere; ``bench/gpu_check.sh`` runs them on the GPU machine):
the learner's update equals the CPU's, and every part of a run lives on the GPU."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_learner_device import _audit
from test_learner_policy import _rollouts, _settings, rescheduled

from rlmap.assembly.parts import build
from rlmap.learner.policy import prepare_batch, update_policy
from rlmap.recipes import build_config
from rlmap.rollout.packing import to_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_one_update_on_the_gpu_equals_the_cpus(tiny_model_dir: Path) -> None:
    # fp32 with full-precision matmuls (no TF32): π_old, the loss, the gradient norm and the
    # updated weights agree with the CPU's to float32 noise (1e-4 relative).
    assert torch.get_float32_matmul_precision() == "highest"  # rlmap's setting on CUDA
    model, scored, pad = _rollouts(tiny_model_dir)
    batch = to_batch(scored, pad_token_id=pad)
    advantages = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(2))
    advantages = advantages * batch.action_mask
    s = _settings("token_mean", 4)
    twice = rescheduled(s, epochs=2)  # π_old recomputed, two optimiser steps
    out = {}
    for device in ("cpu", "cuda"):
        policy = copy.deepcopy(model).to(device)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        prepared, _ = prepare_batch(batch, policy, None, twice)
        assert prepared.old_logprobs is not None and prepared.old_logprobs.device.type == "cpu"
        metrics = update_policy(
            policy,
            optimizer,
            scheduler,
            prepared,
            advantages,
            twice,
            learner_version=0,
            generator=torch.Generator().manual_seed(0),
        )
        weights = torch.cat([p.detach().flatten().cpu() for p in policy.parameters()])
        out[device] = (prepared.old_logprobs, metrics, weights)
    (old_c, m_c, w_c), (old_g, m_g, w_g) = out["cpu"], out["cuda"]
    assert torch.allclose(old_c, old_g, rtol=1e-4, atol=1e-5)
    for key in ("loss/total", "optim/grad_norm", "ratio/kappa/max_abs_log"):
        assert m_g[key] == pytest.approx(m_c[key], rel=1e-4, abs=1e-6), key
    assert torch.allclose(w_c, w_g, rtol=1e-4, atol=1e-6)


def test_a_critic_and_a_reward_model_load_straight_onto_the_gpu(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The critic's new head is the CPU's draw (the same seed gives the same critic on any
    # device); a saved reward model loads as it was saved.
    from transformers import AutoModelForSequenceClassification

    from rlmap.learned.reward_model import load_reward_model
    from rlmap.learner.critic import load_critic

    cuda = torch.device("cuda", 0)
    on_cpu = load_critic(tiny_model_dir, dtype=torch.float32, seed=5)
    on_gpu = load_critic(tiny_model_dir, dtype=torch.float32, seed=5, device=cuda)
    assert {p.device for p in on_gpu.parameters()} == {cuda}
    for name, weight in on_cpu.state_dict().items():
        assert torch.equal(weight, on_gpu.state_dict()[name].cpu()), name
    AutoModelForSequenceClassification.from_pretrained(
        tiny_model_dir, num_labels=1
    ).save_pretrained(tmp_path / "rm")
    rm = load_reward_model(tmp_path / "rm", device=cuda)
    assert {p.device for p in rm.parameters()} == {cuda} and not rm.training


@pytest.mark.parametrize("recipe", ["grpo", "ppo"])
def test_every_part_of_a_gpu_run_lives_on_the_gpu(
    recipe: str, tiny_model_dir: Path, toy: Callable[..., list[str]]
) -> None:
    cfg = build_config(recipe, None, [*toy(tiny_model_dir), "system.device=cuda:0"])
    parts = build(cfg, tiny_model_dir)
    assert parts.device == torch.device("cuda", 0)
    assert set(_audit(parts)) == {"cuda:0"}
