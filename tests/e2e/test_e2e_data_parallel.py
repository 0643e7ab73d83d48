"""Data-parallel training from the command line: two learner ranks started by rlmap.

A run with ``system.learners=2`` writes one run directory (rank 0's), one Hugging Face
checkpoint per save that plain ``transformers`` loads, and resumes exactly after the
launcher is killed with SIGKILL — its ranks die with it, and the resumed run logs what an
uninterrupted one logs (every rank's RNG, the optimiser — FSDP2: gathered from its shards —
and the loop state come back).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlmap.core.errors import ConfigError
from rlmap.learner.launch import free_port
from rlmap.recipes import build_config

CLI = [sys.executable, "-m", "rlmap.cli", "train"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _records(run: Path) -> list[dict[str, float]]:
    def timing(key: str) -> bool:
        return key.startswith("system/") or (key.startswith("budget/") and key.endswith("_s"))

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not timing(k) and "memory" not in k} for r in rows]


def _ranks_of(run: Path) -> list[int]:
    """Pids of processes whose command line names ``run`` (the launcher and its ranks)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(run) in (proc / "cmdline").read_text():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize(
    ("recipe", "sharding"),
    [("grpo", "ddp"), ("grpo", "fsdp2"), ("ppo", "fsdp2")],  # ppo: the critic's state too
)
def test_two_learners_resume_exactly_after_kill_9(
    recipe: str, sharding: str, tiny_model_dir: Path, tmp_path: Path, toy: Callable[..., list[str]]
) -> None:
    args = [
        "--recipe",
        recipe,
        *toy(tiny_model_dir, steps=4),
        "system.learners=2",
        f"system.learner_sharding={sharding}",
        "sampling.prompts_per_step=3",
        "run.checkpoint_every=2",
        "run.eval_every=2",
        # a random model never answers right: a length reward gives the groups a spread
        "feedback.length_target=2",
        "feedback.length_weight=1.0",
    ]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = subprocess.run(
        [*CLI, "--out", str(straight), *args], capture_output=True, text=True, env=ENV
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("run directory:") == 1  # rank 0 speaks; rank 1 is silent

    proc = subprocess.Popen(
        [*CLI, "--out", str(killed), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    deadline = time.monotonic() + 300
    while not list((killed / "checkpoints").glob("step_*")):
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while _ranks_of(killed) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ranks_of(killed) == []  # no rank outlives its launcher
    assert not (killed / "summary.json").exists()
    resumed = subprocess.run(
        [*CLI, "--resume", str(killed)], capture_output=True, text=True, env=ENV
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _records(killed) == _records(straight)
    assert len(_records(straight)) == 5  # steps 0..4, each logged once
    assert all(r["optim/grad_norm"] > 0 for r in _records(straight)[1:])

    final = straight / "checkpoints" / "step_4"
    model = AutoModelForCausalLM.from_pretrained(final)  # plain transformers loads it
    again = AutoModelForCausalLM.from_pretrained(killed / "checkpoints" / "step_4")
    for (name, a), (_, b) in zip(
        model.state_dict().items(), again.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    pairs = zip(model.state_dict().values(), start.state_dict().values(), strict=True)
    moved = any(not torch.equal(a, b) for a, b in pairs)
    assert moved  # the checkpoint holds the trained weights, not the start


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["system.mode=async", "sampling.filter=none"], "needs system.mode=sync"),
        (["sampling.prompts_per_step=1"], "at least as many prompts per step"),
        (["model.lora_rank=8"], "does not train LoRA adapters yet"),
        (["system.learners=0"], "system.learners: must be >= 1"),
    ],
)
def test_what_data_parallel_learners_refuse(extra: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        build_config("grpo", None, ["system.learners=2", *extra])


def test_a_launcher_of_another_size_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlmap.cli.train import learner_world

    for name, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", "3"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ):
        monkeypatch.setenv(name, value)  # a full launcher environment: only its size is wrong
    cfg = build_config("grpo", None, ["system.learners=2"])
    with pytest.raises(ConfigError, match=r"system.learners: 2, but the launcher started 3"):
        learner_world(cfg)


def test_under_torchrun_the_ranks_join_its_world(
    tiny_model_dir: Path, tmp_path: Path, toy: Callable[..., list[str]]
) -> None:
    out = tmp_path / "run"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        "-m",
        "rlmap.cli",
        "train",
    ]
    args = [*toy(tiny_model_dir, steps=2), "system.learners=2", "sampling.prompts_per_step=3"]
    done = subprocess.run(
        [*torchrun, "--out", str(out), *args], capture_output=True, text=True, env=ENV
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("run directory:") == 1
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").open()] == [0, 1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_1", "step_2"]
    AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step_2")


def test_an_error_every_rank_hits_is_said_once(
    tiny_model_dir: Path, tmp_path: Path, toy: Callable[..., list[str]]
) -> None:
    # a learning rate that overflows the weights: every rank's guard stops the same step
    args = [
        *toy(tiny_model_dir, steps=2),
        "system.learners=2",
        "sampling.prompts_per_step=3",
        "optim.lr=1e30",
        "feedback.length_target=2",
        "feedback.length_weight=1.0",
    ]
    done = subprocess.run(
        [*CLI, "--out", str(tmp_path / "run"), *args], capture_output=True, text=True, env=ENV
    )
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("rlmap: error:")]
    assert len(errors) == 1 and "step 1" in errors[0], done.stderr[-3000:]


@pytest.mark.parametrize("fails", [False, True])
def test_a_rank_leaves_with_its_process_group_destroyed(tmp_path: Path, fails: bool) -> None:
    """A rank that exits with its gloo group alive can die of SIGABRT at interpreter exit
    ("terminate called without an active exception"); ``joined`` tears the group down on
    the way out, whether the rank's work ended or raised."""
    import torch.distributed as dist

    from rlmap.learner.distributed import World
    from rlmap.learner.launch import joined

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with contextlib.suppress(RuntimeError), joined(World(rank=0, size=2)):
            if fails:
                raise RuntimeError("the rank's work failed")
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
