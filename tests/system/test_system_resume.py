"""Resume: a run stopped at any point and resumed logs what an uninterrupted run logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rlmap.experiments.train import run_training
from rlmap.recipes import build_config


def _is_timing(key: str) -> bool:
    """Seconds differ between any two runs: every ``system/*`` and every ``budget/*_s``."""
    return key.startswith("system/") or (key.startswith("budget/") and key.endswith("_s"))


def _records(run: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not _is_timing(k)} for r in rows]


Toy = Callable[..., list[str]]


def _overrides(toy: Toy, model_dir: Path) -> list[str]:
    return [*toy(model_dir, steps=6), "run.checkpoint_every=2", "run.eval_every=3"]


@pytest.mark.parametrize(
    ("recipe", "crash_at", "extra"),
    [
        ("grpo", 3, []),
        ("grpo", 5, []),
        ("grpo", 5, ["kl.target=1e-9", "kl.horizon=16"]),  # the adaptive β comes back too
        ("ppo", 5, []),  # critic weights, optimiser and scheduler come back too
        ("vapo", 5, ["critic.warmup_steps=4"]),  # resumed in the middle of value pre-training
    ],
)
def test_resume_after_a_crash_matches_an_uninterrupted_run(
    recipe: str,
    crash_at: int,
    extra: list[str],
    tiny_model_dir: Path,
    tmp_path: Path,
    crash_in_step: Callable[..., None],
    toy: Toy,
) -> None:
    cfg = build_config(recipe, None, [*_overrides(toy, tiny_model_dir), *extra])
    run_training(cfg, tmp_path / "straight")
    crash_in_step(cfg, tmp_path / "crashed", crash_at)
    run_training(cfg, tmp_path / "crashed", resume=True)
    assert _records(tmp_path / "crashed") == _records(tmp_path / "straight")


def test_kill_9_then_resume_from_the_command_line(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    args = [*_overrides(toy, tiny_model_dir), "optim.steps=10"]
    cli = [sys.executable, "-m", "rlmap.cli", "train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # see conftest: no oversubscribed cores
    subprocess.run([*cli, "--out", str(straight), *args], check=True, capture_output=True, env=env)
    proc = subprocess.Popen(
        [*cli, "--out", str(killed), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + 120
    while not list((killed / "checkpoints").glob("step_*")):  # killed mid-run, after a checkpoint
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "summary.json").exists()
    resumed = subprocess.run(
        [*cli, "--resume", str(killed)], capture_output=True, text=True, env=env
    )
    assert resumed.returncode == 0, resumed.stderr
    assert _records(killed) == _records(straight)
    assert (
        json.loads((killed / "summary.json").read_text())["after"]
        == json.loads((straight / "summary.json").read_text())["after"]
    )
