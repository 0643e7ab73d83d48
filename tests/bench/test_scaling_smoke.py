"""bench/scaling.py --tiny: its meta-device counts equal the shapes' arithmetic."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest


def test_scaling_counts_match_the_config_shapes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = Path(__file__).resolve().parents[2] / "bench" / "scaling.py"
    spec = importlib.util.spec_from_file_location("bench_scaling", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    module.main(["--tiny"])
    out = capsys.readouterr().out

    cfg = module.TINY
    assert cfg["tie_word_embeddings"]  # the formula below counts the embedding once
    h, i, n_layers, v = (
        cfg[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")
    )
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]  # K and V width
    # q (h×h + bias h), k and v (h×kv + bias kv each), o (h×h), gate/up/down (3·h·i),
    # two RMSNorms (2h); then the embedding (V×h, tied to the head) and the final norm (h).
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h
    total = v * h + n_layers * layer + h  # tiny: 64,000 + 2 × 43,264 + 64 = 150,592
    printed = re.search(r"parameters \(exact, meta device\): ([\d,]+)", out)
    assert printed is not None and int(printed.group(1).replace(",", "")) == total

    # LoRA rank 8 adds r·(in + out) per targeted projection:
    # q, o (h + h), k, v (h + kv), gate, up (h + i), down (i + h).
    per_layer = 2 * (h + h) + 2 * (h + kv) + 3 * (h + i)
    lora = re.search(r"r = 8\s+([\d,]+)", out)
    assert lora is not None and int(lora.group(1).replace(",", "")) == n_layers * 8 * per_layer
    assert "what fits" in out and out.strip().splitlines()[-1].startswith("tiny: ")
