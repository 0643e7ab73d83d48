"""Ray's rollout actors on GPUs (issue 29 item 5): the options each actor asks Ray for, the
GPUs the run's own Ray is started with, the colocated actors' placement group, the device
an actor builds its engine on, the CPU snapshot put in the object store, and the one-line
refusals for GPUs this machine cannot give.

CI has no GPU: CUDA is monkeypatched (``is_available``, ``device_count``) and Ray is a fake
that records what it is asked, as in ``tests/learner/test_learner_device.py``. Not measured
on a GPU.
"""

from __future__ import annotations

import importlib
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rlmap.assembly.available import refuse_unavailable
from rlmap.assembly.models import learner_device
from rlmap.assembly.placement import actor_gpus, actor_options
from rlmap.cli import main
from rlmap.core.errors import ConfigError
from rlmap.recipes import build_config
from rlmap.system import ray_workers
from rlmap.system.board import Board
from rlmap.system.ray_workers import RayPool, RolloutActor, SharedWeights

ray = pytest.importorskip("ray")

RAY = ["system.mode=async", "system.backend=ray"]
CUDA0, CUDA1, CPU = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int, visible: str | None = None) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


def _cfg(*extra: str) -> Any:
    return build_config("sao", None, [*RAY, *extra])


class FakeRay:
    """Records ``init`` (with the CUDA_VISIBLE_DEVICES it ran under), every actor's options,
    and what is put in the object store."""

    def __init__(self) -> None:
        self.inits: list[tuple[dict[str, Any], str | None]] = []
        self.options: list[dict[str, Any]] = []
        self.puts: list[Any] = []

    def is_initialized(self) -> bool:
        return bool(self.inits)

    def init(self, **kwargs: Any) -> None:
        self.inits.append((kwargs, os.environ.get("CUDA_VISIBLE_DEVICES")))

    def remote(self, **options: Any) -> Any:
        self.options.append(options)
        return lambda cls: SimpleNamespace(remote=lambda *args: f"a {cls.__name__}")

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        return ref

    def put(self, value: Any) -> Any:
        self.puts.append(value)
        return len(self.puts)


def _pool(monkeypatch: pytest.MonkeyPatch, cfg: Any, learner: torch.device) -> FakeRay:
    """A :class:`RayPool` started on a fake Ray for a runner whose learner is on ``learner``."""
    fake = FakeRay()
    monkeypatch.setattr(ray_workers, "_ray", lambda: fake)
    board = Board(0, {"w": torch.ones(2)})
    runner = SimpleNamespace(
        p=SimpleNamespace(cfg=cfg, device=learner), board=board, stop=threading.Event()
    )
    workers = RayPool(Path("start"), None)(runner)  # type: ignore[arg-type]
    assert len(workers) == cfg.system.workers
    return fake


def test_a_cluster_of_the_users_is_not_counted_from_this_machine_and_is_not_colocated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlmap.assembly.placement import check_gpus

    _fake_cuda(monkeypatch, 1)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    # 16 actors on a GPU each: this machine's one GPU says nothing of the cluster's
    check_gpus(_cfg("system.workers=16", "system.actor_gpus=1"), torch.device("cuda", 0))
    with pytest.raises(ConfigError, match=r"^system\.actor_placement: colocate needs the run"):
        check_gpus(_cfg("system.actor_placement=colocate"), torch.device("cuda", 0))


