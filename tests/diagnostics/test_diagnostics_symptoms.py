"""`rlmap diagnose`: each symptom rule on traces built to show it, on near misses that must
stay quiet, on real healthy runs (tests/diagnostics/data), and the command's output."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from rlmap.cli import main
from rlmap.diagnostics.report import diagnose, diagnose_run, render_json, render_text
from rlmap.diagnostics.rules import check, registry
from rlmap.diagnostics.run import RunData
from rlmap.diagnostics.symptoms import Finding

DATA = Path(__file__).parent / "data"
Curve = Callable[[int], float]


def noisy(
    curve: Curve, sd: float, seed: int = 0, low: float = -math.inf, high: float = math.inf
) -> Curve:
    """``curve`` plus Gaussian noise of sd ``sd`` (clamped to [low, high]); one draw per call."""
    rng = random.Random(seed)
    return lambda step: min(max(curve(step) + rng.gauss(0.0, sd), low), high)


def ramp(start: float, end: float, steps: int = 100) -> Curve:
    """Linear from ``start`` at step 1 to ``end`` at step ``steps``."""
    return lambda step: start + (end - start) * (step - 1) / (steps - 1)


def healthy_train() -> dict[str, Curve]:
    """Per-step metrics of a run that learns (like the embedded GRPO run): reward and
    length rise, entropy decays to ~15% of its start, a few groups are uniform."""
    return {
        "reward/mean": noisy(ramp(0.15, 0.8), 0.05, seed=1),
        "entropy": noisy(lambda s: 0.9 * math.exp(-s / 55), 0.03, seed=2, low=0.0),
        "length/mean": noisy(ramp(6.0, 10.0), 0.4, seed=3),
        "length/truncated_frac": lambda s: 0.0,
        "group/zero_adv_frac": noisy(lambda s: 0.15, 0.05, seed=4, low=0.0, high=1.0),
        "ratio/rho/max_abs_log": noisy(lambda s: 0.1, 0.01, seed=5, low=0.0),
        "kl/mean": noisy(ramp(0.0, 0.1), 0.005, seed=6, low=0.0),
    }


def healthy_eval() -> dict[str, Curve]:
    return {"eval/pass@1": lambda s: 0.1 + 0.7 * s / 100, "eval/length": lambda s: 6 + s / 25}


def make_run(
    train: Mapping[str, Curve] | None = None,
    held: Mapping[str, Curve] | None = None,
    *,
    steps: int = 100,
    every: int = 10,
    ledger: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
) -> RunData:
    """A run: step 0 holds the evaluation before training, then ``steps`` training steps;
    ``held`` metrics every ``every`` steps, like ``metrics.jsonl``."""
    train = healthy_train() if train is None else train
    held = healthy_eval() if held is None else held
    records = []
    for step in range(steps + 1):
        record: dict[str, Any] = {"step": step}
        if step % every == 0:
            record |= {name: curve(step) for name, curve in held.items()}
        if step > 0:
            record |= {name: curve(step) for name, curve in train.items()}
        records.append(record)
    return RunData(records, dict(ledger or {}), dict(config or {}))


def verdict(run: RunData, symptom: str) -> Finding:
    return check(run, registry.get(symptom))


def test_rules_follow_the_map_in_order() -> None:
    assert registry.names() == (
        "reward_up_heldout_down",
        "entropy_collapse",
        "zero_group_loss",
        "length_drift",
        "late_collapse",
        "async_efficiency",
        "moe_route_mismatch",
        "empty_steps",
        "judge_bias",
        "segment_state_loss",
        "segment_credit_cut",
    )


def test_a_healthy_synthetic_run_is_quiet() -> None:
    findings = diagnose_run(make_run()).findings
    assert [f.status for f in findings] == ["quiet"] * 5 + ["not checked"] * 6


@pytest.mark.parametrize("name", ["grpo", "ppo_turn", "vapo"])
def test_healthy_embedded_runs_raise_no_alarm(name: str) -> None:
    report = diagnose(DATA / name)
    assert report.detected == (), render_text(report)
    assert report.records == 101 and report.steps == (0, 100)


# --- 1. reward rises while held-out ability falls ----------------------------------


def test_reward_up_heldout_down_detected() -> None:
    # held-out peaks at step 50 (0.5) and falls to 0.3; the trained reward keeps rising
    held = {"eval/pass@1": lambda s: 0.1 + 0.008 * s if s <= 50 else 0.5 - 0.004 * (s - 50)}
    finding = verdict(make_run(held=held), "reward_up_heldout_down")
    assert finding.status == "detected"
    drop, rise = finding.evidence
    assert drop.metric == "eval/pass@1" and drop.values["best_step"] == 50
    assert drop.values["drop"] == pytest.approx(0.2)
    assert rise.metric == "reward/mean" and rise.steps == (50, 100) and rise.values["t"] >= 3
    assert [c.interface for c in finding.checks] == [
        "verifier coverage",
        "reward hacking",
        "reference drift",
        "contamination",
    ]
    assert "clip" in finding.not_first[0]


@pytest.mark.parametrize(
    ("why", "held", "reward"),
    [
        # a dip of 0.03 below the best evaluation is evaluation noise, not a fall
        ("small dip", lambda s: min(0.1 + 0.008 * s, 0.5) - (0.03 if s == 100 else 0.0), None),
        # 15% below a low best, but only 0.03: within evaluation noise
        ("small drop from a low best", lambda s: 0.2 if s < 100 else 0.17, None),
        # held-out falls, but so does the trained reward: that is not this symptom
        (
            "reward falls too",
            lambda s: 0.1 + 0.008 * s if s <= 50 else 0.5 - 0.004 * (s - 50),
            lambda s: 0.4 + 0.008 * s if s <= 50 else 0.8 - 0.008 * (s - 50),
        ),
    ],
)
def test_reward_up_heldout_down_near_misses(why: str, held: Curve, reward: Curve | None) -> None:
    train = healthy_train()
    if reward is not None:
        train["reward/mean"] = noisy(reward, 0.05, seed=1)
    assert verdict(make_run(train, {"eval/pass@1": held}), "reward_up_heldout_down").status == (
        "quiet"
    ), why


def test_a_growing_gap_between_the_training_and_held_out_verifiers_is_reward_hacking() -> None:
    # strict held-out pass@1 stalls at 0.55 while the training verifier's score of the same
    # samples climbs to 0.70: over the last third of evaluations (steps 70, 80, 90, 100) the
    # gap is 0.15 on average, 0 at step 0
    def strict(s: int) -> float:
        return min(0.3 + 0.01 * s, 0.55)

    held = {
        "eval/pass@1": strict,
        "eval/train_verifier_pass@1": lambda s: strict(s) + 0.15 * (s >= 40),
    }
    finding = verdict(make_run(held=held), "reward_up_heldout_down")
    assert finding.status == "detected"
    gap = finding.evidence[-1]
    assert gap.metric == "eval/train_verifier_pass@1"
    assert gap.values["gap_end"] == pytest.approx(0.15) and gap.values["gap_start"] == 0


@pytest.mark.parametrize("gap", [0.0, 0.03])
def test_a_small_or_constant_verifier_gap_is_quiet(gap: float) -> None:
    held = {
        "eval/pass@1": lambda s: 0.1 + 0.007 * s,
        "eval/train_verifier_pass@1": lambda s: 0.1 + 0.007 * s + gap,
    }
    assert verdict(make_run(held=held), "reward_up_heldout_down").status == "quiet"


def test_reward_up_heldout_down_needs_evaluations() -> None:
    finding = verdict(make_run(held={}), "reward_up_heldout_down")
    assert finding.status == "not checked" and "eval/pass@1" in finding.needs[0]


# --- 2. entropy collapses quickly ---------------------------------------------------


def test_entropy_collapse_detected_with_interface_readings() -> None:
    train = healthy_train() | {
        "entropy": noisy(lambda s: 0.9 * math.exp(-s / 6), 0.005, seed=2, low=0.0),
        "ratio/rho/clipped_high_frac": lambda s: 0.02,
    }
    finding = verdict(
        make_run(train, config={"generation": {"temperature": 0.3}}), "entropy_collapse"
    )
    assert finding.status == "detected"
    (evidence,) = finding.evidence
    assert evidence.metric == "entropy" and evidence.values["collapse_step"] <= 25
    checks = {c.interface: c for c in finding.checks}
    assert list(checks) == [
        "positive-advantage ratio",
        "upper clip",
        "sampling temperature",
        "prompt difficulty",
        "duplicate candidates",
    ]
    assert checks["upper clip"].readings[0].metric == "ratio/rho/clipped_high_frac"
    assert checks["upper clip"].readings[0].steps == (1, evidence.values["collapse_step"])
    assert (
        checks["sampling temperature"].readings[0].text.startswith("generation.temperature = 0.3")
    )
    assert checks["positive-advantage ratio"].readings == ()  # adv/mean was not logged
    assert "Clip-Higher" in finding.not_first[0]


@pytest.mark.parametrize(
    ("why", "entropy"),
    [
        ("steady decline to 20% of the start", lambda s: 0.9 * math.exp(-s / 62)),
        # reaches 5% of the start, but only in the last fifth of the run: it learned first
        ("collapse only at the end", lambda s: 0.9 if s < 80 else 0.9 * math.exp(-(s - 79) / 4)),
        ("drops fast to 30%, then holds", lambda s: 0.27 + 0.63 * math.exp(-s / 5)),
    ],
)
def test_entropy_collapse_near_misses(why: str, entropy: Curve) -> None:
    train = healthy_train() | {"entropy": noisy(entropy, 0.01, seed=2, low=0.0)}
    assert verdict(make_run(train), "entropy_collapse").status == "quiet", why


# --- 3. group losses often zero -----------------------------------------------------


def test_zero_group_loss_detected() -> None:
    train = healthy_train() | {
        "group/zero_adv_frac": noisy(lambda s: 0.7, 0.1, seed=4, low=0.0, high=1.0),
        "group/all_wrong_frac": lambda s: 0.6,
        "group/all_correct_frac": lambda s: 0.1,
    }
    finding = verdict(make_run(train, config={"sampling": {"group_size": 4}}), "zero_group_loss")
    assert finding.status == "detected"
    assert finding.evidence[0].metric == "group/zero_adv_frac"
    assert finding.evidence[0].values["mean"] == pytest.approx(0.7, abs=0.05)
    first = finding.checks[0]
    assert first.interface == "all-correct / all-wrong fractions"
    assert [r.metric for r in first.readings] == ["group/all_correct_frac", "group/all_wrong_frac"]
    assert finding.checks[1].readings[0].values == {"value": 4}
    assert "cannot fix a wrong verifier" in finding.not_first[0]


def test_zero_group_loss_detected_behind_a_group_filter() -> None:
    # DAPO dynamic sampling keeps only mixed groups: zero-advantage groups never reach the
    # loss, but 70% of what was generated was thrown away for being uniform
    train = healthy_train() | {
        "group/zero_adv_frac": lambda s: 0.0,
        "sampling/kept_frac": lambda s: 0.3,
    }
    finding = verdict(make_run(train), "zero_group_loss")
    assert finding.status == "detected"
    assert finding.evidence[1].metric == "sampling/kept_frac"
    assert finding.evidence[1].values["discarded"] == pytest.approx(0.7)


def test_zero_group_loss_names_a_reward_that_never_comes() -> None:
    train = healthy_train() | {
        "group/zero_adv_frac": lambda s: 1.0,
        "reward/outcome_mean": lambda s: 0.0,
    }
    finding = verdict(make_run(train), "zero_group_loss")
    assert finding.status == "detected" and finding.evidence[-1].metric == "reward/outcome_mean"


def test_zero_group_loss_near_miss_and_not_checked() -> None:
    near = healthy_train() | {"group/zero_adv_frac": noisy(lambda s: 0.4, 0.1, seed=4, low=0.0)}
    assert verdict(make_run(near), "zero_group_loss").status == "quiet"
    single = {k: v for k, v in healthy_train().items() if not k.startswith("group/")}
    finding = verdict(make_run(single), "zero_group_loss")
    assert finding.status == "not checked" and "group/zero_adv_frac" in finding.needs[0]


# --- 4. response length keeps drifting ----------------------------------------------


def test_length_drift_detected_when_reward_is_flat() -> None:
    train = healthy_train() | {
        "length/mean": noisy(ramp(100.0, 400.0), 10.0, seed=3),
        "reward/mean": noisy(lambda s: 0.5, 0.05, seed=1),
    }
    finding = verdict(make_run(train, ledger={"reduction": "global_token_mean"}), "length_drift")
    assert finding.status == "detected"
    length, reward = finding.evidence[:2]
    assert length.metric == "length/mean" and length.steps == (1, 100)
    assert length.values["relative"] == pytest.approx(204 / 148, abs=0.1)  # thirds: 148 → 352
    assert reward.metric == "reward/mean" and reward.values["last_half_t"] < 3
    denominator = finding.checks[1]
    assert denominator.readings[0].text == "reduction = global_token_mean (ledger.json)"


def test_length_drift_detected_when_it_runs_into_the_limit() -> None:
    # the reward still rises, but a growing share of responses is cut by the length limit
    train = healthy_train() | {
        "length/mean": noisy(ramp(100.0, 400.0), 10.0, seed=3),
        "length/truncated_frac": ramp(0.0, 0.3),
    }
    finding = verdict(make_run(train), "length_drift")
    assert finding.status == "detected"
    assert finding.evidence[-1].metric == "length/truncated_frac"


@pytest.mark.parametrize(
    ("why", "length"),
    [
        ("grows while the reward rises (learning to use the tool)", ramp(6.0, 10.0)),
        ("grows, then settles", lambda s: 6.0 + 4.0 * min(s, 40) / 40),
        ("moves 15%", ramp(100.0, 115.0)),
    ],
)
def test_length_drift_near_misses(why: str, length: Curve) -> None:
    train = healthy_train() | {"length/mean": noisy(length, 0.2, seed=3)}
    assert verdict(make_run(train), "length_drift").status == "quiet", why


# --- 5. PPO stable at first, then collapses -----------------------------------------


def collapsing(s: int) -> float:
    """Rises 0.2 → 0.7 over 60 steps, falls to 0.1 by step 70 and stays there."""
    return 0.2 + 0.5 * s / 60 if s <= 60 else max(0.7 - 0.06 * (s - 60), 0.1)


def test_late_collapse_detected_with_ratio_tails_read_across_it() -> None:
    train = healthy_train() | {
        "reward/mean": noisy(collapsing, 0.05, seed=1),
        "ratio/rho/max_abs_log": lambda s: 0.1 if s < 58 else 3.0,
    }
    finding = verdict(make_run(train, ledger={"epochs_per_batch": 4}), "late_collapse")
    assert finding.status == "detected"
    reward = finding.evidence[0]
    assert reward.metric == "reward/mean" and 55 <= reward.values["peak_step"] <= 65
    assert reward.values["z"] >= 5
    assert finding.evidence[1].metric == "eval/pass@1"
    checks = {c.interface: c for c in finding.checks}
    assert checks["reuse epochs"].readings[0].values == {"value": 4}
    tails = checks["ratio tails"].readings[0]
    assert tails.metric == "ratio/rho/max_abs_log"
    assert tails.values["first"] == pytest.approx(0.1) and tails.values["last"] == 3.0
    assert checks["critic error"].readings == () and checks["critic error"].hint
    assert "kl/mean" in finding.not_first[0]


@pytest.mark.parametrize(
    ("why", "reward"),
    [
        ("rises, then plateaus", lambda s: min(0.2 + 0.5 * s / 60, 0.7)),
        (
            "a dip of a fifth of the gain",
            lambda s: min(0.2 + 0.5 * s / 60, 0.7) - (0.1 if s > 85 else 0.0),
        ),
        ("falls from the start (never stable)", ramp(0.7, 0.1)),
        # flat: the last steps sit a little low, but within the noise (z ≈ 3)
        ("flat and noisy", lambda s: 0.5 - (0.03 if s > 90 else 0.0)),
    ],
)
def test_late_collapse_near_misses(why: str, reward: Curve) -> None:
    train = healthy_train() | {"reward/mean": noisy(reward, 0.05, seed=1)}
    assert verdict(make_run(train), "late_collapse").status == "quiet", why


# --- 6. async throughput up, sample efficiency down ---------------------------------


def async_train(**overrides: Curve) -> dict[str, Curve]:
    return (
        healthy_train()
        | {
            "system/checkpoint_age_mean": lambda s: 1.0,
            "system/accepted_token_frac": lambda s: 0.98,
            "ratio/d/p99_abs_log": lambda s: 0.1,
            "budget/generated_tokens": lambda s: 1000.0 * s,
        }
        | overrides
    )


def test_async_efficiency_detected_on_stale_data() -> None:
    train = async_train(
        **{"system/checkpoint_age_mean": lambda s: 3.0, "system/accepted_token_frac": lambda s: 0.7}
    )
    finding = verdict(make_run(train), "async_efficiency")
    assert finding.status == "detected"
    costly = [e.metric for e in finding.evidence if e.values.get("cost")]
    assert costly == ["system/checkpoint_age_mean", "system/accepted_token_frac"]
    gain = finding.evidence[-1]
    assert gain.metric == "eval/pass@1" and set(gain.values) == {"first_half", "second_half"}


def test_async_efficiency_detected_on_a_queue_that_prefers_short_trajectories() -> None:
    # trained trajectories are 30% shorter than the held-out ones from the same policy
    held = healthy_eval() | {"eval/length": lambda s: (6 + s / 25) / 0.7}
    finding = verdict(make_run(async_train(), held), "async_efficiency")
    assert finding.status == "detected"
    assert [e.metric for e in finding.evidence if e.values.get("cost")] == [
        "length/mean ÷ eval/length"
    ]


def test_async_efficiency_quiet_and_not_checked() -> None:
    assert verdict(make_run(async_train()), "async_efficiency").status == "quiet"
    finding = verdict(make_run(), "async_efficiency")
    assert finding.status == "not checked"
    assert "system/checkpoint_age_mean" in finding.needs[0] and "asynchronous" in finding.needs[0]


# --- the command ------------------------------------------------------------------


def write_run(path: Path, run: RunData) -> Path:
    path.mkdir()
    lines = [json.dumps(r) for r in run.records]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (path / "ledger.json").write_text(json.dumps({"epochs_per_batch": 1}), encoding="utf-8")
    (path / "config.yaml").write_text("# grpo: a composition\nrecipe: grpo\n", encoding="utf-8")
    return path


def entropy_collapsing_run() -> RunData:
    return make_run(healthy_train() | {"entropy": lambda s: 0.9 * math.exp(-s / 6)})


def test_cli_text_names_the_symptom(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path / "run", entropy_collapsing_run())
    assert main(["diagnose", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rlmap diagnose {run_dir}: 101 records, steps 0–100\n  grpo: a comp")
    assert "1 detected, 4 quiet, 6 not checked" in out
    assert "DETECTED  entropy collapses quickly [entropy_collapse]" in out
    assert "check, in this order:\n    1. positive-advantage ratio" in out
    assert "not checked  async throughput up, sample efficiency down — needs" in out


def test_cli_json_parses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path / "run", entropy_collapsing_run())
    assert main(["diagnose", str(run_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["records"] == 101 and report["steps"] == [0, 100]
    status = {f["symptom"]: f["status"] for f in report["findings"]}
    assert status["entropy_collapse"] == "detected" and status["async_efficiency"] == "not checked"
    entropy = next(f for f in report["findings"] if f["symptom"] == "entropy_collapse")
    assert entropy["evidence"][0]["metric"] == "entropy"
    assert [c["interface"] for c in entropy["checks"]][:2] == [
        "positive-advantage ratio",
        "upper clip",
    ]


def test_json_writes_non_finite_numbers_as_null() -> None:
    # a constant trace that jumps gives an infinite t statistic
    train = healthy_train() | {
        "length/mean": lambda s: 100.0 if s < 50 else 300.0,
        "reward/mean": lambda s: 0.5,
    }
    text = render_json(diagnose_run(make_run(train)))
    assert "Infinity" not in text and "NaN" not in text
    json.loads(text)


@pytest.mark.parametrize("content", [None, ""])
def test_cli_missing_metrics_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None
) -> None:
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content, encoding="utf-8")
    assert main(["diagnose", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"rlmap: error: {tmp_path / 'metrics.jsonl'}: no metrics")


# --- 7. MoE routes disagree between training and rollout -------------------------------


def _moe_run(mismatch: float, replay: bool) -> RunData:
    noise = random.Random(0)
    level = {s: mismatch * (1 + 0.5 * noise.random()) for s in range(101)}
    train = healthy_train() | {
        "moe/route_mismatch_frac": lambda s: level[s],
        "ratio/kappa/p99_abs_log": lambda s: 0.01 + 2.0 * level[s],  # κ follows the routes
    }
    return make_run(train, config={"behaviour": {"routing_replay": replay}})


def test_disagreeing_routes_without_replay_are_detected_with_the_kappa_evidence() -> None:
    finding = verdict(_moe_run(0.05, replay=False), "moe_route_mismatch")
    assert finding.status == "detected"
    routes, kappa = finding.evidence
    assert routes.values["mean"] == pytest.approx(0.05 * 1.25, rel=0.1)
    assert kappa.values["correlation"] == pytest.approx(1.0)  # κ's tail moves with the routes
    assert [c.interface for c in finding.checks][:2] == ["router metadata", "routing replay (R3)"]


@pytest.mark.parametrize(("mismatch", "replay"), [(0.05, True), (0.001, False)])
def test_replayed_or_rare_route_mismatch_is_quiet(mismatch: float, replay: bool) -> None:
    assert verdict(_moe_run(mismatch, replay), "moe_route_mismatch").status == "quiet"


def test_a_dense_run_is_not_checked_for_routes() -> None:
    finding = verdict(make_run(), "moe_route_mismatch")
    assert finding.status == "not checked" and "moe/route_mismatch_frac" in finding.needs[0]


# --- 8. learner steps with nothing to train on --------------------------------------------


def test_empty_steps_are_detected_naming_the_steps() -> None:
    # 100 steps, steps 41 and 42 empty (all rewards failed): detected, both named, the window
    run = make_run(healthy_train() | {"system/empty_step": lambda s: float(s in (41, 42))})
    finding = verdict(run, "empty_steps")
    assert finding.status == "detected"
    (evidence,) = finding.evidence
    assert evidence.values == {"empty": 2.0, "steps": 100.0}
    assert "steps 41, 42" in evidence.text
    assert finding.checks[0].interface == "reward failures"


def test_a_run_without_empty_steps_is_quiet_and_an_old_run_not_checked() -> None:
    run = make_run(healthy_train() | {"system/empty_step": lambda s: 0.0})
    assert verdict(run, "empty_steps").status == "quiet"
    assert verdict(make_run(), "empty_steps").status == "not checked"


# --- 9. the AI judge's biases ------------------------------------------------------------


def test_a_judge_that_prefers_the_first_shown_is_flagged() -> None:
    # agreement 0.5 on every step: mean 0.5 < 0.8 (POSITION_AGREEMENT_MIN)
    run = make_run(
        healthy_train()
        | {"judge/position_agreement": lambda s: 0.5, "judge/first_preferred_frac": lambda s: 0.75}
    )
    finding = verdict(run, "judge_bias")
    assert finding.status == "detected"
    assert finding.evidence[0].values == {"mean": 0.5}
    assert "first shown preferred in 0.75" in finding.evidence[0].text
    assert finding.checks[0].interface == "position bias"


@pytest.mark.parametrize(
    ("corr", "status"), [(0.35, "detected"), (-0.4, "detected"), (0.1, "quiet")]
)
def test_a_judge_that_rewards_length_is_flagged(corr: float, status: str) -> None:
    run = make_run(
        healthy_train()
        | {"judge/position_agreement": lambda s: 0.95, "judge/length_corr": lambda s: corr}
    )
    assert verdict(run, "judge_bias").status == status


def test_a_run_without_a_judge_is_not_checked_for_its_bias() -> None:
    finding = verdict(make_run(healthy_train()), "judge_bias")
    assert finding.status == "not checked" and "judge/position_agreement" in finding.needs[0]


def test_a_detected_symptom_cites_the_samples_of_its_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlmap.runs.samples import write_samples

    run_dir = write_run(tmp_path / "run", entropy_collapsing_run())
    for step, classes in (
        (0, ["wrong_answer"] * 3),
        (50, ["correct", "wrong_answer"]),
        (100, ["truncated", "truncated", "correct"]),
    ):
        write_samples(run_dir, step, [{"class": c} for c in classes])
    assert main(["diagnose", str(run_dir)]) == 0
    out = capsys.readouterr().out
    block = out.split("DETECTED  entropy collapses quickly")[1].split("\n\n")[0]
    assert "  samples to read:\n" in block
    cited = [line for line in block.splitlines() if "samples/step_" in line]
    # the collapse shows over steps 1–19: the evaluations just before (0) and after (50)
    assert verdict(entropy_collapsing_run(), "entropy_collapse").window == (1, 19)
    assert [line.split("samples/step_")[1].split(".")[0] for line in cited] == ["0", "50"]
    assert f"samples/step_50.jsonl: correct 1, wrong_answer 1 (rlmap samples {run_dir} " in block
    assert main(["diagnose", str(run_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == {"entropy_collapse": [c.strip("- ").strip() for c in cited]}


def test_citations_bracket_the_window_or_take_the_newest(tmp_path: Path) -> None:
    from rlmap.diagnostics.report import cite_samples
    from rlmap.runs.samples import write_samples

    for step in (0, 10, 20, 30):
        write_samples(tmp_path, step, [{"class": "correct"}])

    def steps(window: tuple[int, int] | None) -> list[str]:
        return [c.split("step_")[1].split(".")[0] for c in cite_samples(tmp_path, window)]

    assert steps((12, 18)) == ["10", "20"] and steps((10, 20)) == ["10", "20"]
    assert steps((25, 40)) == ["20"] and steps(None) == ["30"]
    assert cite_samples(tmp_path / "none", None) == ()


def test_the_map_names_dppo_m2po_and_replay_where_its_failure_table_points() -> None:
    # Ratio tails (late collapse), stale batches (async efficiency) and an engine mismatch
    # (the κ row) each point at the 2026 corrections that act on them, reading their settings.
    from rlmap.diagnostics import symptoms

    def reads(symptom: symptoms.Symptom) -> str:
        return " ".join(" ".join((i.name, *i.reads, i.hint)) for i in symptom.check)

    tails, stale = reads(symptoms.LATE_COLLAPSE), reads(symptoms.ASYNC_EFFICIENCY)
    for text in (tails, stale):
        assert "M2PO" in text and "DPPO" in text and "config:behaviour.corrections" in text
    mismatch = reads(symptoms.MOE_ROUTE_MISMATCH)
    assert (
        "config:behaviour.replay_sampling_set" in mismatch and "config:generation.top_p" in mismatch
    )
