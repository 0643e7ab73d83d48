"""Data-parallel learners on GPUs (issue 29 item 3): each rank on the GPU its ``LOCAL_RANK``
names, the process group ``cpu:gloo,cuda:nccl``, DDP with ``device_ids``, FSDP2 on a ``cuda``
mesh, bfloat16 FSDP2 in its own mixed precision, and a node refused more ranks than GPUs.

CI has no GPU and no NCCL: CUDA is faked (``torch.cuda.is_available``, ``device_count``)
and the calls that would need it — ``init_process_group``, ``set_device``, DDP,
``init_device_mesh``, ``fully_shard`` — are replaced by recorders, so that each test reads
what rlmap asked torch for. The mixed-precision policy runs for real on a one-rank gloo
group (FSDP2 takes it on the CPU too). The two-rank gloo equality suite
(``test_data_parallel.py``) is the CPU path, unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from rlmap.core.errors import ConfigError
from rlmap.learner import launch
from rlmap.learner.distributed import (
    World,
    backend,
    ddp_options,
    mesh_type,
    mixed_precision,
    parallel,
)
from rlmap.learner.launch import node_device, world_of_env

CPU, GPU1 = torch.device("cpu"), torch.device("cuda", 1)


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_the_backend_mesh_and_ddp_ids_follow_the_learners_device() -> None:
    assert backend(CPU) == "gloo"  # the CI suite's, unchanged
    assert backend(GPU1) == "cpu:gloo,cuda:nccl"  # gradients on NCCL, rlmap's scalars on gloo
    assert mesh_type(CPU) == "cpu" and mesh_type(GPU1) == "cuda"
    assert ddp_options(CPU) == {} and ddp_options(GPU1) == {"device_ids": [1]}


def test_bfloat16_fsdp2_gathers_bfloat16_and_reduces_float32() -> None:
    assert mixed_precision("float32") is None  # float32 runs: FSDP2 as before, exact
    policy = mixed_precision("bfloat16")
    assert policy is not None
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)


def _launched(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """The environment torchrun gives a rank (``LAUNCHER_ENV`` unset: not rlmap's own)."""
    monkeypatch.delenv(launch.LAUNCHER_ENV, raising=False)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for name, value in (base | env).items():
        monkeypatch.setenv(name, value)


def _record_group(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        dist,
        "init_process_group",
        lambda name, **kw: calls.append(("init", (name, kw["device_id"]))),
    )
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    return calls


def test_a_gpu_rank_joins_a_composite_group_bound_to_its_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_cuda(monkeypatch, 2)
    _launched(monkeypatch, RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    calls = _record_group(monkeypatch)
    device = node_device("auto", os.environ)
    assert device == GPU1  # LOCAL_RANK 1: the node's second GPU
    world = world_of_env("fsdp2", device, "bfloat16")
    # the current device first (a CUDA tensor without an index, NCCL's communicator: there)
    assert calls == [("set_device", GPU1), ("init", ("cpu:gloo,cuda:nccl", GPU1))]
    assert world == World(rank=1, size=2, sharding="fsdp2", device=GPU1, train_dtype="bfloat16")


def test_a_cpu_rank_joins_plain_gloo_and_never_touches_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_cuda(monkeypatch, 2)  # a GPU machine training on the CPU, as asked
    _launched(monkeypatch, RANK="1", LOCAL_RANK="1", WORLD_SIZE="2")
    calls = _record_group(monkeypatch)
    world = world_of_env("ddp", node_device("cpu", {"LOCAL_RANK": "1"}))
    assert calls == [("init", ("gloo", None))] and world.device == CPU


class _Recorder:
    """Stands in for DDP, ``init_device_mesh`` and ``fully_shard``: records their arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def ddp(self, module: nn.Module, **kw: Any) -> Any:
        self.calls.append(("ddp", kw))
        return type("DDP", (), {"register_comm_hook": lambda *a: None})()

    def mesh(self, kind: str, shape: tuple[int, ...]) -> str:
        self.calls.append(("mesh", kind))
        return f"{kind} mesh"

    def shard(self, module: nn.Module, mesh: str, **kw: Any) -> nn.Module:
        self.calls.append(("shard", (mesh, kw.get("mp_policy"))))
        return module


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp as fsdp
    import torch.nn.parallel as nn_parallel

    r = _Recorder()
    monkeypatch.setattr(nn_parallel, "DistributedDataParallel", r.ddp)
    monkeypatch.setattr(device_mesh, "init_device_mesh", r.mesh)
    monkeypatch.setattr(fsdp, "fully_shard", r.shard)
    return r


def _two_blocks() -> nn.Module:
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    return model


@pytest.mark.parametrize(("device", "ids"), [(GPU1, {"device_ids": [1]}), (CPU, {})])
def test_ddp_wraps_the_replica_on_the_ranks_device(
    recorder: _Recorder, device: torch.device, ids: dict[str, Any]
) -> None:
    parallel(_two_blocks(), World(rank=1, size=2, sharding="ddp", device=device))
    [(name, kw)] = recorder.calls
    assert name == "ddp" and {k: v for k, v in kw.items() if k == "device_ids"} == ids


@pytest.mark.parametrize(
    ("device", "dtype", "mesh", "policy"),
    [
        (GPU1, "bfloat16", "cuda", True),
        (GPU1, "float32", "cuda", False),
        (CPU, "float32", "cpu", False),
    ],
)
def test_fsdp2_shards_on_the_learners_mesh_in_its_precision(
    recorder: _Recorder, device: torch.device, dtype: str, mesh: str, policy: bool
) -> None:
    parallel(
        _two_blocks(), World(rank=0, size=2, sharding="fsdp2", device=device, train_dtype=dtype)
    )
    assert recorder.calls[0] == ("mesh", mesh)
    shards = [args for name, args in recorder.calls if name == "shard"]
    assert len(shards) == 3  # the two blocks, then the root
    assert all(m == f"{mesh} mesh" and (p is not None) == policy for m, p in shards)


@pytest.mark.parametrize(
    ("setting", "ranks", "environ", "expected"),
    [
        ("auto", 2, {"LOCAL_RANK": "1"}, "cuda:1"),  # rlmap's launcher: rank r on cuda:r
        ("auto", None, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, "cuda:1"),  # torchrun
        # torchrun on the second of two one-GPU nodes: RANK 1 is LOCAL_RANK 0, cuda:0
        ("cuda", None, {"RANK": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, "cuda:0"),
        ("cpu", 4, {"LOCAL_RANK": "3"}, "cpu"),  # CPU ranks: as many as asked
    ],
)
def test_each_rank_of_a_node_takes_its_own_gpu(
    setting: str,
    ranks: int | None,
    environ: dict[str, str],
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_cuda(monkeypatch, 2)
    assert node_device(setting, environ, ranks) == torch.device(expected)


@pytest.mark.parametrize(
    ("setting", "ranks", "environ", "says"),
    [
        (
            "auto",
            3,
            {},
            "system.learners: 3 learner ranks on one node need a GPU each, and "
            "this node has 2; run at most 2 per node",
        ),
        (
            "cuda",
            None,
            {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"},
            "system.learners: 4 learner ranks on one node",
        ),  # torchrun's --nproc-per-node 4
        ("cuda:1", 2, {}, "system.device: cuda:1 puts all 2 learner ranks of a node on one GPU"),
        ("cuda", None, {"LOCAL_WORLD_SIZE": "two"}, "LOCAL_WORLD_SIZE: must be an integer"),
    ],
)
def test_a_node_short_of_gpus_is_refused_in_one_line(
    setting: str,
    ranks: int | None,
    environ: dict[str, str],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_cuda(monkeypatch, 2)
    with pytest.raises(ConfigError) as caught:
        node_device(setting, environ, ranks)
    assert str(caught.value).startswith(says) and "\n" not in str(caught.value)


def test_the_launcher_refuses_more_learners_than_gpus_before_any_rank_starts(
    tiny_model_dir: Path,
    tmp_path: Path,
    toy: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rlmap.cli import main

    _fake_cuda(monkeypatch, 2)
    _launched(monkeypatch)  # no RANK: this process would start the ranks
    monkeypatch.setattr(launch, "launch", lambda *a: pytest.fail("a rank was started"))
    out = tmp_path / "run"
    status = main(
        [
            "train",
            "--recipe",
            "grpo",
            "--out",
            str(out),
            *toy(tiny_model_dir),
            "system.learners=3",
            "sampling.prompts_per_step=3",
        ]
    )
    err = capsys.readouterr().err
    assert status != 0 and err.count("\n") == 1, err
    assert err.startswith("rlmap: error: system.learners: 3 learner ranks on one node"), err
    assert not out.exists()


def test_several_learner_ranks_on_cuda_are_no_longer_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlmap.assembly.models import learner_device
    from rlmap.recipes import build_config

    _fake_cuda(monkeypatch, 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    # process-wide
    monkeypatch.setattr("rlmap.assembly.models.use_deterministic_kernels", lambda device: None)
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda precision: None)
    cfg = build_config("grpo", None, ["system.learners=2", "sampling.prompts_per_step=2"])
    assert learner_device(cfg) == GPU1


def test_the_policy_runs_bfloat16_parameters_under_autocast_with_float32_shards(
    tiny_model_dir: Path,
) -> None:
    """FSDP2's mixed precision for real (one gloo rank, in a process of its own:
    fsdp2_mixed_worker.py): the forward sees bfloat16 weights, the shards AdamW steps stay
    float32 with float32 gradients, and the learner's autocast composes with it — the
    log-probs equal the one-process autocast ones to bfloat16's rounding, not exactly (the
    residual stream is bfloat16 here)."""
    worker = Path(__file__).with_name("fsdp2_mixed_worker.py")
    done = subprocess.run(
        [sys.executable, str(worker), str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["seen"] == ["torch.bfloat16"]  # the gathered weights the forward ran with
    assert got["shards"] and all(
        s == ("torch.float32", "torch.float32") for s in map(tuple, got["shards"])
    )
    assert got["out"] == "torch.float32"  # the log-probs: float32 (log-softmax under autocast)
    assert 0 < got["gap"] < 0.1  # bfloat16 rounding of log-probs of a few nats, not an identity
