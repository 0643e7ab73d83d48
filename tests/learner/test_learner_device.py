"""The learner's device: resolved once, every model placed on it, every micro-batch crossing
to it (issue 28). CI has no GPU: PyTorch's ``meta`` device stands in for one (a device that
is not the CPU), so a model left behind on the CPU shows in the audit."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from rlmap.assembly.parts import Parts, build
from rlmap.core.batch import Batch, End, RewardStatus
from rlmap.core.device import audit, resolve
from rlmap.core.errors import ConfigError
from rlmap.recipes import build_config

Toy = Callable[..., list[str]]
META = torch.device("meta")


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(
    ("setting", "count", "local_rank", "expected"),
    [
        ("auto", 0, None, "cpu"),  # no GPU: the CPU
        ("cpu", 2, None, "cpu"),  # a GPU machine trains on the CPU only when asked
        ("auto", 2, None, "cuda:0"),  # a GPU machine: its first GPU
        ("auto", 2, "1", "cuda:1"),  # a launcher's rank: its own GPU
        ("cuda", 2, "1", "cuda:1"),
        ("cuda:1", 2, "0", "cuda:1"),  # an explicit index wins over LOCAL_RANK
    ],
)
def test_the_device_is_resolved_from_the_setting_and_the_launcher(
    setting: str,
    count: int,
    local_rank: str | None,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_cuda(monkeypatch, count)
    environ = {} if local_rank is None else {"LOCAL_RANK": local_rank}
    assert resolve(setting, environ) == torch.device(expected)


@pytest.mark.parametrize(
    ("setting", "count", "fragment"),
    [
        ("cuda", 0, "system.device: cuda asks for CUDA"),
        ("cuda:0", 0, "system.device: cuda:0 asks for CUDA"),
        ("cuda:2", 2, "system.device: cuda:2 is not among this machine's 2 GPU(s)"),
        ("gpu", 2, "system.device: one of auto, cpu, cuda, cuda:N, got 'gpu'"),
    ],
)
def test_a_device_the_machine_lacks_is_one_line(
    setting: str, count: int, fragment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_cuda(monkeypatch, count)
    with pytest.raises(ConfigError) as caught:
        resolve(setting, {})
    assert str(caught.value).startswith(fragment) and "\n" not in str(caught.value)


def test_a_malformed_setting_is_refused_when_the_config_is_built() -> None:
    with pytest.raises(ConfigError, match=r"^system.device: one of auto, cpu, cuda, cuda:N"):
        build_config("grpo", None, ["system.device=gpu:0"])


def _every_field_batch() -> Batch:
    b, t = 2, 3
    kw = {f.name: torch.zeros(b, t) for f in dataclasses.fields(Batch)}
    kw |= {
        "tokens": torch.zeros(b, t, dtype=torch.long),
        "action_mask": torch.ones(b, t).bool(),
        "rewards": torch.ones(b),
        "group_id": torch.zeros(b, dtype=torch.long),
        "end": torch.full((b,), int(End.TERMINAL)),
        "eos": torch.ones(b).bool(),
        "reward_status": torch.full((b,), int(RewardStatus.OK)),
        "bootstrap_values": torch.zeros(b),
        "routed_experts": torch.zeros(b, t, 2, 1, dtype=torch.long),
        "sampling_set": torch.zeros(b, t, 2, dtype=torch.int32),
    }
    return Batch(**kw)


@pytest.mark.parametrize("target", ["cpu", "meta"])
def test_a_batch_crosses_whole_and_comes_back_equal(target: str) -> None:
    batch = _every_field_batch()
    moved = batch.to(target)
    for f in dataclasses.fields(Batch):
        x, y = getattr(batch, f.name), getattr(moved, f.name)
        assert y.device == torch.device(target) and y.dtype == x.dtype and y.shape == x.shape
    back = batch.to("cpu")
    assert all(
        torch.equal(getattr(batch, f.name), getattr(back, f.name))
        for f in dataclasses.fields(Batch)
    )
    sparse = batch.replace(turn_id=None, routed_experts=None).to(target)
    assert sparse.turn_id is None and sparse.routed_experts is None  # None stays None


def test_a_crossing_to_a_gpu_is_staged_in_pinned_memory_and_does_not_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlmap.core.batch import cross

    calls: list[object] = []

    class Staged:  # what pin_memory() returns, standing in for page-locked host memory
        def to(self, device: torch.device, non_blocking: bool = False) -> str:
            calls.append((device, non_blocking))
            return "on the GPU"

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append("pin") or Staged())
    cuda, host = torch.device("cuda", 0), torch.ones(3)
    assert cross(host, cuda) == "on the GPU" and calls == ["pin", (cuda, True)]
    calls.clear()
    assert cross(host, torch.device("cpu")) is host and calls == []  # already there: no copy
    assert cross(host, torch.device("meta")).device.type == "meta" and calls == []


def _parts_on_meta(
    recipe: str,
    overrides: list[str],
    model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    reward_path: Path | None = None,
) -> Parts:
    monkeypatch.setattr("rlmap.assembly.models.resolve", lambda setting: META)
    cfg = build_config(recipe, None, overrides)
    return build(cfg, model_dir, reward_path=reward_path)


def _audit(parts: Parts) -> dict[str, list[str]]:
    """Where everything of the run lives, after one optimiser step (AdamW's moments exist
    only then): zero gradients, so the step runs on any device without changing a weight."""
    optimizers = {"optimizer": parts.optimizer, "critic_optimizer": parts.critic_optimizer}
    for optimizer in (o for o in optimizers.values() if o is not None):
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = torch.zeros_like(p)
        optimizer.step()
    engine_model = getattr(parts.engine, "model", None)
    return audit(
        {
            "policy": parts.policy,
            "reference": parts.reference,
            "critic": parts.critic,
            "reward_model": parts.reward_model,
            "engine": engine_model,
        },
        optimizers,
    )


@pytest.fixture
def reward_model_dir(tiny_model_dir: Path, tmp_path: Path) -> Path:
    from rlmap.learned.reward_model import new_reward_model, save_reward_model

    path = tmp_path / "rm"
    save_reward_model(
        path,
        new_reward_model(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
        {"test": True},
    )
    return path


@pytest.mark.parametrize(
    ("recipe", "extra"),
    [
        ("grpo", []),  # policy + reference (KL in the loss)
        ("ppo", []),  # + the critic and its optimiser
        ("grpo", ["model.lora_rank=2"]),  # adapters created on the device, reference = base
        ("sao", []),  # asynchronous
        ("grpo", ["system.rollout_dtype=bfloat16"]),  # the HF engine's own (cast) copy
    ],
    ids=["grpo", "ppo", "lora", "sao", "own-copy-engine"],
)
def test_every_part_of_a_run_lives_on_the_configured_device(
    recipe: str,
    extra: list[str],
    tiny_model_dir: Path,
    toy: Toy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parts = _parts_on_meta(recipe, [*toy(tiny_model_dir), *extra], tiny_model_dir, monkeypatch)
    assert parts.device == META
    found = _audit(parts)
    assert set(found) == {"meta"}, {k: v[:3] for k, v in found.items() if k != "meta"}
    assert any(".state[" in name for name in found["meta"])  # AdamW's state was audited


def test_the_reward_model_of_classic_rlhf_lives_on_the_device_too(
    tiny_model_dir: Path, reward_model_dir: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = [*toy(tiny_model_dir), f"model.reward_path={reward_model_dir}"]
    parts = _parts_on_meta(
        "classic-rlhf", overrides, tiny_model_dir, monkeypatch, reward_path=reward_model_dir
    )
    assert parts.reward_model is not None
    assert set(_audit(parts)) == {"meta"}


def test_the_audit_finds_what_was_left_behind() -> None:
    # The audit itself can fail: a module with one parameter on each device shows both.
    mixed = torch.nn.Module()
    mixed.a = torch.nn.Linear(2, 2, device="meta")
    mixed.b = torch.nn.Linear(2, 2)
    found = audit({"m": mixed})
    assert sorted(found) == ["cpu", "meta"] and "m.b.weight" in found["cpu"]


def test_every_micro_batch_crosses_to_the_learners_device(
    tiny_model_dir: Path, toy: Toy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A spy on the crossing: the policy update's micro-batches (8 rollouts, micro-batches
    # of 3: 3 + 3 + 2) each cross once, to the policy's device — here a sentinel for it,
    # cpu:0 (a CPU device that is not equal to plain "cpu"), so a crossing to anything but
    # the model's device is seen.
    from rlmap.experiments.train import run_training
    from rlmap.learner import update_loop

    seen: list[tuple[int, torch.device]] = []
    real = Batch.to

    def spy(self: Batch, target: torch.device | str, **kw: bool) -> Batch:
        seen.append((self.size, torch.device(target)))
        return real(self, target, **kw)

    monkeypatch.setattr(Batch, "to", spy)
    sentinel = torch.device("cpu", 0)
    monkeypatch.setattr(update_loop, "model_device", lambda model: sentinel)
    cfg = build_config("grpo", None, [*toy(tiny_model_dir, steps=1), "kl.placement=none"])
    run_training(cfg, tmp_path / "run")
    assert sorted(size for size, _ in seen) == [2, 3, 3]
    assert {target for _, target in seen} == {sentinel}


def test_the_run_records_its_device_and_a_cpu_learner_reports_no_gpu_peak(
    tiny_model_dir: Path, toy: Toy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from rlmap.experiments.train import run_training

    run_training(build_config("grpo", None, toy(tiny_model_dir, steps=1)), tmp_path / "run")
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    recorded = {
        "device": "cpu",
        "device_name": "cpu",
        "cuda": None,
        "fp32_matmul": "highest",
        "deterministic_kernels": False,
    }
    assert {k: ledger[k] for k in recorded} == recorded == summary["device"]
    assert ledger["peak_gpu_memory_bytes"] is None
    assert ledger["peak_rollout_gpu_memory_bytes"] is None


def test_the_rollouts_peak_is_measured_alone_and_reaches_the_ledger(
    tiny_model_dir: Path, toy: Toy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # take_peak stands in for a GPU's counters: the rollout peaks at 3 MiB in step 1 and
    # 5 MiB in step 2. The step's metric is its own, the ledger keeps the larger (5 MiB).
    import json

    from rlmap.experiments.train import run_training
    from rlmap.system import sync

    peaks = iter([3 * 2**20, 5 * 2**20])
    monkeypatch.setattr(sync, "take_peak", lambda device: next(peaks))
    run_training(build_config("grpo", None, toy(tiny_model_dir, steps=2)), tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["system/rollout_peak_memory_mb"] for r in rows if r["step"] > 0] == [3.0, 5.0]
    for r in rows[1:]:  # the update's tokens (prompt and response) include every generated one
        tokens = r["system/update_tokens_per_s"] * r["system/policy_update_s"]
        assert tokens == pytest.approx(round(tokens)) and tokens > r["sampling/generated_tokens"]
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["peak_rollout_gpu_memory_bytes"] == 5 * 2**20


def test_a_phase_peak_starts_anew_and_a_cpu_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlmap.core.device import take_peak

    calls: list[str] = []
    monkeypatch.setattr(
        torch.cuda, "max_memory_allocated", lambda device=None: calls.append(f"read {device}") or 9
    )
    monkeypatch.setattr(
        torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(f"reset {device}")
    )
    assert take_peak(torch.device("cpu")) is None and calls == []
    assert take_peak(torch.device("cuda", 1)) == 9
    assert calls == ["read cuda:1", "reset cuda:1"]  # read, then the next phase starts at 0


def test_deterministic_kernels_on_a_gpu_set_torch_and_cublas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlmap.assembly.models import learner_device

    switched: list[bool] = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", switched.append)
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda value: None)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    _fake_cuda(monkeypatch, 2)
    off = build_config("grpo", None, ["system.device=cuda:1"])
    assert learner_device(off) == torch.device("cuda", 1) and switched == []
    on = build_config("grpo", None, ["system.device=cuda:1", "system.deterministic_kernels=true"])
    learner_device(on)
    assert switched == [True] and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own value is kept
    learner_device(on)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    switched.clear()  # a CPU run is deterministic already: nothing process-wide is switched
    learner_device(
        build_config("grpo", None, ["system.device=cpu", "system.deterministic_kernels=true"])
    )
    assert switched == []


def test_a_phase_timer_waits_for_the_devices_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from rlmap.core.device import elapsed

    synced: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    assert elapsed(time.perf_counter(), torch.device("cpu")) >= 0 and synced == []
    elapsed(time.perf_counter(), torch.device("cuda", 0))
    assert synced == [torch.device("cuda", 0)]


def test_peak_memory_is_the_learners_device_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: any CUDA in the process (a vLLM engine beside a CPU learner) was reported as
    # the learner's peak. Now: the learner's CUDA device, or None.
    from rlmap.experiments.ledger import measure_peak_memory

    asked: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "max_memory_allocated", lambda device=None: asked.append(device) or 7 * 2**20
    )
    assert measure_peak_memory(torch.device("cpu"))[1] is None
    assert measure_peak_memory(None)[1] is None
    assert measure_peak_memory(torch.device("cuda", 1))[1] == 7 * 2**20
    assert asked == [torch.device("cuda", 1)]


@pytest.mark.parametrize("recipe", ["grpo", "sao"])
def test_a_cpu_run_on_a_gpu_machine_never_starts_cuda(
    recipe: str,
    tiny_model_dir: Path,
    toy: Toy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A machine that looks like it has a GPU, where starting CUDA raises: a run asked onto
    # the CPU trains, evaluates, checkpoints and resumes without touching it. Before: every
    # fork_rng() and the checkpoint's RNG capture read every GPU's generator.
    from rlmap.experiments.train import run_training

    def no_cuda(*args: object, **kwargs: object) -> None:
        raise AssertionError("CUDA was started by a CPU run")

    _fake_cuda(monkeypatch, 1)
    monkeypatch.setattr(torch.cuda, "_lazy_init", no_cuda)
    cfg = build_config(
        recipe, None, [*toy(tiny_model_dir, steps=2), "system.device=cpu", "model.lora_rank=2"]
    )
    run_training(cfg, tmp_path / "run")
    cfg = build_config(
        recipe, None, [*toy(tiny_model_dir, steps=3), "system.device=cpu", "model.lora_rank=2"]
    )
    run_training(cfg, tmp_path / "run", resume=True)
    assert (tmp_path / "run" / "checkpoints" / "step_3").is_dir()


def test_mfu_is_six_n_tokens_over_the_devices_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlmap.core.device import mfu

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    # 6 · 0.5e9 parameters · 20,000 tokens = 6e13 FLOPs in 0.25 s = 2.4e14 FLOP/s;
    # ÷ 989.4e12 (H200 BF16 dense) = 0.24257...; ÷ 66.9e12 (FP32) = 3.587...
    cuda, six_n = torch.device("cuda", 0), 6 * 500_000_000
    assert mfu(six_n, 20_000, 0.25, cuda, "bfloat16") == pytest.approx(2.4e14 / 989.4e12)
    assert mfu(six_n, 20_000, 0.25, cuda, "float32") == pytest.approx(2.4e14 / 66.9e12)
    assert mfu(six_n, 20_000, 0.25, torch.device("cpu"), "float32") is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")
    assert mfu(six_n, 20_000, 0.25, cuda, "bfloat16") is None  # no peak known: no figure


def test_a_frozen_parameter_costs_an_update_four_flops_a_token_not_six() -> None:
    from rlmap.core.device import update_flops_per_token

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2, bias=False))
    model[0].requires_grad_(False)  # 3·2 + 2 = 8 frozen, 2·2 = 4 trained
    assert update_flops_per_token(model) == 4 * 8 + 6 * 4
