"""The adaptive KL controller (kl.target, kl.horizon) drives β: logged, checkpointed, resumed.

Before: ``kl.target`` and ``kl.horizon`` were validated and documented, but nothing called
``correction.kl.adaptive_beta``, so β never moved.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlmap.correction import adaptive_beta
from rlmap.experiments.train import run_training
from rlmap.recipes import build_config
from rlmap.system.loop_state import LoopState, adapt_kl, kl_beta

Toy = Callable[..., list[str]]


def _parts(*overrides: str) -> Any:
    return SimpleNamespace(cfg=build_config("grpo", None, list(overrides)))


def test_one_controller_step_by_hand() -> None:
    p = _parts("kl.beta=0.1", "kl.target=0.1", "kl.horizon=80")
    # KL 0.3 is 3x the target: error clip(3 − 1, −0.2, 0.2) = 0.2; β·(1 + 0.2·8/80) = 0.102
    state = adapt_kl(p, LoopState(), {"kl/mean": 0.3}, samples=8)
    assert state.kl_beta == pytest.approx(0.102)
    # KL 0.05 is half the target: error −0.5 → −0.2; 0.102·(1 − 0.2·8/80) = 0.09996
    state = adapt_kl(p, state, {"kl/mean": 0.05}, samples=8)
    assert state.kl_beta == pytest.approx(0.09996)
    assert kl_beta(p, state) == state.kl_beta


def test_an_unclipped_step_by_hand() -> None:
    p = _parts("kl.beta=0.1", "kl.target=0.1", "kl.horizon=80")
    # KL 0.11: error 0.11/0.1 − 1 = 0.1, inside the clip; β·(1 + 0.1·8/80) = 0.101
    assert adapt_kl(p, LoopState(), {"kl/mean": 0.11}, samples=8).kl_beta == pytest.approx(0.101)
    # KL 0.095: error −0.05; β·(1 − 0.05·8/80) = 0.0995
    state = adapt_kl(p, LoopState(), {"kl/mean": 0.095}, samples=8)
    assert state.kl_beta == pytest.approx(0.0995)


def test_a_critic_warm_up_step_does_not_move_beta() -> None:
    # The KL in the reward is measured on warm-up steps too, but the policy stays at π_ref
    # there: before, β shrank by 20%·n/horizon on every warm-up step.
    p = _parts("kl.beta=0.1", "kl.target=0.1", "kl.placement=reward")
    warming = {"kl/mean": 0.0, "critic/pretraining": 1.0}
    assert adapt_kl(p, LoopState(), warming, samples=8).kl_beta is None


def test_no_target_or_no_measurement_leaves_beta_alone() -> None:
    fixed = _parts("kl.beta=0.1")
    assert adapt_kl(fixed, LoopState(), {"kl/mean": 5.0}, samples=8).kl_beta is None
    assert kl_beta(fixed, LoopState()) == 0.1
    adaptive = _parts("kl.beta=0.1", "kl.target=0.1")
    assert adapt_kl(adaptive, LoopState(), {}, samples=8).kl_beta is None  # e.g. critic warm-up


def test_a_run_follows_the_controller_step_by_step(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    cfg = build_config(
        "grpo", None, [*toy(tiny_model_dir, steps=4), "kl.target=1e-9", "kl.horizon=16"]
    )
    run_training(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "kl/beta" in r]
    assert len(steps) == 4 and steps[0]["kl/beta"] == cfg.kl.beta
    batch = cfg.sampling.prompts_per_step * cfg.sampling.group_size
    for before, after in itertools.pairwise(steps):
        expected = adaptive_beta(before["kl/beta"], before["kl/mean"], 1e-9, batch, 16)
        assert after["kl/beta"] == pytest.approx(expected, rel=1e-12)
    assert steps[-1]["kl/beta"] != steps[0]["kl/beta"]  # β moved (it never did before)