def test_a_cluster_named_by_ray_address_is_joined_without_resource_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ray.init(address=…) refuses num_cpus/num_gpus ("must not be provided" when connecting
    # to an existing cluster); the run joins it as it is and does not stop it at the end.
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    fake = FakeRay()
    monkeypatch.setattr(ray_workers, "_ray", lambda: fake)
    board = Board(0, {"w": torch.ones(2)})
    runner = SimpleNamespace(
        p=SimpleNamespace(cfg=_cfg(), device=torch.device("cpu")),
        board=board,
        stop=threading.Event(),
    )
    pool = RayPool(Path("start"), None)
    pool(runner)  # type: ignore[arg-type]
    ((kwargs, _),) = fake.inits
    assert not {"num_cpus", "num_gpus"} & set(kwargs)
    assert not pool.started


@pytest.mark.parametrize(
    ("extra", "learner", "expected"),
    [
        ([], CPU, {"num_cpus": 1}),  # beside a CPU learner: no GPU asked, num_gpus absent
        ([], CUDA0, {"num_cpus": 1, "num_gpus": 1.0}),  # separate: a whole GPU each
        (["system.actor_gpus=0.25"], CUDA0, {"num_cpus": 1, "num_gpus": 0.25}),  # as set
        (["system.actor_gpus=0"], CUDA0, {"num_cpus": 1}),  # on the CPU beside a GPU learner
        # colocate, 3 actors: ⌊10⁴/3⌋/10⁴ = 0.3333 each, 3 × 0.3333 = 0.9999 ≤ 1 GPU
        (
            ["system.actor_placement=colocate", "system.workers=3"],
            CUDA0,
            {"num_cpus": 1, "num_gpus": 0.3333},
        ),
    ],
)
def test_an_actor_asks_ray_for_its_gpus_on_cuda_and_for_none_on_a_cpu(
    extra: list[str], learner: torch.device, expected: dict[str, Any]
) -> None:
    assert actor_options(actor_gpus(_cfg(*extra).system, learner)) == expected


def test_separate_actors_start_ray_without_the_learners_gpu_and_ask_for_one_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_cuda(monkeypatch, 4)
    fake = _pool(monkeypatch, _cfg("system.workers=3"), CUDA1)
    # 4 GPUs, the learner on cuda:1: Ray sees 0, 2 and 3; each of 3 actors asks for 1
    ((kwargs, visible),) = fake.inits
    assert visible == "0,2,3" and kwargs["num_gpus"] == 3 and kwargs["num_cpus"] == 4
    assert fake.options == [{"num_cpus": 1, "num_gpus": 1.0}] * 3
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # the driver's own setting is back


def test_the_gpus_hidden_from_ray_are_named_as_cuda_visible_devices_names_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the driver sees physical GPUs 4..7 as cuda:0..3; its learner on cuda:0 is physical 4
    _fake_cuda(monkeypatch, 4, visible="4,5,6,7")
    fake = _pool(monkeypatch, _cfg("system.workers=2"), CUDA0)
    assert fake.inits[0][1] == "5,6,7" and fake.inits[0][0]["num_gpus"] == 3
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


def test_colocated_actors_share_the_learners_gpu_in_one_pack_placement_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    asked: list[tuple[list[dict[str, float]], str]] = []
    group = SimpleNamespace(ready=lambda: "reserved")
    placement = importlib.import_module("ray.util.placement_group")

    def placement_group(bundles: list[dict[str, float]], strategy: str) -> Any:
        asked.append((bundles, strategy))
        return group

    monkeypatch.setattr(placement, "placement_group", placement_group)
    _fake_cuda(monkeypatch, 4)
    cfg = _cfg("system.workers=2", "system.actor_placement=colocate", "system.actor_gpus=0.5")
    fake = _pool(monkeypatch, cfg, CUDA1)
    assert fake.inits[0][1] == "1" and fake.inits[0][0]["num_gpus"] == 1  # the learner's alone
    assert asked == [([{"CPU": 1, "GPU": 0.5}] * 2, "PACK")]
    strategies = [o.pop("scheduling_strategy") for o in fake.options]
    assert fake.options == [{"num_cpus": 1, "num_gpus": 0.5}] * 2
    assert all(isinstance(s, PlacementGroupSchedulingStrategy) for s in strategies)
    assert [(s.placement_group, s.placement_group_bundle_index) for s in strategies] == [
        (group, 0),
        (group, 1),
    ]


def test_on_a_cpu_ray_is_given_no_gpu_and_cuda_visible_devices_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_cuda(monkeypatch, 0)
    fake = _pool(monkeypatch, _cfg(), CPU)
    ((kwargs, visible),) = fake.inits
    assert kwargs["num_gpus"] == 0 and kwargs["num_cpus"] == 3 and visible is None  # 2 + 1
    assert fake.options == [{"num_cpus": 1}] * 2


@pytest.mark.parametrize(("gpu_ids", "device"), [(["3"], "cuda:0"), ([], "cpu")])
def test_an_actor_builds_on_the_gpu_ray_gave_it_and_on_the_cpu_otherwise(
    gpu_ids: list[str], device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray narrows a GPU actor's CUDA_VISIBLE_DEVICES to its GPU ("3"), which it sees as
    # cuda:0; an actor that asked for none sees every GPU, so it must choose the CPU itself.
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: gpu_ids)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    calls: list[bool] = []
    monkeypatch.setattr(
        "rlmap.assembly.parts.build",
        lambda cfg, start, reward_path, trains: calls.append(trains) or cfg,
    )
    actor = RolloutActor(_cfg("system.device=auto"), "start", None)
    built: Any = actor.p
    assert built.system.device == device
    assert built.system.backend == "inprocess"  # the actor is no Ray driver: no GPU checks
    assert calls == [False]  # it trains nothing: its GPU room counts its weights alone


def test_what_ray_stores_is_the_boards_host_snapshot_in_the_rollout_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A Ray run's board snapshots into host memory in the rollout dtype (pinned off a GPU:
    # test_system_weight_stream.py); the object store takes that snapshot as it is.
    fake = FakeRay()
    monkeypatch.setattr(ray_workers, "_ray", lambda: fake)
    board = Board(0, {}, dtype=torch.bfloat16, host=True)
    layer = torch.nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0 + 2**-10, 3.0]]))
    board.publish(layer, 1)
    runner = SimpleNamespace(p=SimpleNamespace(cfg=_cfg()), board=board, stop=threading.Event())
    assert SharedWeights(runner).latest() == (1, 1)  # type: ignore[arg-type]
    (put,) = fake.puts
    assert put is board.state  # no second copy on the way
    assert {(t.device.type, t.dtype) for t in put.values()} == {("cpu", torch.bfloat16)}
    # bfloat16 keeps 8 significant bits: 1 + 2⁻¹⁰ rounds to 1; 3 is exact
    assert put["weight"].tolist() == [[1.0, 3.0]]


