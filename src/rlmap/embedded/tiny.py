"""The embedded default model: a small Qwen2-architecture causal LM built from config.

It is an ordinary Hugging Face model (``save_pretrained`` / ``from_pretrained``
round-trip with nothing of rlmap installed); only its size is small enough to
train with RL on a laptop CPU in minutes. With ``experts > 0`` it is a Qwen3-MoE
instead (``embedded:tiny-moe``): every layer's MLP is a top-k mixture of experts, each
expert 1/k of the dense MLP's width, so a token's active parameters match the dense one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from transformers import (
    AutoModelForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3MoeConfig,
)


@dataclass(frozen=True)
class TinySpec:
    """Architecture of the embedded model (~0.8 M parameters by default)."""

    hidden_size: int = 128
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 64
    experts: int = 0
    """Experts per MoE layer; 0 builds the dense Qwen2 model."""
    experts_per_token: int = 2
    """k of the top-k router (MoE only)."""


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast, spec: TinySpec, seed: int
) -> PreTrainedModel:
    """A freshly initialised model whose vocabulary and special ids match ``tokenizer``."""
    shape = {k: v for k, v in asdict(spec).items() if k not in ("experts", "experts_per_token")}
    common = dict(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **shape,
    )
    config: PretrainedConfig
    if spec.experts:
        width = spec.intermediate_size // spec.experts_per_token
        config = Qwen3MoeConfig(
            num_experts=spec.experts,
            moe_intermediate_size=width,
            num_experts_per_tok=spec.experts_per_token,
            norm_topk_prob=True,
            **common,
        )
    else:
        config = Qwen2Config(**common)
    with torch.random.fork_rng(devices=[]):  # built on the CPU: no CUDA state to save
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model
