"""``rlmap simulate``: the discrete-event model of sync, async and partial rollout."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmap.cli import main
from rlmap.core.errors import ConfigError
from rlmap.simulator.inputs import (
    Duration,
    Empirical,
    Fixed,
    LogNormal,
    Pareto,
    Trace,
    lognormal_from_percentiles,
    parse_duration,
    parse_learner_step,
    profile_from_run,
)
from rlmap.simulator.model import SimConfig, SimResult, simulate
from rlmap.simulator.report import sweep_workers

LOGNORMAL = LogNormal(0.0, 1.0)
PARETO = Pareto(1.5, 0.5)  # α = 1.5: finite mean (1.5), infinite variance


def run(
    mode: str, workers: int, batch: int, duration: Duration, learner_s: float = 1.0, **kw: Any
) -> SimResult:
    return simulate(SimConfig(mode, workers, batch, duration, Fixed(learner_s), **kw))


def conserved(r: SimResult) -> bool:
    return r.started == r.consumed + r.dropped + r.queued_at_end + r.in_flight_at_end


# ---------------------------------------------------------------- sync, by hand


def test_sync_fixed_durations_one_per_worker() -> None:
    # W = B = 4, d = 2, s = 0.5: each step is 2 s of rollout (no one waits) + 0.5 s learning,
    # so 4 trajectories every 2.5 s = 1.6/s; the learner computes 0.5 of every 2.5 s.
    r = run("sync", 4, 4, Fixed(2.0), 0.5, steps=10)
    assert r.trajectories_per_s == pytest.approx(4 / 2.5)
    assert r.learner_steps_per_s == pytest.approx(1 / 2.5)
    assert r.learner_util == pytest.approx(0.2)
    assert r.worker_util == pytest.approx(0.8)
    assert r.group_idle_frac == pytest.approx(0.0)
    assert r.staleness_hist == (40,) and r.staleness_max == 0
    assert r.sim_time_s == pytest.approx(25.0)
    assert conserved(r) and r.in_flight_at_end == 0


def test_sync_two_workers_idle_at_the_barrier() -> None:
    # W = B = 2, durations d1 = 1, d2 = 3: the phase lasts d2 = 3; worker 1 idles 3 − 1 = 2 of
    # the 2·3 = 6 worker-seconds: idle fraction (d2 − d1)/(2·d2) = 2/6 = 1/3.
    r = run("sync", 2, 2, Trace((1.0, 3.0)), 0.5, steps=4)
    assert r.group_idle_frac == pytest.approx((3 - 1) / (2 * 3))
    assert r.trajectories_per_s == pytest.approx(2 / (3 + 0.5))
    # worker time: busy 1 + 3 = 4 of 2·3.5 = 7 per step
    assert r.worker_util == pytest.approx(4 / 7)
    # the short one waits 2 s in the queue per 3.5 s step
    assert r.queue_mean == pytest.approx(2 / 3.5)


def test_sync_pulls_work_greedily() -> None:
    # W = 2, B = 3, durations 1, 1, 2: both workers finish their first at t = 1, one of them
    # takes the third (2 s) and ends at 3. Phase 3 s, busy 4 of 2·3 = 6: idle 1/3.
    r = run("sync", 2, 3, Trace((1.0, 1.0, 2.0)), 0.0, steps=1)
    assert r.sim_time_s == pytest.approx(3.0)
    assert r.group_idle_frac == pytest.approx(1 / 3)


def test_sync_consumes_exactly_what_it_generates() -> None:
    r = run("sync", 16, 64, PARETO, steps=30)
    assert r.started == r.consumed == 30 * 64
    assert r.consumed_mean_duration == r.generated_mean_duration  # no selection bias
    assert r.selection_bias == 0.0 and r.staleness_max == 0 and r.dropped == 0


# ---------------------------------------------------------------- async, by hand


def test_async_fixed_durations_fast_learner() -> None:
    # W = B = 4, d = 1, s = 0.1, η = 1. At t = k (k = 1..10) four trajectories finish and the
    # learner takes them; the workers start the next four at once, still under version k − 1
    # (the publish comes at k + 0.1). Step 1 (version 0) gets version-0 data: staleness 0;
    # steps 2..10 get data one version old. End at 10.1: 40 trajectories / 10.1 s → W/d.
    r = run("async", 4, 4, Fixed(1.0), 0.1, steps=10, eta=1)
    assert r.sim_time_s == pytest.approx(10.1)
    assert r.trajectories_per_s == pytest.approx(40 / 10.1)
    assert r.staleness_hist == (4, 36)
    assert r.worker_util == pytest.approx(1.0)
    assert r.dropped == 0
    assert r.in_flight_at_end == 4 and conserved(r)  # the 11th round, started at t = 10


def test_async_throughput_is_workers_over_duration_when_rollout_bound() -> None:
    r = run("async", 32, 16, Fixed(2.0), 0.01, steps=200, eta=2)
    assert r.trajectories_per_s == pytest.approx(32 / 2.0, rel=0.02)
    assert r.staleness_max <= 2


def test_async_learner_bound() -> None:
    # rollout could deliver 64/s; a 1 s learner step of B = 8 consumes at most 8/s
    r = run("async", 64, 8, Fixed(1.0), 1.0, steps=100, eta=1)
    assert r.trajectories_per_s == pytest.approx(8.0, rel=0.02)
    assert r.learner_util == pytest.approx(1.0, rel=0.02)
    assert r.worker_util < 0.2  # admission control holds the workers back


def test_async_eta_zero_is_sync() -> None:
    for duration in (LOGNORMAL, PARETO):
        a = run("sync", 8, 32, duration, 0.5, steps=40, seed=3)
        b = run("async", 8, 32, duration, 0.5, steps=40, seed=3, eta=0)
        assert b.sim_time_s == pytest.approx(a.sim_time_s, rel=1e-12)
        assert b.worker_util == pytest.approx(a.worker_util, rel=1e-12)
        assert b.staleness_max == 0 and b.dropped == 0


@pytest.mark.parametrize("eta", [0, 1, 2, 4])
@pytest.mark.parametrize("duration", [LOGNORMAL, PARETO, Fixed(1.0)])
def test_async_staleness_never_exceeds_eta(eta: int, duration: Duration) -> None:
    r = run("async", 64, 32, duration, 0.3, steps=60, eta=eta)
    assert r.staleness_max <= eta
    assert len(r.staleness_hist) <= eta + 1
    assert sum(r.staleness_hist) == r.consumed == 60 * 32


def test_async_in_order_durations_drop_nothing() -> None:
    # fixed durations finish in the order they start: admission control alone bounds staleness
    r = run("async", 48, 16, Fixed(1.0), 0.2, steps=50, eta=1)
    assert r.dropped == 0 and r.wasted_work_frac == 0.0


# ---------------------------------------------------------------- the trade


def test_heavy_tail_async_beats_sync_and_sync_idles_more_with_workers() -> None:
    results = sweep_workers(
        SimConfig("sync", 8, 256, PARETO, Fixed(1.0), steps=60, eta=2),
        [8, 32, 128],
        ("sync", "async"),
    )
    sync = [r for r in results if r.mode == "sync"]
    asyn = [r for r in results if r.mode == "async"]
    for s, a in zip(sync, asyn, strict=True):
        assert a.trajectories_per_s >= s.trajectories_per_s
    idle = [r.group_idle_frac for r in sync]
    assert idle[0] < idle[1] < idle[2]


def test_async_prefers_short_trajectories() -> None:
    r = run("async", 128, 64, PARETO, 0.5, steps=100, eta=1)
    assert r.dropped > 0
    assert r.consumed_mean_duration < r.generated_mean_duration  # selection bias
    assert r.selection_bias < 0
    # the long ones that do arrive, arrive staler
    q = r.staleness_by_duration_quartile
    assert q[0] < q[3]


def test_partial_by_hand() -> None:
    # W = 2, B = 2, durations cycle 1, 3; s = 0.5; budget L = 2 (never binding here).
    # iteration 0 (v0): w0 runs T0 (1 s), w1 runs T1 (3 s). t=1: T0 ready; w0 starts T2 (1 s).
    #   t=2: T2 ready → B ready → update; T1 paused with 1 s left. Learner to 2.5.
    # iteration 1 (v1): w0 resumes T1 (→ 3.5), w1 starts T3 (3 s → 5.5). t=3.5: T1 ready
    #   (first token under v0, consumed at v1: staleness 1, 2 segments); w0 starts T4 (→ 4.5).
    #   t=4.5: T4 ready → update; T3 paused. Learner to 5.0.
    r = run("partial", 2, 2, Trace((1.0, 3.0)), 0.5, steps=2, budget_s=2.0)
    assert r.sim_time_s == pytest.approx(5.0)
    assert r.trajectories_per_s == pytest.approx(4 / 5.0)
    assert r.staleness_hist == (3, 1)
    assert r.segments_mean == pytest.approx((1 + 1 + 2 + 1) / 4)
    assert r.group_idle_frac == pytest.approx(0.0)
    assert (r.started, r.in_flight_at_end) == (5, 1) and conserved(r)


def test_partial_budget_ends_the_iteration() -> None:
    # W = 1, B = 2, durations 1, 3, L = 2, s = 0. iteration 0: T0 ready at 1, T1 starts; at
    # t = 2 the budget is spent with one ready: update on 1 trajectory; T1 paused (2 s left).
    # iteration 1: T1 resumes, ready at 4 = the deadline: update on T1 (staleness 1).
    r = run("partial", 1, 2, Trace((1.0, 3.0)), 0.0, steps=2, budget_s=2.0)
    assert r.sim_time_s == pytest.approx(4.0)
    assert r.consumed == 2 and r.staleness_hist == (1, 1)


def test_partial_removes_the_barrier_at_a_staleness_cost() -> None:
    sync = run("sync", 128, 256, LOGNORMAL, 1.0, steps=60)
    part = run("partial", 128, 256, LOGNORMAL, 1.0, steps=60)
    assert part.trajectories_per_s > sync.trajectories_per_s
    assert part.group_idle_frac == pytest.approx(0.0)
    assert sync.group_idle_frac > 0.3
    assert part.staleness_max > 0 and part.segments_mean > 1


# ---------------------------------------------------------------- determinism, conservation


def test_same_seed_same_run_other_seed_other_run() -> None:
    for mode in ("sync", "async", "partial"):
        a = run(mode, 16, 32, LOGNORMAL, steps=20, seed=7)
        assert a == run(mode, 16, 32, LOGNORMAL, steps=20, seed=7)
        assert a != run(mode, 16, 32, LOGNORMAL, steps=20, seed=8)


DURATIONS = st.sampled_from(
    [LOGNORMAL, PARETO, Fixed(1.0), Empirical((0.5, 1.0, 4.0)), LogNormal(1.0, 2.0)]
)


@settings(max_examples=60, deadline=None)
@given(
    mode=st.sampled_from(["sync", "async", "partial"]),
    workers=st.integers(1, 40),
    batch=st.integers(1, 40),
    duration=DURATIONS,
    learner_s=st.sampled_from([0.0, 0.1, 1.0, 5.0]),
    eta=st.integers(0, 3),
    budget=st.sampled_from([None, 0.5, 3.0]),
    steps=st.integers(1, 15),
    seed=st.integers(0, 1000),
)
def test_trajectories_are_conserved(
    mode: str,
    workers: int,
    batch: int,
    duration: Duration,
    learner_s: float,
    eta: int,
    budget: float | None,
    steps: int,
    seed: int,
) -> None:
    r = run(
        mode, workers, batch, duration, learner_s, eta=eta, budget_s=budget, steps=steps, seed=seed
    )
    assert conserved(r)  # generated = consumed + dropped + queued + in flight
    assert sum(r.staleness_hist) == r.consumed
    if mode != "partial" or budget is None:
        assert r.consumed == steps * batch
    if mode == "async":
        assert r.staleness_max <= eta
    assert 0 <= r.worker_util <= 1 + 1e-9 and 0 <= r.learner_util <= 1 + 1e-9
    assert -1e-9 <= r.group_idle_frac <= 1


def test_fast_at_cluster_scale() -> None:
    started = time.perf_counter()
    for mode in ("sync", "async", "partial"):
        run(mode, 256, 512, LOGNORMAL, 2.0, steps=200)
    assert time.perf_counter() - started < 10  # about 1.5 s on a laptop core


# ---------------------------------------------------------------- inputs


def test_parse_duration() -> None:
    assert parse_duration("lognormal:0.5,1.2") == LogNormal(0.5, 1.2)
    assert parse_duration("pareto:1.5,2") == Pareto(1.5, 2.0)
    assert parse_duration("3") == Fixed(3.0)
    assert parse_duration("empirical:1,2,3").mean == pytest.approx(2.0)
    assert parse_duration("exponential:2").mean == 2.0
    assert parse_learner_step("0") == Fixed(0.0) == parse_learner_step("fixed:0")
    assert Pareto(1.0, 1.0).mean == math.inf
    assert LogNormal(0.0, 1.0).mean == pytest.approx(math.exp(0.5))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("gamma:1,2", "unknown distribution 'gamma'"),
        ("lognormal:1", "takes mu,sigma"),
        ("lognormal:0,-1", "sigma"),
        ("pareto:0,1", "alpha"),
        ("fixed:-2", "positive"),
        ("fixed:x", "not a number"),
        ("empirical:", "at least one value"),
        ("0", "positive"),
    ],
)
def test_parse_duration_rejects(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="^--duration: .*" + fragment):
        parse_duration(text)


def test_lognormal_fit_to_percentiles() -> None:
    fit = lognormal_from_percentiles(10.0, 40.0)
    # median e^mu = 10; p95 = e^(mu + 1.645·sigma) = 40 → sigma = ln 4 / 1.645 ≈ 0.843
    assert math.exp(fit.mu) == pytest.approx(10.0)
    assert fit.sigma == pytest.approx(math.log(4) / 1.6448536, rel=1e-6)
    assert lognormal_from_percentiles(5.0, 4.0).sigma == 0.0


def write_metrics(path: Path, records: Sequence[Mapping[str, object]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_profile_from_percentiles(tmp_path: Path) -> None:
    records = [
        {
            "step": i,
            "system/rollout_duration_p50": 2.0,
            "system/rollout_duration_p95": p95,
            "system/update_s": 0.5,
            "sampling/generated": 64,
        }
        for i, p95 in enumerate([7.0, 8.0, 9.0])
    ]
    profile = profile_from_run(write_metrics(tmp_path / "run", records))
    assert profile.duration == lognormal_from_percentiles(2.0, 8.0)
    assert profile.learner_step == Empirical((0.5, 0.5, 0.5)) and profile.batch == 64


def test_profile_from_a_batched_sync_run(tmp_path: Path) -> None:
    # the embedded sync loop: one generate call per step, so every trajectory lasts rollout_s
    records = [{"step": 0, "eval/pass@1": 0.1}] + [
        {"step": i, "system/rollout_s": r, "system/update_s": 0.1, "sampling/generated": 4}
        for i, r in enumerate([0.2, 0.4], start=1)
    ]
    run_dir = write_metrics(tmp_path / "run", records)
    profile = profile_from_run(run_dir)
    assert profile.duration == Trace((0.2,) * 4 + (0.4,) * 4)
    assert profile.learner_step is not None
    r = simulate(SimConfig("sync", 4, 4, profile.duration, profile.learner_step, steps=2))
    # replayed: (0.2 + 0.1) + (0.4 + 0.1) = 0.8 s for 8 trajectories
    assert r.trajectories_per_s == pytest.approx(8 / 0.8)


def test_profile_needs_durations(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--from-run: .*no rollout durations"):
        profile_from_run(write_metrics(tmp_path / "run", [{"step": 1, "reward/mean": 0.5}]))


# ---------------------------------------------------------------- CLI


def test_cli_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "simulate",
                "--mode",
                "async",
                "--workers",
                "16",
                "--batch",
                "8",
                "--duration",
                "pareto:1.5,0.5",
                "--eta",
                "2",
                "--steps",
                "20",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "async, W=16 workers, B=8, η=2" in out and "selection bias" in out
    assert main(["simulate", "--mode", "partial", "--steps", "5", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "partial" and data["consumed"] == 5 * 64


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--duration", "weibull:1,2"], "--duration"),
        (["--workers", "0"], "--workers"),
        (["--batch", "-4"], "--batch"),
        (["--learner-step-s", "-1"], "--learner-step-s"),
        (["--mode", "overlap"], "--mode"),
        (["--eta", "-1"], "--eta"),
        (["--budget-s", "-2"], "--budget-s"),
        (["--sweep-workers", "8,x"], "--sweep-workers"),
        (["--plot", "somewhere"], "--plot"),
    ],
)
def test_cli_bad_input(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rlmap: error: {flag}: ") and "\n" not in err


def test_cli_sweep_writes_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "simulate",
                "--sweep-workers",
                "4,8",
                "--batch",
                "16",
                "--steps",
                "10",
                "--plot",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("| 8 | ") == 3  # sync, async, partial at W = 8
    for name in ("throughput", "idle", "staleness", "cost"):
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


def test_a_lognormal_through_median_and_mean_has_both() -> None:
    import math

    from rlmap.simulator.inputs import lognormal_from_median_and_mean

    # median 0.8, mean 1.2: mu = ln 0.8, sigma = √(2 ln 1.5) = 0.9005
    d = lognormal_from_median_and_mean(0.8, 1.2)
    assert d.mu == pytest.approx(math.log(0.8)) and d.sigma == pytest.approx(0.90052, abs=1e-4)
    assert d.mean == pytest.approx(1.2)
    assert lognormal_from_median_and_mean(0.8, 0.7).sigma == 0.0  # mean below the median


def test_an_async_runs_worker_layout_comes_from_its_config(tmp_path: Path) -> None:
    import yaml

    from rlmap.simulator.inputs import async_layout

    run = tmp_path / "run"
    run.mkdir()
    cfg = {
        "system": {"mode": "async", "workers": 4, "worker_prompts": None},
        "sampling": {"prompts_per_step": 64, "group_size": 2},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert async_layout(run) == (4, 32)  # 64 prompts / 4 workers = 16 prompts × G = 2
    cfg["system"] |= {"worker_prompts": 8}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert async_layout(run) == (4, 16)
    cfg["system"] |= {"mode": "sync"}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert async_layout(run) is None


def test_from_run_simulates_the_runs_own_mode_and_eta_unless_a_flag_overrides(
    tmp_path: Path,
) -> None:
    # Before: --from-run of an asynchronous run (4 workers, η = 4) simulated *sync* unless
    # --mode async --eta 4 were given too, and predicted a third of the measured throughput.
    import yaml

    from rlmap.simulator.report import SimulateArgs, build_config

    records = [
        {
            "step": i,
            "system/rollout_duration_p50": 1.0,
            "system/rollout_duration_p95": 2.0,
            "system/update_s": 0.2,
            "sampling/generated": 64,
        }
        for i in range(1, 4)
    ]
    run = write_metrics(tmp_path / "run", records)
    cfg = {
        "system": {"mode": "async", "workers": 4, "partial_rollout": True},
        "sampling": {"prompts_per_step": 64, "group_size": 1},
        "behaviour": {"max_staleness": 4},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    config, said = build_config(SimulateArgs(from_run=str(run)))
    assert (config.mode, config.eta, config.workers) == ("async", 4, 4)
    assert said is not None and "mode async, η = 4 (the run's)" in said
    assert "partial rollout, simulated as async" in said
    config, said = build_config(SimulateArgs(from_run=str(run), mode="sync", eta=1))
    assert (config.mode, config.eta) == ("sync", 1)
    assert said is not None and "--mode sync overrides the run's async" in said
    assert "--eta 1 overrides the run's η = 4" in said
    config, _ = build_config(SimulateArgs())  # no run: the defaults as before
    assert (config.mode, config.eta) == ("sync", 1)


def test_sweep_plots_need_no_math_fonts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # a font list of DejaVu Sans only (as a matplotlib font cache built without the
    # bundled math fonts has it): log axes labelled with mathtext would warn once per
    # missing family, on stderr, beside the CLI's one-line error
    from matplotlib import font_manager

    plain = [f for f in font_manager.fontManager.ttflist if f.name == "DejaVu Sans"]
    assert plain
    monkeypatch.setattr(font_manager.fontManager, "ttflist", plain)
    font_manager.fontManager._findfont_cached.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="matplotlib"):
            assert (
                main(
                    [
                        "simulate",
                        "--sweep-workers",
                        "1,2,4",
                        "--batch",
                        "8",
                        "--steps",
                        "5",
                        "--plot",
                        str(tmp_path),
                    ]
                )
                == 0
            )
    finally:
        font_manager.fontManager._findfont_cached.cache_clear()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("matplotlib")] == []
    assert (tmp_path / "staleness.png").read_bytes()[:4] == b"\x89PNG"
