"""Chunked log-probs: the full path's values and gradients, without the (B, T, V) logits."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlmap.learner.logprobs import ChunkedLogprobs, _full_logprobs, _plain_lm_head, token_logprobs


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 40, (3, 9), generator=g)
    attention = torch.ones_like(tokens, dtype=torch.bool)
    attention[0, :3] = False  # left padding, as the learner's batches have
    attention[1, :1] = False
    return tokens, attention


@pytest.mark.parametrize("chunk", [1, 7, 4096])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_entropy_and_gradients_equal_the_full_logits_path(
    tiny_model_dir: Path, chunk: int, temperature: float
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert _plain_lm_head(model) is not None  # the embedded model takes the chunked path
    full_model = copy.deepcopy(model)
    tokens, attention = _tokens()
    weights = torch.randn(tokens.shape, generator=torch.Generator().manual_seed(1))
    ours, ent = token_logprobs(
        model, tokens, attention, temperature=temperature, with_entropy=True, chunk=chunk
    )
    ref, ref_ent = _full_logprobs(full_model, tokens, attention, temperature, True)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    assert ent is not None and ref_ent is not None
    torch.testing.assert_close(ent, ref_ent, rtol=1e-6, atol=1e-6)
    (ours * weights).sum().backward()
    (ref * weights).sum().backward()
    for (name, a), b in zip(model.named_parameters(), full_model.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None, name
        # relative to the gradient's norm: chunks sum in another order (float32 rounding)
        assert float((a.grad - b.grad).norm() / b.grad.norm()) <= 1e-6, name


def test_the_function_against_a_log_softmax_reference_and_gradcheck() -> None:
    # N = 5 positions, H = 3, V = 6, in float64 so gradcheck's finite differences agree
    g = torch.Generator().manual_seed(2)
    h = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 5, 2, 2, 3])

    def chunked(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ChunkedLogprobs.apply(h, w, b, targets, 1 / 0.8, 2, False)[0]

    reference = torch.log_softmax((h @ w.T + b) / 0.8, -1)[torch.arange(5), targets]
    torch.testing.assert_close(chunked(h, w, b), reference, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda h, w, b: ChunkedLogprobs.apply(h, w, b, targets, 1 / 0.8, 2, False)[0],
        (h, w, b),
        eps=1e-6,
        atol=1e-4,
    )


def test_the_chunk_size_changes_nothing(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokens, attention = _tokens()
    with torch.no_grad():
        one = token_logprobs(model, tokens, attention, chunk=1)[0]
        all_at_once = token_logprobs(model, tokens, attention, chunk=10_000)[0]
    torch.testing.assert_close(one, all_at_once, rtol=1e-6, atol=1e-7)


def _scaled_head_model(kind: str) -> Any:
    """A tiny random model whose logits are not h Wᵀ: Gemma-2's soft cap c·tanh(h Wᵀ / c)
    (c = 5) or Cohere's scale s·h Wᵀ (s = 0.25). Its head is scaled up so the logits are
    about 20 and the cap or scale changes every log-prob (a cap of 5 on logits near 0.1,
    the random initialisation's, would change next to nothing)."""
    from transformers import CohereConfig, CohereForCausalLM, Gemma2Config, Gemma2ForCausalLM

    shape: dict[str, Any] = dict(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model: Any
    if kind == "softcap":
        model = Gemma2ForCausalLM(Gemma2Config(**shape, final_logit_softcapping=5.0))
    else:
        model = CohereForCausalLM(CohereConfig(**shape, logit_scale=0.25))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(200.0)
    return model.eval()


def _next_token(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(B, T-1): log_softmax(logits / 0.7) at each next token, tokens[:, 1:]."""
    return torch.log_softmax(logits / 0.7, -1).gather(-1, tokens[:, 1:, None])[..., 0]


@pytest.mark.parametrize("kind", ["softcap", "scale"])
def test_soft_capped_or_scaled_logits_give_their_own_log_probs(kind: str) -> None:
    # Reference by hand: the trunk's last hidden states h, z = h Wᵀ, then the model's own
    # map — 5·tanh(z / 5) or 0.25·z — divided by T = 0.7, log_softmax, the next token's entry
    model = _scaled_head_model(kind)
    tokens, attention = _tokens()
    with torch.no_grad():
        ours, _ = token_logprobs(model, tokens, attention, temperature=0.7)
        positions = (attention.long().cumsum(-1) - 1).clamp(min=0)  # over real tokens
        h = model.model(
            input_ids=tokens, attention_mask=attention, position_ids=positions
        ).last_hidden_state[:, :-1]
        z = h @ model.get_output_embeddings().weight.T
        mapped = 5.0 * torch.tanh(z / 5.0) if kind == "softcap" else 0.25 * z
        reference, plain = _next_token(mapped, tokens), _next_token(z, tokens)
    real = attention[:, 1:]  # the targets that are tokens, not padding
    torch.testing.assert_close(ours[:, 1:][real], reference[real], rtol=1e-5, atol=1e-5)
    assert float((plain - reference)[real].abs().median()) > 1.0  # h Wᵀ alone: far off
    assert torch.equal(ours[:, 0], torch.zeros(3))


def test_a_frozen_head_gets_no_gradient_and_the_trunk_the_same_one(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, tie_word_embeddings=False)
    full_model = copy.deepcopy(model)
    for m in (model, full_model):
        m.get_output_embeddings().weight.requires_grad_(False)
    tokens, attention = _tokens()
    token_logprobs(model, tokens, attention, chunk=5)[0].sum().backward()
    _full_logprobs(full_model, tokens, attention, 1.0, False)[0].sum().backward()
    assert model.get_output_embeddings().weight.grad is None
    for a, b in zip(model.parameters(), full_model.parameters(), strict=True):
        if b.grad is not None:
            assert a.grad is not None
            assert float((a.grad - b.grad).norm() / b.grad.norm()) <= 1e-6


def test_bfloat16_matches_the_full_path_to_bfloat16_precision(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    full_model = copy.deepcopy(model)
    tokens, attention = _tokens()
    ours = token_logprobs(model, tokens, attention, chunk=5)[0]
    ref = _full_logprobs(full_model, tokens, attention, 1.0, False)[0]
    assert ours.dtype == torch.float32 and ref.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)  # the same bf16 logits
    ours.sum().backward()
    ref.sum().backward()
    for a, b in zip(model.parameters(), full_model.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None and a.grad.dtype == torch.bfloat16
        assert float((a.grad.float() - b.grad.float()).norm() / b.grad.float().norm()) <= 2e-2
