"""Shared fixtures: a tiny Hugging Face model directory built locally (nothing downloaded)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rlmap.embedded.tiny import TinySpec, build_tiny_model
from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.tasks.calculator import END_CALL, TOOL_TOKENS

# Tests run in two xdist workers on two cores: one torch thread each, or the workers'
# OpenMP threads fight over the cores and everything runs many times slower.
torch.set_num_threads(1)

SMALL = TinySpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=32,
)


def _saved_model(
    factory: pytest.TempPathFactory, name: str, spec: TinySpec, extra_tokens: tuple[str, ...] = ()
) -> Path:
    """A random model + tokenizer saved in Hugging Face format (nothing downloaded)."""
    path = factory.mktemp(name)
    tokenizer = build_tokenizer(extra_tokens=extra_tokens)
    build_tiny_model(tokenizer, spec, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


VLLM_SPEC = TinySpec(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
)
"""A toy model vLLM's CPU attention runs (head dim 32; SMALL's 16 is not supported)."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A very small random model with the embedded tokenizer."""
    return _saved_model(tmp_path_factory, "tiny-model", SMALL)


@pytest.fixture(scope="session")
def wide_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As ``tiny_model_dir``, with every printable character (prose tasks) and 128 positions."""
    from dataclasses import replace

    from rlmap.embedded.warmstart import PRINTABLE

    path = tmp_path_factory.mktemp("wide-model")
    tokenizer = build_tokenizer(characters=PRINTABLE)
    build_tiny_model(
        tokenizer, replace(SMALL, max_position_embeddings=128), seed=0
    ).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_calc_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As ``tiny_model_dir``, with the calculator task's tokenizer (tool markers as tokens)."""
    return _saved_model(tmp_path_factory, "tiny-calc-model", SMALL, TOOL_TOKENS)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As ``tiny_model_dir``, with ``VLLM_SPEC``'s shape."""
    return _saved_model(tmp_path_factory, "vllm-model", VLLM_SPEC)


@pytest.fixture(scope="session")
def vllm_calc_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As ``vllm_model_dir``, with the calculator task's tokenizer."""
    return _saved_model(tmp_path_factory, "vllm-calc-model", VLLM_SPEC, TOOL_TOKENS)


@pytest.fixture(scope="session")
def tiny_moe_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As ``tiny_model_dir``, a Qwen3-MoE: 2 layers of 4 experts, top-2."""
    spec = TinySpec(**{**SMALL.__dict__, "num_hidden_layers": 2, "experts": 4})
    return _saved_model(tmp_path_factory, "tiny-moe-model", spec)


def always_calling_model(path: Path, context: int = SMALL.max_position_embeddings) -> Path:
    """A tiny calculator model (``context`` positions) whose every turn is the one token
    ``</calc>``: an (empty, so failing) tool call answered by ``<result>error</result>``,
    never an answer, so each episode spends its whole turn budget. Built by hand: every
    layer adds the same large vector u (attention reads a constant value through its bias,
    the MLP is off), and the tied embedding of ``</calc>`` is 50·u, so its logit is ~280 and
    every other's ~0."""
    from dataclasses import replace

    tokenizer = build_tokenizer(extra_tokens=TOOL_TOKENS)
    model = build_tiny_model(tokenizer, replace(SMALL, max_position_embeddings=context), seed=0)
    close = int(tokenizer.convert_tokens_to_ids(END_CALL))
    u = torch.nn.functional.normalize(
        torch.randn(SMALL.hidden_size, generator=torch.Generator().manual_seed(0)), dim=0
    )
    with torch.no_grad():
        model.get_input_embeddings().weight[close] = 50.0 * u
        for layer in model.model.layers:
            attention = layer.self_attn
            attention.v_proj.weight.zero_()
            attention.v_proj.bias.fill_(1.0)  # every head reads 1s: the value is constant
            heads = attention.o_proj.weight.shape[1]
            attention.o_proj.weight.copy_(1000.0 * u[:, None] / heads * torch.ones(1, heads))
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def policy_batches(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every batch the policy is updated on, in order (a spy on ``update_policy``)."""
    from rlmap.system import learner_step

    batches: list[Any] = []
    real = learner_step.update_policy

    def spy(policy: Any, optimizer: Any, scheduler: Any, batch: Any, *rest: Any, **kw: Any) -> Any:
        batches.append(batch)
        return real(policy, optimizer, scheduler, batch, *rest, **kw)

    monkeypatch.setattr(learner_step, "update_policy", spy)
    return batches


def _toy_overrides(model_dir: Path, steps: int = 2) -> list[str]:
    """Overrides that shrink any preset to a run of a second or two on ``model_dir``."""
    return [
        f"model.path={model_dir}",
        f"optim.steps={steps}",
        "sampling.prompts_per_step=2",
        "sampling.group_size=4",
        "generation.max_new_tokens=4",
        "generation.eval_samples=2",
        "data.train_size=40",
        "data.eval_size=4",
        "run.eval_every=1",
        "run.checkpoint_every=1",
        "run.progress=false",
        "optim.micro_batch_size=3",
    ]


@pytest.fixture(scope="session")
def toy() -> Callable[..., list[str]]:
    """``toy(model_dir, steps=2)``: config overrides for a toy-scale run."""
    return _toy_overrides


@pytest.fixture
def crash_in_step(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``crash_in_step(cfg, run_dir, step)``: train ``cfg`` into ``run_dir`` until a simulated
    crash (KeyboardInterrupt) at the start of ``step``; the real step is back afterwards,
    so a ``run_training(..., resume=True)`` that follows runs normally."""
    from rlmap.experiments import train_step
    from rlmap.experiments.train import run_training

    def crash(cfg: Any, run_dir: Path, step: int) -> None:
        real = train_step.sync_step

        def crashing(parts, state):  # type: ignore[no-untyped-def]
            if state.step + 1 == step:
                raise KeyboardInterrupt("simulated crash")
            return real(parts, state)

        monkeypatch.setattr(train_step, "sync_step", crashing)
        try:
            with pytest.raises(KeyboardInterrupt):
                run_training(cfg, run_dir)
        finally:
            monkeypatch.setattr(train_step, "sync_step", real)

    return crash


CHECKED_FOR_METRICS = ("e2e", "system")
"""Test folders whose runs are checked for undeclared metric names (tests/metric_names.py)."""


@pytest.fixture(autouse=True)
def _declared_metrics(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test in tests/e2e or tests/system: every ``metrics.jsonl`` it left under its
    ``tmp_path`` emits only names declared in rlmap.core.metrics (its runs are real runs;
    other folders write hand-made rows on purpose)."""
    folder = Path(str(request.node.path)).parent.name
    checked = folder in CHECKED_FOR_METRICS and "tmp_path" in request.fixturenames
    root = request.getfixturevalue("tmp_path") if checked else None
    yield
    if root is not None:
        from metric_names import assert_declared

        assert_declared(root)
