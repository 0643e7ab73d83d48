"""Memory and precision options: activation checkpointing, bfloat16 autocast over float32
weights, and the peak memory of every step."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlmap.assembly.parts import build
from rlmap.engines.hf import HFEngine
from rlmap.experiments.ledger import peak_memory_mb
from rlmap.experiments.train import run_training
from rlmap.learner.critic import critic_outputs
from rlmap.learner.logprobs import ChunkedLogprobs, _full_logprobs, token_logprobs
from rlmap.learner.memory import autocast_to, checkpoint_activations
from rlmap.recipes import build_config
from rlmap.system.loop_state import LoopState
from rlmap.system.sync import sync_step
from rlmap.tasks.prompts import encode_prompt

Toy = Callable[..., list[str]]


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 40, (3, 9), generator=g)
    attention = torch.ones_like(tokens, dtype=torch.bool)
    attention[0, :3] = False  # left padding, as the learner's batches have
    return tokens, attention


def _first_projection(model: nn.Module) -> list[nn.Module]:
    return [m for name, m in model.named_modules() if name.endswith("layers.0.self_attn.q_proj")]


@contextmanager
def _calls(model: nn.Module) -> Iterator[list[tuple[bool, torch.dtype, int]]]:
    """(inference mode?, output dtype, positions) of every call of the first layer's first
    linear layer (q_proj).

    Not a hook on the layer: checkpointing recomputes it by calling its ``forward`` directly
    (no hook of the layer fires). Nor on its last module: the recomputation stops as soon as
    it has remade the tensors backward needs (torch's early stop), before the layer's last
    module returns."""
    seen: list[tuple[bool, torch.dtype, int]] = []

    def hook(module: nn.Module, args: object, out: torch.Tensor) -> None:
        seen.append((torch.is_inference_mode_enabled(), out.dtype, out.shape[-2]))

    handles = [m.register_forward_hook(hook) for m in _first_projection(model)]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


# --- activation checkpointing ------------------------------------------------------------


def test_checkpointing_gives_the_same_loss_and_gradients_and_recomputes(
    tiny_model_dir: Path,
) -> None:
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir).train()
    checkpointed = copy.deepcopy(plain)
    checkpoint_activations(checkpointed)
    tokens, attention = _tokens()
    weights = torch.randn(tokens.shape, generator=torch.Generator().manual_seed(1))
    losses, counts = [], []
    for model in (plain, checkpointed):
        with _calls(model) as seen:
            logprobs, _ = token_logprobs(model, tokens, attention, with_entropy=True)
            loss = (logprobs * weights).sum()
            loss.backward()
        losses.append(loss.detach())
        counts.append(len(seen))
    assert counts == [1, 2]  # checkpointed: the layer runs again in backward
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None, name
        assert float((b.grad - a.grad).norm() / a.grad.norm()) <= 1e-6, name


def test_the_option_checkpoints_the_policy_and_the_critic(tiny_model_dir: Path, toy: Toy) -> None:
    cfg = build_config("ppo", None, [*toy(tiny_model_dir), "optim.gradient_checkpointing=true"])
    parts = build(cfg, tiny_model_dir)
    assert parts.critic is not None
    tokens, attention = _tokens()
    for run, model in [
        (lambda: token_logprobs(parts.policy, tokens, attention)[0], parts.policy),
        (lambda: critic_outputs(parts.critic, tokens, attention), parts.critic),
    ]:
        with _calls(model) as seen:
            run().sum().backward()
        assert len(seen) == 2, type(model).__name__  # forward, and its recomputation
    off = build(build_config("ppo", None, toy(tiny_model_dir)), tiny_model_dir)
    with _calls(off.policy) as seen:
        token_logprobs(off.policy, tokens, attention)[0].sum().backward()
    assert len(seen) == 1


def test_a_checkpointed_policy_still_generates_the_same_with_the_kv_cache(
    tiny_model_dir: Path,
) -> None:
    # The engine shares the training-mode policy; generation runs in eval mode under
    # inference_mode, where transformers does not checkpoint and keeps the KV cache.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir).train()
    checkpointed = copy.deepcopy(plain)
    checkpoint_activations(checkpointed)
    prompt = [encode_prompt(tokenizer, "37+85=")]
    out = []
    for model in (plain, checkpointed):
        engine = HFEngine(
            model, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
        )
        assert engine.shares_policy
        torch.manual_seed(0)
        with _calls(model) as seen:
            out.append(
                engine.generate(prompt, n=3, max_new_tokens=5, temperature=1.0, top_p=1.0)[0]
            )
        assert model.training  # restored after generation
        positions = [n for _, _, n in seen]
        assert positions[0] == len(prompt[0]) and set(positions[1:]) == {1}  # cached decoding
    assert [c.response_ids for c in out[1]] == [c.response_ids for c in out[0]]
    assert [c.logprobs for c in out[1]] == [c.logprobs for c in out[0]]


# --- bfloat16 autocast over float32 weights ------------------------------------------------


def test_chunked_logprobs_reduce_in_float32_and_backward_replays_autocast() -> None:
    # N = 12 positions, H = 16, V = 50; logits of size ~10, so bfloat16 rounds them by ~0.03
    g = torch.Generator().manual_seed(3)
    h = torch.randn(12, 16, generator=g, requires_grad=True)
    w = (3 * torch.randn(50, 16, generator=g)).requires_grad_()
    b = torch.randn(50, generator=g).requires_grad_()
    targets = torch.randint(0, 50, (12,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logprobs, _ = ChunkedLogprobs.apply(h, w, b, targets, 1.0, 5, False)
    # the product is bfloat16 (as autocast makes it), the log-softmax of its logits float32
    z = nn.functional.linear(
        h.detach().bfloat16(), w.detach().bfloat16(), b.detach().bfloat16()
    ).double()
    reference = torch.log_softmax(z, -1)[torch.arange(12), targets]
    assert logprobs.dtype == torch.float32
    assert float((logprobs.detach().double() - reference).abs().max()) < 1e-5  # bf16: ~1e-2
    logprobs.sum().backward()
    # ∂b_v = Σ_n (onehot − p)_{n,v}, and Σ_v (onehot − p) = 1 − Σ_v p = 0 when backward's
    # recomputed logits are the forward's; recomputed in float32 (autocast not replayed)
    # the sum is -0.16 here
    assert b.grad is not None
    assert abs(float(b.grad.sum())) < 1e-4


def test_bf16_logprobs_and_gradients_differ_from_fp32_by_rounding_only(
    tiny_model_dir: Path,
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).train()
    autocast = copy.deepcopy(model)
    tokens, attention = _tokens()
    exact, _ = token_logprobs(model, tokens, attention)
    with autocast_to(autocast, torch.bfloat16), _calls(autocast) as seen:
        mixed, _ = token_logprobs(autocast, tokens, attention)
        full, _ = _full_logprobs(copy.deepcopy(autocast), tokens, attention, 1.0, False)
    assert {dtype for _, dtype, _ in seen} == {torch.bfloat16}
    gap = float((mixed - exact)[:, 1:].abs().max())
    assert 1e-5 < gap < 5e-2  # float32 noise is ~1e-7; bfloat16 keeps 8 significant bits
    torch.testing.assert_close(mixed, full, rtol=0, atol=1e-5)  # the full path, autocast alike
    exact.sum().backward()
    mixed.sum().backward()
    for a, b in zip(model.parameters(), autocast.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None and b.grad.dtype == torch.float32
        assert float((b.grad - a.grad).norm() / a.grad.norm()) < 5e-2


@pytest.mark.parametrize("rollout", ["float32", "bfloat16"])
def test_bf16_training_keeps_float32_weights_and_optimiser_state(
    tiny_model_dir: Path, toy: Toy, rollout: str
) -> None:
    cfg = build_config(
        "ppo",
        None,
        [
            *toy(tiny_model_dir),
            "system.train_dtype=bfloat16",
            f"system.rollout_dtype={rollout}",
            "kl.placement=loss",
            "kl.beta=0.1",
            "critic.warmup_steps=0",
        ],
    )
    p = build(cfg, tiny_model_dir)
    assert p.critic is not None and p.reference is not None
    models = {"policy": p.policy, "reference": p.reference, "critic": p.critic}
    start = {k: [w.detach().clone() for w in m.parameters()] for k, m in models.items()}
    assert isinstance(p.engine, HFEngine) and p.engine.shares_policy == (rollout == "float32")
    with _calls(p.policy) as seen, _calls(p.reference) as ref, _calls(p.critic) as critic:
        _, metrics = sync_step(p, LoopState())
    assert "loss/policy" in metrics and "critic/value_loss" in metrics
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    learner = [dtype for inference, dtype, _ in seen if not inference]
    rollouts = [dtype for inference, dtype, _ in seen if inference]
    assert learner and set(learner) == {torch.bfloat16}  # policy loss (and π_old, if run)
    assert {d for _, d, _ in ref} == {torch.bfloat16} and {d for _, d, _ in critic} == {
        torch.bfloat16
    }
    assert set(rollouts) == ({torch.float32} if rollout == "float32" else set())  # own copy
    # π_ref is the start weights under the same autocast: at step 0 the KL is rounding only
    assert abs(metrics["kl/mean"]) < 1e-6
    for name, model in models.items():
        assert {w.dtype for w in model.parameters()} == {torch.float32}, name
    for optimizer in (p.optimizer, p.critic_optimizer):
        assert optimizer is not None
        moments = [t for s in optimizer.state.values() for t in s.values() if t.numel() > 1]
        assert moments and {t.dtype for t in moments} == {torch.float32}
    for name in ("policy", "critic"):
        after = list(models[name].parameters())
        assert all(torch.isfinite(w).all() for w in after)
        assert any(not torch.equal(a, b) for a, b in zip(after, start[name], strict=True)), name


def test_the_reward_model_scores_under_the_same_autocast(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    from rlmap.learned.reward_model import new_reward_model, save_reward_model
    from rlmap.system.rounds import learned_rewards, rollout_round

    rm = tmp_path / "rm"
    save_reward_model(
        rm,
        new_reward_model(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
        {"test": True},
    )
    cfg = build_config(
        "classic-rlhf",
        None,
        [*toy(tiny_model_dir), f"model.reward_path={rm}", "system.train_dtype=bfloat16"],
    )
    p = build(cfg, tiny_model_dir, reward_path=rm)
    assert p.reward_model is not None
    assert {w.dtype for w in p.reward_model.parameters()} == {torch.float32}
    episodes = [x.episode for x in rollout_round(p, p.train[:1], 0)]
    with _calls(p.reward_model) as seen:
        scores = learned_rewards(p, episodes)
    assert {dtype for _, dtype, _ in seen} == {torch.bfloat16}
    assert all(torch.isfinite(torch.tensor(scores)))


# --- peak memory ---------------------------------------------------------------------------


def test_a_run_with_the_options_logs_every_steps_peak_memory(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    options = ["system.train_dtype=bfloat16", "optim.gradient_checkpointing=true"]
    run_training(build_config("grpo", None, [*toy(tiny_model_dir), *options]), tmp_path / "run")
    records = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in records if r["step"] > 0]
    assert len(steps) == 2 and all(r["system/peak_memory_mb"] > 0 for r in steps)
    assert all(math.isfinite(r["loss/total"]) for r in steps)
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["peak_host_memory_kib"] >= steps[-1]["system/peak_memory_mb"] * 1024 - 1
    assert ledger["precision"] == "train bfloat16 autocast / rollout float32"
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoints" / "step_2")
    assert {w.dtype for w in saved.parameters()} == {torch.float32}


def test_peak_memory_is_the_gpus_when_cuda_was_used_else_the_hosts() -> None:
    assert peak_memory_mb(2048, None) == 2.0  # KiB of resident set
    assert peak_memory_mb(2048, 0) == 2.0  # CUDA present, but the run never used it
    assert peak_memory_mb(2048, 3 * 2**20) == 3.0
