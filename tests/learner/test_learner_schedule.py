"""The learner's optimiser: the learning-rate schedules (constant, cosine, linear decay to 0
after warm-up) at hand-computed steps, and AdamW's betas reaching the optimiser."""

from __future__ import annotations

import math

import pytest
import torch

from rlmap.assembly.optim import lr_factor, make_optimizer
from rlmap.core.errors import ConfigError
from rlmap.recipes.build import build_config


def _lrs(overrides: list[str], steps: int) -> list[float]:
    """The learning rate each of the first ``steps`` optimiser steps runs at."""
    cfg = build_config("grpo", None, overrides)
    model = torch.nn.Linear(2, 1)
    optimizer, scheduler = make_optimizer(model, cfg)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_linear_decays_to_zero_after_warmup() -> None:
    # 5 steps × 1 epoch × 2 mini-batches = 10 optimiser steps, warm-up W = 2, lr 1.0:
    # warm-up (s+1)/W: 0.5, 1.0; then 1 − (s − 2)/(10 − 2) for s = 2..9:
    # 1, 7/8, 6/8, 5/8, 4/8, 3/8, 2/8, 1/8 (0 would be step 10, past the run).
    lrs = _lrs(
        [
            "optim.lr=1.0",
            "optim.schedule=linear",
            "optim.warmup_steps=2",
            "optim.steps=5",
            "optim.minibatches_per_epoch=2",
        ],
        10,
    )
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125])


def test_cosine_and_constant_unchanged() -> None:
    # cosine, total 4, no warm-up: ½(1 + cos(π·s/4)) = 1, (1 + √½)/2, ½, (1 − √½)/2
    half = math.sqrt(0.5)
    cosine = _lrs(["optim.lr=1.0", "optim.schedule=cosine", "optim.steps=4"], 4)
    assert cosine == pytest.approx([1.0, (1 + half) / 2, 0.5, (1 - half) / 2])
    assert _lrs(["optim.lr=1.0", "optim.steps=3"], 3) == [1.0, 1.0, 1.0]


def test_lr_factor_linear_reaches_zero_and_stays() -> None:
    # total 10, W = 0: 1 − s/10 → 0 at s = 10, clipped at 0 beyond (a longer resumed run)
    assert lr_factor(10, schedule="linear", warmup_steps=0, total=10) == 0.0
    assert lr_factor(12, schedule="linear", warmup_steps=0, total=10) == 0.0
    assert lr_factor(3, schedule="linear", warmup_steps=0, total=10) == pytest.approx(0.7)


def test_adam_betas_reach_adamw() -> None:
    cfg = build_config("grpo", None, ["optim.adam_betas=[0.9,0.95]"])
    optimizer, _ = make_optimizer(torch.nn.Linear(2, 1), cfg)
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.95)
    default, _ = make_optimizer(torch.nn.Linear(2, 1), build_config("grpo", None, []))
    assert default.param_groups[0]["betas"] == (0.9, 0.999)


def test_adam_betas_change_the_update() -> None:
    """β2 = 0.95 vs 0.999 on the same two gradients: the second Adam step differs.

    Step 1 (g = 1): m̂ = 1, v̂ = 1 whatever β, so both move by lr. Step 2 (g = 3):
    m = 0.1·3 + 0.9·0.1 = 0.39, m̂ = 0.39/(1 − 0.9²) = 39/19; v = (1 − β2)·9 + β2·(1 − β2),
    v̂ = v/(1 − β2²) = (9 + β2)/(1 + β2): β2 = 0.999 → 9.999/1.999 = 5.00200, √ = 2.23652;
    β2 = 0.95 → 9.95/1.95 = 5.10256, √ = 2.25888. Update = lr·m̂/√v̂.
    """
    moved = {}
    for beta2 in (0.999, 0.95):
        w = torch.nn.Parameter(torch.zeros(1))
        cfg = build_config("grpo", None, ["optim.lr=1.0", f"optim.adam_betas=[0.9,{beta2}]"])
        model = torch.nn.Module()
        model.w = w
        optimizer, _ = make_optimizer(model, cfg)
        for grad in (1.0, 3.0):
            w.grad = torch.tensor([grad])
            optimizer.step()
        moved[beta2] = -float(w.detach())
    assert moved[0.999] == pytest.approx(1 + (39 / 19) / 2.23652, rel=1e-4)
    assert moved[0.95] == pytest.approx(1 + (39 / 19) / 2.25888, rel=1e-4)


def test_adam_betas_out_of_range_refused() -> None:
    with pytest.raises(ConfigError, match=r"optim.adam_betas: each must be in \[0, 1\)"):
        build_config("grpo", None, ["optim.adam_betas=[0.9,1.0]"])
