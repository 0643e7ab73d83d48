"""`rlmap diagnose` on segmented episodes (docs/formulas.md §2.5): a boundary that loses the
state, credit that stops at the boundaries — traces built to show each, near misses that must
stay quiet, and runs that cannot be checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_diagnostics_symptoms import Curve, healthy_train, make_run, noisy, ramp, verdict

from rlmap.diagnostics.report import diagnose, diagnose_run, render_text
from rlmap.diagnostics.run import RunData

DATA = Path(__file__).parent / "data"
STATE, CREDIT = "segment_state_loss", "segment_credit_cut"


def constant(x: float) -> Curve:
    return lambda step: x


def segmented(**overrides: Curve) -> RunData:
    """A healthy critic run on segmented episodes: two rows per episode, a critic that learns
    (explained variance 0.1 → 0.45), a state-sufficiency gap a tenth of the returns' spread
    (0.04 against reward/std 0.4), no sign to it; 100 steps."""
    train = healthy_train() | {
        "reward/std": noisy(constant(0.4), 0.03, seed=11, low=0.0),
        "env/segments": noisy(constant(2.0), 0.1, seed=12, low=1.0),
        "critic/explained_variance": noisy(ramp(0.1, 0.45), 0.05, seed=13),
        "critic/segment_value_gap": noisy(constant(0.04), 0.01, seed=14, low=0.0),
        "critic/segment_value_gap_signed": noisy(constant(0.0), 0.01, seed=15),
        "critic/value_error_last": noisy(constant(0.1), 0.01, seed=16, low=0.0),
    }
    return make_run(train | overrides, config={"data": {"context_policy": "truncate_oldest"}})


def test_a_healthy_segmented_run_is_quiet() -> None:
    run = segmented()
    assert verdict(run, STATE).status == "quiet"
    assert verdict(run, CREDIT).status == "quiet"
    assert diagnose_run(run).detected == ()


# --- a boundary that loses the state ------------------------------------------------------


@pytest.mark.parametrize(("gap", "status"), [(0.15, "detected"), (0.1, "quiet")])
def test_the_gap_is_read_against_the_returns_spread(gap: float, status: str) -> None:
    # reward/std 0.4 on every step: 0.15/0.4 = 0.375 ≥ 0.3 (GAP_REL), 0.1/0.4 = 0.25 < 0.3
    run = segmented(**{"critic/segment_value_gap": constant(gap), "reward/std": constant(0.4)})
    finding = verdict(run, STATE)
    assert finding.status == status
    assert finding.evidence[0].values["relative"] == pytest.approx(gap / 0.4)


def test_a_lost_state_is_detected_over_the_last_third_with_its_readings() -> None:
    # 100 steps: the last third is steps 68-100 (33 points); gap 0.2 against 0.4 → 0.5
    run = segmented(**{"critic/segment_value_gap": noisy(constant(0.2), 0.02, seed=3)})
    finding = verdict(run, STATE)
    assert finding.status == "detected"
    assert finding.window == (68, 100)
    gap, signed = finding.evidence
    assert gap.values["relative"] == pytest.approx(0.5, abs=0.05)
    assert abs(signed.values["mean"]) < 0.01  # no sign: what was dropped, not the form
    first = finding.checks[0]
    assert "data.context_policy=compact" in first.interface
    assert "config.yaml: data.context_policy" in [r.metric for r in first.readings]
    assert any("critic.warmup_steps" in c.interface for c in finding.checks)


def test_a_gap_that_closes_as_the_critic_learns_is_quiet() -> None:
    # 0.3 → 0.02: large while the critic is fresh (0.75 of the spread), small by the last third
    run = segmented(**{"critic/segment_value_gap": ramp(0.3, 0.02)})
    assert verdict(run, STATE).status == "quiet"


def test_returns_without_spread_have_no_state_to_lose() -> None:
    run = segmented(**{"reward/std": constant(0.0), "critic/segment_value_gap": constant(0.2)})
    assert verdict(run, STATE).status == "quiet"


# --- credit that stops at the boundaries --------------------------------------------------


def test_a_critic_that_explains_nothing_stops_the_credit_at_the_boundaries() -> None:
    # two rows per episode: half the rows close at a boundary; explained variance ~0.02 ≤ 0.1
    run = segmented(**{"critic/explained_variance": noisy(constant(0.02), 0.03, seed=5)})
    finding = verdict(run, CREDIT)
    assert finding.status == "detected"
    rows, explained = finding.evidence
    assert rows.values["closing"] == pytest.approx(0.5, abs=0.03)
    assert explained.values["mean"] == pytest.approx(0.02, abs=0.02)
    names = " ".join(c.interface for c in finding.checks)
    assert "critic.warmup_steps" in names and "credit.estimator=grpo" in names
    assert "data.context_policy=compact" in names
    assert "credit.lam" in finding.not_first[0]


@pytest.mark.parametrize(
    ("why", "overrides"),
    [
        (
            "few boundaries",
            {"env/segments": constant(1.2), "critic/explained_variance": constant(0.0)},
        ),
        ("a critic that learned", {"critic/explained_variance": ramp(-0.2, 0.4)}),
    ],
)
def test_credit_cut_near_misses(why: str, overrides: dict[str, Curve]) -> None:
    assert verdict(segmented(**overrides), CREDIT).status == "quiet", why


# --- runs without segments ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["ppo_turn", "vapo"])
def test_healthy_unsegmented_critic_runs_are_not_checked(name: str) -> None:
    findings = {f.symptom: f for f in diagnose(DATA / name).findings}
    assert findings[STATE].status == "not checked"
    assert "critic/segment_value_gap" in findings[STATE].needs[0]
    assert findings[CREDIT].status == "not checked"
    assert "env/segments" in findings[CREDIT].needs[0]


def test_the_report_names_the_symptom_and_what_to_try() -> None:
    run = segmented(**{"critic/segment_value_gap": constant(0.3)})
    text = render_text(diagnose_run(run, "run"))
    assert "DETECTED  a segment boundary loses the state [segment_state_loss]" in text
    assert "data.context_policy=compact" in text and "data.context_policy = truncate_oldest" in text
