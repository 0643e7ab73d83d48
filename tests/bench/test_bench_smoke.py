"""bench/algos.py still runs against the current API (a smoke run at toy size, not a timing)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def test_algos_benchmark_runs_at_toy_size(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parents[2] / "bench" / "algos.py"
    spec = importlib.util.spec_from_file_location("bench_algos", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--batch", "8", "--time", "16", "--group", "4", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "estimator gae" in out and "objective ppo_clip" in out and "reduction token_mean" in out


def test_memory_benchmark_runs_at_toy_size() -> None:
    import subprocess
    import sys

    path = Path(__file__).resolve().parents[2] / "bench" / "memory.py"
    command = [sys.executable, str(path), "--toy", "--repeats", "1", "--options"]
    out = subprocess.run(command, check=True, capture_output=True, text=True,
                         timeout=300).stdout  # fmt: skip
    last = out.strip().splitlines()[-1]
    assert last.startswith("memory ratio ") and ", time ratio " in last
    assert out.count("per forward+backward") == 4  # full and chunked at two lengths
    for option in ("float32", "checkpointing", "bf16 autocast", "both"):
        assert f" {option}: peak " in out, option
