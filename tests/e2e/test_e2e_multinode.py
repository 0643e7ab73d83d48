"""Several nodes (issue 29 item 6): one ``torchrun`` per node, each starting its node's ranks.

CI has one machine and no GPU, so two "nodes" are two ``torchrun --nnodes 2`` processes on
localhost, one learner rank each, over gloo. Their world is the one rlmap's own launcher
builds on one node — the same ``RANK`` and ``WORLD_SIZE``, only ``LOCAL_RANK`` differs (0 on
both nodes) — so the run must log what the one-node run logs. Which GPU ``LOCAL_RANK`` picks
when it is not ``RANK`` is read through the resolver, with CUDA faked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rlmap.learner.launch import free_port, node_device

CLI = [sys.executable, "-m", "rlmap.cli", "train"]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))  # ships with torch
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _records(run: Path) -> list[dict[str, float]]:
    """The run's logged metrics, less the wall-clock and memory readings (not the run's)."""

    def machine(key: str) -> bool:
        timed = key.startswith("system/") or (key.startswith("budget/") and key.endswith("_s"))
        return timed or "memory" in key

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not machine(k)} for r in rows]


def test_two_torchrun_nodes_train_grpo_as_one_node_does(
    tiny_model_dir: Path, tmp_path: Path, toy: Callable[..., list[str]]
) -> None:
    args = [
        "--recipe",
        "grpo",
        *toy(tiny_model_dir, steps=1),
        "system.learners=2",
        "sampling.prompts_per_step=3",
        "run.checkpoint_every=100",
        # a random model never answers right: a length reward gives the groups a spread
        "feedback.length_target=2",
        "feedback.length_weight=1.0",
    ]
    one_node, two_nodes = tmp_path / "one_node", tmp_path / "two_nodes"
    done = subprocess.run(
        [*CLI, "--out", str(one_node), *args], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]

    port = str(free_port())
    nodes = [
        subprocess.Popen(
            [
                TORCHRUN,
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc-per-node",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                "-m",
                "rlmap.cli",
                "train",
                "--out",
                str(two_nodes),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for node in (0, 1)
    ]
    try:
        outputs = [node.communicate(timeout=300) for node in nodes]
    finally:
        for node in (n for n in nodes if n.poll() is None):
            node.terminate()  # SIGTERM: torchrun stops its ranks before it exits
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.kill()
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-3000:]
    assert [out.count("run directory:") for out, _ in outputs] == [1, 0]  # node 0's rank 0

    first = _records(one_node)
    assert [r["step"] for r in first] == [0, 1]  # the evaluation before, then step 1
    assert first[1]["optim/grad_norm"] > 0  # step 1 trained: the comparison is not of zeros
    assert _records(two_nodes) == first


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        # node 1 of two nodes with 2 GPUs each: global ranks 2 and 3, its GPUs 0 and 1
        ({"RANK": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, "cuda:0"),
        ({"RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, "cuda:1"),
    ],
)
def test_a_rank_on_another_node_takes_the_gpu_of_its_local_rank_not_its_rank(
    environ: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert node_device("auto", environ) == torch.device(expected)