@pytest.mark.parametrize(
    ("gpus", "extra", "fragments"),
    [
        (0, ["system.actor_gpus=1"], ["system.actor_gpus: 1 GPU", "sees no CUDA"]),
        # 1 GPU, the learner's: ⌈2 actors / 1 per GPU⌉ = 2 GPUs needed, 1 − 1 = 0 for Ray
        (1, [], ["system.actor_gpus: 2 rollout actors", "need 2 GPU(s)", "Ray gets 0"]),
        # 4 GPUs: ⌈7 / ⌊1/0.5⌋⌉ = ⌈3.5⌉ = 4 needed, 4 − 1 = 3 for Ray
        (4, ["system.workers=7", "system.actor_gpus=0.5"], ["need 4 GPU(s)", "Ray gets 3"]),
        # colocate: ⌊1/0.4⌋ = 2 actors per GPU, 3 actors need 2, Ray has the learner's alone
        (
            4,
            ["system.workers=3", "system.actor_placement=colocate", "system.actor_gpus=0.4"],
            ["need 2 GPU(s)", "Ray gets 1 (the learner's own)"],
        ),
        (
            4,
            ["system.device=cpu", "system.actor_placement=colocate", "system.actor_gpus=0.5"],
            ["system.actor_placement: colocate", "the learner is on the CPU"],
        ),
        (
            1,
            ["system.device=cpu", "system.engine=vllm"],
            ["system.actor_gpus: 0", "vLLM's CUDA build needs a GPU"],
        ),
        # 2 colocated vLLM actors and the learner's own engine × 0.5 of the memory = 1.5
        (
            1,
            ["system.engine=vllm", "system.actor_placement=colocate"],
            [
                "system.engine_memory: 3 vLLM engines on one GPU (2 actors' and the learner's)",
                "take 1.5",
                "beside the learner",
            ],
        ),
        # 0.35 each: the actors alone take 0.7, with the learner's engine 1.05 > 1
        (
            1,
            ["system.engine=vllm", "system.actor_placement=colocate", "system.engine_memory=0.35"],
            ["3 vLLM engines", "take 1.05"],
        ),
    ],
)
def test_gpus_this_machine_cannot_give_are_refused_in_one_line_before_the_run(
    gpus: int,
    extra: list[str],
    fragments: list[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _fake_cuda(monkeypatch, gpus)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--recipe", "sao", "--out", "run", *RAY, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlmap: error: system."), err
    assert all(f in err for f in fragments), err
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


@pytest.mark.parametrize(
    ("gpus", "extra"),
    [
        (0, []),  # the CPU: actors ask for no GPU, as before
        (4, ["system.workers=6", "system.actor_gpus=0.5"]),  # ⌈6 / 2⌉ = 3 = 4 − 1: just fits
        (1, ["system.workers=3", "system.actor_placement=colocate"]),  # 3 × 0.3333 ≤ 1
        (
            1,
            ["system.engine=vllm", "system.actor_placement=colocate", "system.engine_memory=0.3"],
        ),  # 2 × 0.3 = 0.6 < 1: room for the learner
    ],
)
def test_gpus_the_machine_has_are_accepted_ray_and_vllm_on_cuda_included(
    gpus: int, extra: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a CUDA learner with Ray, and vLLM in Ray's actors on a GPU, were refused until now
    _fake_cuda(monkeypatch, gpus)
    cfg = _cfg(*extra)
    refuse_unavailable(cfg)  # the actors' GPUs are checked here (check_gpus)
    assert learner_device(cfg).type == ("cuda" if gpus else "cpu")


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (
            ["system.mode=async", "system.actor_gpus=0.5"],
            "system.actor_gpus: places Ray's rollout actors",
        ),
        (
            ["system.mode=async", "system.actor_placement=colocate"],
            "system.actor_placement: places Ray's rollout actors",
        ),
        ([*RAY, "system.actor_gpus=2"], "system.actor_gpus: must be 0 or in [0.0001, 1]"),
        ([*RAY, "system.actor_gpus=0.00005"], "system.actor_gpus: must be 0 or in [0.0001, 1]"),
        (
            [*RAY, "system.actor_placement=colocate", "system.actor_gpus=0"],
            "system.actor_placement: colocate shares the learner's GPU",
        ),
    ],
)
def test_actor_settings_that_would_do_nothing_or_cannot_be_are_refused(
    overrides: list[str], fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        build_config("sao", None, overrides)
    assert str(info.value).startswith(fragment) and "\n" not in str(info.value)
