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
from typing import Any

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


def data_fingerprint(
    train: Sequence[Example], heldout: Sequence[Example], settings: Any = None
) -> str:
    """Hash of the training prompts and the held-out set, answers included, in order; also
    what checks them when it is not the answer (an item's key, a chat prompt's messages),
    and the task's ``settings`` (``data.task_args``: a gymnasium environment's arguments
    change the task, not its prompts). Examples without those hash as they always did."""

    def row(e: Example) -> list[Any]:
        extra = [] if e.reference is None else [e.reference]
        return [e.prompt, e.answer, *extra, *([] if e.messages is None else [e.messages])]

    payload: list[Any] = [[row(e) for e in train], [row(e) for e in heldout]]
    if settings is not None:
        payload.append(settings)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:DIGITS]
