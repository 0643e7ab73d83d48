"""Weight sync as a stream: (name, tensor) pairs one at a time, never a second whole model.

The stream must carry exactly what a rollout engine samples from — a plain model's own
tensors, a LoRA policy's W + (α/r)·B·A as peft itself merges it — computing a merged layer
only when its turn comes; engines take it tensor by tensor and refuse a wrong name in one
line; the asynchronous loop's board keeps its snapshot in the rollout dtype and times it.
(FSDP2's per-parameter gathers on two gloo ranks: tests/learner/test_learner_data_parallel.py.)
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import SMALL
from torch import nn

from rlmap.embedded.tiny import build_tiny_model
from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.engines.hf import PARTIAL, HFEngine
from rlmap.experiments.train import run_training
from rlmap.learner.distributed import World
from rlmap.models import lora
from rlmap.models.lora import rollout_stream, rollout_weights
from rlmap.recipes import build_config
from rlmap.system import board as board_module
from rlmap.system.board import Board, snapshot_copy
from rlmap.system.learner_step import publish

TARGETS = ("q_proj", "v_proj", "down_proj")


def _model() -> nn.Module:
    """A one-layer Qwen2 of 32 dimensions, built here (nothing read from disk)."""
    return build_tiny_model(build_tokenizer(), SMALL, seed=0).eval()


def _adapted() -> nn.Module:
    """The model with LoRA on three layers and every adapter weight drawn at random (B = 0,
    as peft starts it, would make every merged layer its base)."""
    pytest.importorskip("peft")
    model = lora.attach(_model(), rank=4, alpha=8.0, targets=TARGETS, seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return model


def test_a_plain_models_stream_is_its_state_dict_without_a_copy() -> None:
    model = _model()
    state = model.state_dict()
    stream = list(rollout_stream(model))
    assert [n for n, _ in stream] == list(state)  # every name, in the state dict's order
    for name, tensor in stream:  # the model's own storage: nothing was copied
        assert tensor.data_ptr() == state[name].data_ptr() and torch.equal(tensor, state[name])
    assert list(rollout_weights(model)) == list(state)


def test_a_lora_stream_is_peft_own_merge_under_the_base_names() -> None:
    adapted = _adapted()
    # peft's merge_and_unload writes W += (α/r)·B·A into a copy's base layers: the same sum
    # in the same dtype, so the stream must match it bit for bit
    expected = copy.deepcopy(adapted).merge_and_unload().state_dict()
    base = _model().state_dict()
    stream = list(rollout_stream(adapted))
    assert [n for n, _ in stream] == list(expected)  # plain names: no base_layer, no lora_
    for name, tensor in stream:
        assert torch.equal(tensor, expected[name]), name
    merged = [n for n, t in stream if not torch.equal(t, base[n])]
    assert sorted(merged) == sorted(
        f"model.layers.0.{m}.{t}.weight"
        for m, t in (("self_attn", "q_proj"), ("self_attn", "v_proj"), ("mlp", "down_proj"))
    )
    weights = rollout_weights(adapted)
    assert all(torch.equal(weights[n], t) for n, t in stream)


def test_the_lora_stream_merges_a_layer_only_when_it_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At most one merged layer at a time: ΔW of a layer is computed when the stream reaches
    # its weight, not before (an eager merge would compute all three on the first pair).
    from peft.tuners.lora import Linear

    adapted = _adapted()
    real, calls = Linear.get_delta_weight, []

    def counted(self: Any, adapter: str) -> torch.Tensor:
        calls.append(adapter)
        return real(self, adapter)

    monkeypatch.setattr(Linear, "get_delta_weight", counted)
    stream = rollout_stream(adapted)
    assert calls == []  # nothing computed before the first pair is asked for
    seen = 0
    for name, _ in stream:
        seen += any(f".{t}.weight" in name for t in TARGETS)
        assert len(calls) == seen, name  # one ΔW per adapted layer passed, none ahead
    assert seen == 3


def test_the_stream_casts_floating_parameters_and_moves_them_on_request() -> None:
    model = _model()
    model.register_buffer("steps", torch.tensor([3, 4]))  # an integer tensor: never cast
    model.model.norm.register_buffer("scale", torch.tensor([0.1]))  # a buffer keeps its dtype
    state = model.state_dict()
    half = dict(rollout_stream(model, dtype=torch.bfloat16))
    assert list(half) == list(state)
    for name, tensor in half.items():
        if name in ("steps", "model.norm.scale"):
            assert tensor.dtype == state[name].dtype and torch.equal(tensor, state[name])
        else:  # rounded once, from the float32 value
            assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, state[name].bfloat16())
    moved = dict(rollout_stream(model, dtype=torch.bfloat16, device="meta"))
    assert {t.device.type for t in moved.values()} == {"meta"}
    assert all(moved[n].shape == state[n].shape for n in state)


# --- engines take it tensor by tensor ----------------------------------------------------


def _engine(model: nn.Module) -> HFEngine:
    return HFEngine(model, pad_token_id=0, eos_token_id=2, dtype=torch.bfloat16)  # own copy


def _perturbed(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: t + 0.5 for n, t in model.state_dict().items()}


def test_an_own_copy_engine_copies_a_stream_in_casting_each_tensor() -> None:
    model = _model()
    engine = _engine(model)
    new = _perturbed(model)
    engine.set_weights((pair for pair in new.items()), 7)  # a generator: read once, in order
    assert engine.version == 7
    own = engine.model.state_dict()
    for name, tensor in new.items():
        assert own[name].dtype == torch.bfloat16 and torch.equal(own[name], tensor.bfloat16())


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda s: [*s, ("model.extra.weight", torch.zeros(1))], "unexpected ['model.extra"),
        (lambda s: s[:-1], "missing ['lm_head.weight']"),
        (lambda s: [s[0], *s], "model.embed_tokens.weight twice"),
        (lambda s: [(s[0][0], torch.zeros(1)), *s[1:]], "has shape (1,), the engine's (51, 32)"),
    ],
    ids=["unexpected", "missing", "twice", "shape"],
)
def test_a_stream_that_does_not_fit_the_engine_is_refused_in_one_line(
    change: Callable[[list[tuple[str, torch.Tensor]]], list[tuple[str, torch.Tensor]]],
    says: str,
) -> None:
    model = _model()
    engine = _engine(model)
    engine.set_weights(model.state_dict(), 3)
    with pytest.raises(ValueError, match=r"^set_weights: ") as info:
        engine.set_weights(iter(change(list(_perturbed(model).items()))), 4)
    assert says in str(info.value) and "\n" not in str(info.value)
    # part of it may be in: the engine holds no version's weights, so a worker reloads
    assert engine.version == PARTIAL


def test_a_dict_that_does_not_fit_is_refused_before_anything_is_copied() -> None:
    model = _model()
    engine = _engine(model)
    engine.set_weights(model.state_dict(), 3)
    before = {n: t.clone() for n, t in engine.model.state_dict().items()}
    new = _perturbed(model)
    del new["lm_head.weight"]
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\], unexpected \[\]"):
        engine.set_weights(new, 4)
    assert engine.version == 3
    assert all(torch.equal(t, before[n]) for n, t in engine.model.state_dict().items())


def test_the_synchronous_loop_streams_fsdp2_weights_through_the_engine() -> None:
    # FSDP2 used to gather the whole state dict (full_state_dict) and hand it over; now the
    # engine pulls the policy's stream, each parameter gathered as its turn comes
    calls: list[tuple[str, Any, int]] = []

    class Engine:
        def update_weights(self, model: nn.Module, version: int) -> None:
            calls.append(("update_weights", model, version))

        def set_weights(self, state: Any, version: int) -> None:
            calls.append(("set_weights", state, version))

    policy = _model()
    parts = SimpleNamespace(
        world=World(rank=0, size=2, sharding="fsdp2"),
        engine=Engine(),
        policy=policy,
        trained=policy,
        device=torch.device("cpu"),
    )
    publish(parts, 5)  # type: ignore[arg-type]
    assert calls == [("update_weights", policy, 5)]


# --- the asynchronous loop's board --------------------------------------------------------


def test_the_board_keeps_its_own_snapshot_in_the_rollout_dtype() -> None:
    model = _model()
    state = {n: t.clone() for n, t in model.state_dict().items()}
    board = Board(0, {}, dtype=torch.bfloat16)
    board.publish(model, 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)  # the learner trains on: the published snapshot must not move
    version, snapshot = board.latest()
    assert version == 1 and list(snapshot) == list(state)
    for name, tensor in snapshot.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, state[name].bfloat16())


def test_a_lora_boards_snapshot_is_the_merged_weights_in_the_rollout_dtype() -> None:
    adapted = _adapted()
    expected = copy.deepcopy(adapted).merge_and_unload().state_dict()
    board = Board(0, {}, dtype=torch.bfloat16, host=True)
    board.publish(adapted, 2)
    snapshot = board.latest()[1]
    assert list(snapshot) == list(expected)
    for name, tensor in snapshot.items():  # on a CPU learner "host" pins nothing (it raises)
        assert tensor.device.type == "cpu" and not tensor.is_pinned()
        assert torch.equal(tensor, expected[name].bfloat16()), name


class _OnGPU:
    """Stands in for a tensor on a GPU (none here): what snapshot_copy reads of one."""

    shape, dtype, is_cuda, device = (2, 3), torch.float32, True, torch.device("cuda", 0)

    def is_floating_point(self) -> bool:
        return True


def test_a_host_snapshot_of_a_gpu_tensor_is_pinned_and_a_device_one_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[dict[str, Any]] = []

    class Buffer:
        def copy_(self, src: Any) -> Buffer:
            made[-1]["from"] = src
            return self

    def empty(shape: Any, **kw: Any) -> Buffer:
        made.append({"shape": shape, **kw})
        return Buffer()

    monkeypatch.setattr(board_module.torch, "empty", empty)
    gpu = _OnGPU()
    snapshot_copy(gpu, torch.bfloat16, True)  # type: ignore[arg-type]
    snapshot_copy(gpu, torch.bfloat16, False)  # type: ignore[arg-type]
    assert [(m["device"], m["pin_memory"], m["dtype"]) for m in made] == [
        (torch.device("cpu"), True, torch.bfloat16),  # Ray: page-locked host memory
        (torch.device("cuda", 0), False, torch.bfloat16),  # in-process: stays on the GPU
    ]
    assert all(m["from"] is gpu for m in made)


def test_the_async_loop_times_its_weight_sync(
    tiny_model_dir: Path,
    tmp_path: Path,
    toy: Callable[..., list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A board snapshot that takes 0.2 s more: each step's system/weight_sync_s must show it
    # (before, the async loop only timed the learner's own engine: next to nothing).
    real = Board.publish

    def slow(self: Board, model: nn.Module, version: int) -> None:
        time.sleep(0.2)
        real(self, model, version)

    monkeypatch.setattr(Board, "publish", slow)
    cfg = build_config("grpo", None, [*toy(tiny_model_dir), "system.mode=async"])
    run_training(cfg, tmp_path / "run")
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(x) for x in lines][1:]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["system/weight_sync_s"] >= 0.2 for r in steps)
