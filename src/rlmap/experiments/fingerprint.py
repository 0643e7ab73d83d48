"""Fingerprints of what a run started from: checkpoint, tokenizer, data.

Two runs compare fairly only from the same base weights, the same tokenizer and
chat template, and the same prompts; names and paths do not prove that (a path can
hold different weights on two machines). The ledger records a short content hash
of each, and ``rlmap compare`` flags runs whose hashes differ.

A checkpoint's hash covers ``config.json`` and, for each weight file, its size and
three 1 MiB samples (start, middle, end) — reading a 140 GB model in full at every
run start would cost minutes; sampling catches different weights of one
architecture in practice, while two checkpoints identical in size and in those
bytes but different elsewhere would pass (documented, not hidden).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from rlmap.tasks.arithmetic import Example

SAMPLE_BYTES = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
DIGITS = 16


def checkpoint_fingerprint(path: Path) -> str:
    """Content hash of a Hugging Face checkpoint directory (config + sampled weights)."""
    h = hashlib.sha256()
    config = path / "config.json"
    if config.exists():
        h.update(config.read_bytes())
    for f in sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with f.open("rb") as stream:
            for offset in sorted(
                {0, max(0, size // 2 - SAMPLE_BYTES // 2), max(0, size - SAMPLE_BYTES)}
            ):
                stream.seek(offset)
                h.update(stream.read(SAMPLE_BYTES))
    return h.hexdigest()[:DIGITS]


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Hash of the vocabulary, the special tokens and the chat template."""
    payload = {
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special": sorted(str(t) for t in tokenizer.all_special_tokens),
        "chat_template": getattr(tokenizer, "chat_template", None),
    }
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:DIGITS]


def data_fingerprint(train: Sequence[Example], heldout: Sequence[Example]) -> str:
    """Hash of the training prompts and the held-out set, answers included, in order."""
    payload = [[[e.prompt, e.answer] for e in train], [[e.prompt, e.answer] for e in heldout]]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:DIGITS]
