"""Shared fixtures: a tiny Hugging Face model directory built locally (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmap.tasks.tiny import TinySpec, build_tiny_model
from rlmap.tasks.tokenizer import build_tokenizer

SMALL = TinySpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=32,
)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised, very small model + tokenizer saved in Hugging Face format."""
    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, SMALL, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
