"""The embedded default model: a small Qwen2-architecture causal LM built from config.

It is an ordinary Hugging Face model (``save_pretrained`` / ``from_pretrained``
round-trip with nothing of rlmap installed); only its size is small enough to
train with RL on a laptop CPU in minutes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM


@dataclass(frozen=True)
class TinySpec:
    """Architecture of the embedded model (~0.8 M parameters by default)."""

    hidden_size: int = 128
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 64


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast, spec: TinySpec, seed: int
) -> Qwen2ForCausalLM:
    """A freshly initialised model whose vocabulary and special ids match ``tokenizer``."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **asdict(spec),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model
