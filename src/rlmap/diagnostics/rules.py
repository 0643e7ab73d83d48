"""One rule per symptom of the map: does it show in this run, and on what evidence?

Each rule is a pure function of a :class:`~rlmap.diagnostics.run.RunData` returning an
:class:`~rlmap.diagnostics.symptoms.Outcome`: detected or not, the evidence (metric,
steps, numbers), and the steps where the symptom shows. A rule whose inputs were not
logged says so (``not checked``, naming what it needs) rather than guess.

No rule reads a single step: a step sees a few dozen samples. Trends compare the mean
of a span's first third with its last third (Welch t, :mod:`rlmap.diagnostics.stats`);
levels use rolling means. Thresholds are the named constants below; each says why it
sits where it does. They were set so that the healthy embedded runs (GRPO, RLOO, token-
and turn-level PPO, VAPO on the calculator task, 100 steps) stay quiet with margin.
docs/diagnose.md lists every rule with its inputs and thresholds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlmap.core.registry import Registry
from rlmap.diagnostics import symptoms
from rlmap.diagnostics.run import RunData
from rlmap.diagnostics.stats import (
    Point,
    Shift,
    correlation,
    mean,
    rolling,
    shift,
    step_noise,
    trace,
    within,
)
from rlmap.diagnostics.symptoms import Check, Evidence, Finding, Outcome, Status, Symptom

MIN_POINTS = 9
"""Fewest steps a trend test accepts: three per third, so each third has a spread."""
TREND_T = 3.0
"""Welch t a change between thirds must reach to count as a trend. On a flat trace of
independent noise |t| >= 3 happens by chance well under 1% of the time."""
WINDOW = 5
"""Steps in a rolling mean (and in the "start" of a trace): enough to damp one step's
sampling noise, short enough to see a change within ten steps."""
MIN_EVALS = 3
"""Held-out evaluations a held-out trend needs: before training, and two more."""

HELDOUT_DROP = 0.05
"""Held-out pass@1 must fall at least this much (absolute) below its best evaluation.
Between evaluations of one run it moves by ~0.01-0.02 on the embedded held-out set
(256 prompts × 8 samples, the same sampling seed each time)."""
HELDOUT_DROP_REL = 0.1
"""... and at least this fraction of its best value (from a best of 0.9 it must fall 0.09)."""
HACK_GAP = 0.05
"""With a stricter held-out verifier (``feedback.eval_verifier``): the training verifier's
held-out pass@1 (``eval/train_verifier_pass@1``) exceeds the held-out verifier's by at least
this much, on average over the last third of the evaluations, and by this much more than
at the first evaluation: the training verifier accepts what the held-out one rejects."""

ENTROPY_COLLAPSE_FRAC = 0.1
"""Entropy has collapsed when its rolling mean is at or below this fraction of its start
(the mean of its first WINDOW steps) and still is at the end. Healthy embedded runs end
at 12-17% of their start after 100 steps, without a fast fall."""
ENTROPY_QUICK_FRAC = 0.75
"""... quickly: the collapse is reached within this fraction of the run's steps (a
policy that only turns deterministic in the last quarter has learned first)."""

ZERO_GROUP_FRAC = 0.5
"""Group losses are often zero when, averaged over the steps, at least half of the groups
have zero advantage (all members rewarded alike), or a group filter threw away at least
half of what was generated. Healthy embedded GRPO/RLOO runs average about 0.16."""

LENGTH_DRIFT_REL = 0.3
"""Mean response length must move by at least 30% between the first and last third.
The embedded calculator task lengthens by 50-60% while it learns to call the tool, so
size alone does not make a drift: see :func:`length_drift`."""
TRUNCATION_FRAC = 0.05
"""Truncated fraction (last third) from which a length increase counts as running into
the length limit."""

COLLAPSE_Z = 5.0
"""A collapse drops the reward from its best rolling mean (WINDOW steps) to its end (the
mean of the last 2·WINDOW steps) by at least this many standard errors of that difference
(per-step noise · sqrt(1/WINDOW + 1/(2·WINDOW))). On flat noise the best of ~100 windows
sits high by chance: in simulation, 100-step flat runs reach z >= 4.3 once in a thousand.
Healthy embedded runs stay below 1.1 (a VAPO run ending 0.15 below its best: 2.4)."""
COLLAPSE_RANGE_FRAC = 0.5
"""... and gives back at least half of the range the rolling mean covered over the run:
a run that rose and then wobbles below its best keeps most of its gain."""

STALE_AGE = 2.0
"""Mean checkpoint age (learner versions behind) from which staleness is a cost. One
version behind is what one-step asynchrony pays by design."""
ACCEPTED_MIN = 0.9
"""Accepted token fraction at or below which a tenth or more of the generated tokens were
paid for and thrown away (staleness filter, acceptance gate)."""
DIRECT_TAIL = 0.5
"""Mean p99 |log d| of the direct ratio d = π_θ/μ from which the tail tokens are off by a
factor e^0.5 ≈ 1.65 or more."""
SHORT_BIAS = 0.85
"""Trained length / held-out length at or below which the queue favours short
trajectories: the held-out evaluation samples complete episodes from the current policy,
the queue delivers whatever finished first."""


@dataclass(frozen=True)
class Rule:
    """A symptom of the map and the function that looks for it."""

    symptom: Symptom
    detect: Callable[[RunData], Outcome]


# --- helpers -----------------------------------------------------------------------


def _needs(
    run: RunData, *wanted: tuple[str, int], why: str = ""
) -> tuple[list[list[Point]], tuple[str, ...]]:
    """Traces of the ``(metric, fewest steps)`` wanted, and what is missing of them."""
    traces, missing = [], []
    for name, count in wanted:
        points = trace(run.records, name)
        traces.append(points)
        if len(points) < count:
            missing.append(f"{name} on >= {count} steps, found {len(points)}{why}")
    return traces, tuple(missing)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _span(points: Sequence[Point]) -> tuple[int, int]:
    return (points[0][0], points[-1][0])


def _values(points: Sequence[Point]) -> list[float]:
    return [v for _, v in points]


def _shift_values(s: Shift) -> dict[str, float]:
    return {"before": s.before, "after": s.after, "t": s.t}


# --- 1. reward rises while held-out ability falls ----------------------------------


def reward_up_heldout_down(run: RunData) -> Outcome:
    """Held-out pass@1 ends clearly below its best evaluation (HELDOUT_DROP, HELDOUT_DROP_REL)
    while the trained reward, from that best evaluation to the end, rises (t >= TREND_T)."""
    (held, reward), needs = _needs(run, ("eval/pass@1", MIN_EVALS), ("reward/mean", MIN_POINTS))
    if needs:
        return Outcome(False, needs=needs)
    best_step, best = max(held, key=lambda p: (p[1], -p[0]))  # the earliest best
    last_step, last = held[-1]
    drop, needed = best - last, max(HELDOUT_DROP, HELDOUT_DROP_REL * best)
    text = (
        f"held-out pass@1: best {_fmt(best)} at step {best_step}, last {_fmt(last)} at step "
        f"{last_step}, a drop of {_fmt(drop)} (a fall is >= {_fmt(needed)})"
    )
    values = {"best": best, "best_step": best_step, "last": last, "drop": drop}
    evidence = [Evidence("eval/pass@1", _span(held), text, values)]
    gap = _verifier_gap(run, held)
    if gap is not None:
        evidence += gap.evidence
        if gap.detected:
            return Outcome(True, tuple(evidence), window=gap.window)
    after = [p for p in reward if p[0] >= best_step]
    if drop < needed or len(after) < MIN_POINTS:
        return Outcome(False, tuple(evidence))
    rise = shift(after)
    text = f"trained reward from the best evaluation to the end: {rise.describe()}"
    evidence.append(Evidence("reward/mean", _span(after), text, _shift_values(rise)))
    return Outcome(rise.t >= TREND_T, tuple(evidence), window=(best_step, last_step))


def _verifier_gap(run: RunData, held: list[Point]) -> Outcome | None:
    """The training verifier's held-out score against the held-out verifier's (HACK_GAP);
    None when the run has no separate held-out verifier."""
    loose = dict(trace(run.records, "eval/train_verifier_pass@1"))
    gaps = [(step, loose[step] - strict) for step, strict in held if step in loose]
    if len(gaps) < MIN_EVALS:
        return None
    tail = gaps[-max(1, len(gaps) // 3) :]
    end = mean([g for _, g in tail])
    start = gaps[0][1]
    text = (
        f"the training verifier accepts {_fmt(end)} more of the held-out samples than the "
        f"held-out verifier over the last evaluations (steps {tail[0][0]}-{tail[-1][0]}), "
        f"{_fmt(start)} at step {gaps[0][0]} (reward hacking shows as >= {_fmt(HACK_GAP)})"
    )
    values = {"gap_start": start, "gap_end": end}
    evidence = Evidence("eval/train_verifier_pass@1", _span(gaps), text, values)
    detected = end >= HACK_GAP and end - start >= HACK_GAP
    return Outcome(detected, (evidence,), window=(tail[0][0], tail[-1][0]))


# --- 2. entropy collapses quickly ---------------------------------------------------


def entropy_collapse(run: RunData) -> Outcome:
    """The rolling-mean entropy falls to ENTROPY_COLLAPSE_FRAC of its start within the first
    ENTROPY_QUICK_FRAC of the run, and is still that low at the end."""
    (entropy,), needs = _needs(run, ("entropy", 3 * WINDOW))
    if needs:
        return Outcome(False, needs=needs)
    first, last = _span(entropy)
    start = mean(_values(entropy[:WINDOW]))
    if start <= 0:
        return Outcome(False, (Evidence("entropy", (first, last), "entropy starts at 0", {}),))
    floor = ENTROPY_COLLAPSE_FRAC * start
    smooth = rolling(entropy, WINDOW)
    end_step, end = smooth[-1]
    text = (
        f"entropy {_fmt(start)} (mean of steps {first}–{entropy[WINDOW - 1][0]}) → {_fmt(end)} "
        f"at step {end_step}: {end / start:.0%} of its start (collapsed at <= "
        f"{ENTROPY_COLLAPSE_FRAC:.0%})"
    )
    values: dict[str, Any] = {"start": start, "end": end, "floor": floor}
    crossed = next((step for step, v in smooth if v <= floor), None)
    if crossed is None:
        return Outcome(False, (Evidence("entropy", (first, last), text, values),))
    progress = (crossed - first) / max(last - first, 1)
    text += f"; first there at step {crossed}, {progress:.0%} into the run"
    values |= {"collapse_step": crossed, "run_fraction": progress}
    detected = end <= floor and progress <= ENTROPY_QUICK_FRAC
    evidence = (Evidence("entropy", (first, last), text, values),)
    return Outcome(detected, evidence, window=(first, crossed))


# --- 3. group losses often zero -----------------------------------------------------


def zero_group_loss(run: RunData) -> Outcome:
    """Averaged over the steps, at least ZERO_GROUP_FRAC of the trained groups have zero
    advantage, or a group filter (DAPO dynamic sampling) discards at least that fraction of
    the generated trajectories (the uniform groups it removes would have had zero loss)."""
    why = " (logged by the group estimators: grpo, rloo, ...)"
    (zero,), needs = _needs(run, ("group/zero_adv_frac", WINDOW), why=why)
    if needs:
        return Outcome(False, needs=needs)
    average, late = mean(_values(zero)), mean(_values(zero[-(len(zero) // 3) :]))
    often = sum(v >= ZERO_GROUP_FRAC for _, v in zero)
    text = (
        f"groups with zero advantage: {average:.0%} of the groups on average (last third "
        f"{late:.0%}); {ZERO_GROUP_FRAC:.0%} or more on {often} of {len(zero)} steps"
    )
    values = {"mean": average, "last_third_mean": late, "steps_at_or_above": often}
    evidence = [Evidence("group/zero_adv_frac", _span(zero), text, values)]
    kept = trace(run.records, "sampling/kept_frac")
    discarded = 1.0 - mean(_values(kept)) if kept else 0.0
    if discarded > 0:
        text = f"the group filter discarded {discarded:.0%} of the generated trajectories"
        evidence.append(Evidence("sampling/kept_frac", _span(kept), text, {"discarded": discarded}))
    outcome = trace(run.records, "reward/outcome_mean")
    if outcome and all(v == 0 for _, v in outcome):
        text = "no trajectory was ever rewarded: 0 on every step"
        evidence.append(Evidence("reward/outcome_mean", _span(outcome), text, {}))
    detected = average >= ZERO_GROUP_FRAC or discarded >= ZERO_GROUP_FRAC
    return Outcome(detected, tuple(evidence))


# --- 4. response length keeps drifting ----------------------------------------------


def length_drift(run: RunData) -> Outcome:
    """Mean length moves by LENGTH_DRIFT_REL or more (first vs last third, |t| >= TREND_T), is
    still moving the same way over the last half, and that is not learning: the trained
    reward no longer rises over the last half, or the truncated fraction grows to
    TRUNCATION_FRAC or more (the length runs into the limit)."""
    wanted = (("length/mean", 2 * MIN_POINTS), ("reward/mean", 2 * MIN_POINTS))
    (length, reward), needs = _needs(run, *wanted)
    if needs:
        return Outcome(False, needs=needs)
    whole, late = shift(length), shift(length[len(length) // 2 :])
    text = (
        f"mean length {whole.describe()} ({whole.relative:+.0%}); over the last half "
        f"{late.describe()}"
    )
    values = _shift_values(whole) | {"relative": whole.relative, "last_half_t": late.t}
    evidence = [Evidence("length/mean", _span(length), text, values)]
    drifting = abs(whole.relative) >= LENGTH_DRIFT_REL and abs(whole.t) >= TREND_T
    still = late.change * whole.change > 0 and abs(late.t) >= TREND_T
    if not (drifting and still):
        return Outcome(False, tuple(evidence))
    gain, corr = shift(reward[len(reward) // 2 :]), correlation(reward, length)
    text = f"trained reward over the last half {gain.describe()}; reward–length correlation "
    values = {"last_half_t": gain.t, "reward_length_correlation": corr}
    evidence.append(Evidence("reward/mean", _span(reward), text + f"{corr:+.2f}", values))
    truncated = trace(run.records, "length/truncated_frac")
    into_limit = False
    if len(truncated) >= MIN_POINTS:
        cut = shift(truncated)
        into_limit = cut.after >= TRUNCATION_FRAC and cut.change > 0
        text = f"truncated fraction {cut.describe()}"
        evidence.append(
            Evidence("length/truncated_frac", _span(truncated), text, _shift_values(cut))
        )
    return Outcome(gain.t < TREND_T or into_limit, tuple(evidence))


# --- 5. PPO stable at first, then collapses -----------------------------------------


def late_collapse(run: RunData) -> Outcome:
    """The rolling-mean reward peaks no earlier than its (WINDOW+1)-th window (a stable or
    improving start); the reward of the last 2·WINDOW steps is at least COLLAPSE_Z standard
    errors and COLLAPSE_RANGE_FRAC of the rolling mean's range below that peak."""
    (reward,), needs = _needs(run, ("reward/mean", 4 * WINDOW))
    if needs:
        return Outcome(False, needs=needs)
    smooth = rolling(reward, WINDOW)
    peak_at = max(range(len(smooth)), key=lambda i: (smooth[i][1], -i))
    (peak_step, peak), end_step = smooth[peak_at], reward[-1][0]
    end = mean(_values(reward[-2 * WINDOW :]))
    span = peak - min(_values(smooth))
    noise = step_noise(_values(reward)) * math.sqrt(1 / WINDOW + 1 / (2 * WINDOW))
    drop = peak - end
    z = drop / noise if noise > 0 else (math.inf if drop > 0 else 0.0)
    text = (
        f"trained reward: best rolling mean ({WINDOW} steps) {_fmt(peak)} at step {peak_step}, "
        f"mean of the last {2 * WINDOW} steps {_fmt(end)}; a drop of {_fmt(drop)}, z = {z:.1f}, "
        f"{drop / span if span > 0 else 0.0:.0%} of its range"
    )
    values = {"peak": peak, "peak_step": peak_step, "end": end, "drop": drop, "z": z}
    evidence = [Evidence("reward/mean", _span(reward), text, values)]
    detected = peak_at >= WINDOW and z >= COLLAPSE_Z and drop >= COLLAPSE_RANGE_FRAC * span
    if not detected:
        return Outcome(False, tuple(evidence))
    held = trace(run.records, "eval/pass@1")
    if len(held) >= 2 and held[-1][0] > peak_step:
        (best_step, best), (last_step, last) = max(held[:-1], key=lambda p: p[1]), held[-1]
        text = (
            f"held-out pass@1 {_fmt(best)} at step {best_step} → {_fmt(last)} at step {last_step}"
        )
        values = {"before": best, "after": last}
        evidence.append(Evidence("eval/pass@1", (best_step, last_step), text, values))
    before_peak = reward[max(peak_at - WINDOW, 0)][0]  # readings compare before with after
    return Outcome(True, tuple(evidence), window=(before_peak, end_step))


# --- 6. async throughput up, sample efficiency down ---------------------------------


def async_efficiency(run: RunData) -> Outcome:
    """An asynchronous run (it logs ``system/checkpoint_age_mean``) pays for its throughput in
    at least one of: mean checkpoint age >= STALE_AGE, accepted token fraction <=
    ACCEPTED_MIN, direct-ratio p99 |log d| >= DIRECT_TAIL, trained / held-out length <=
    SHORT_BIAS. The capability gain per generated token is reported with it."""
    why = " (logged by the asynchronous loop)"
    (age,), needs = _needs(run, ("system/checkpoint_age_mean", WINDOW), why=why)
    if needs:
        return Outcome(False, needs=needs)
    costs = (  # (metric, its trace, ">=" or "<=", the threshold, what it measures)
        ("system/checkpoint_age_mean", age, ">=", STALE_AGE, "checkpoint age, versions behind"),
        (
            "system/accepted_token_frac",
            trace(run.records, "system/accepted_token_frac"),
            "<=",
            ACCEPTED_MIN,
            "accepted token fraction",
        ),
        (
            "ratio/d/p99_abs_log",
            trace(run.records, "ratio/d/p99_abs_log"),
            ">=",
            DIRECT_TAIL,
            "direct ratio p99 |log d|",
        ),
        (
            "length/mean ÷ eval/length",
            _length_ratio(run),
            "<=",
            SHORT_BIAS,
            "trained / held-out length",
        ),
    )
    evidence, detected = [], False
    for name, points, sign, limit, what in costs:
        if points:
            average = mean(_values(points))
            costly = average >= limit if sign == ">=" else average <= limit
            detected |= costly
            verdict = "a cost" if costly else "no cost"
            text = f"{what}: mean {_fmt(average)}, {verdict} (a cost at {sign} {limit})"
            evidence.append(Evidence(name, _span(points), text, {"mean": average, "cost": costly}))
    gain = _gain_per_token(run)
    return Outcome(detected, (*evidence, *([gain] if gain else [])))


def _length_ratio(run: RunData) -> list[Point]:
    """length/mean (trained trajectories) ÷ eval/length at the steps that log both."""
    held = dict(trace(run.records, "eval/length"))
    return [(s, v / held[s]) for s, v in trace(run.records, "length/mean") if held.get(s)]


def _gain_per_token(run: RunData) -> Evidence | None:
    """Held-out pass@1 gained per million generated tokens, first half vs second half."""
    tokens = dict(trace(run.records, "budget/generated_tokens"))
    points = [(s, v, tokens[s]) for s, v in trace(run.records, "eval/pass@1") if s in tokens]
    if len(points) < MIN_EVALS:
        return None
    first, mid, last = points[0], points[len(points) // 2], points[-1]
    rates = [
        (b[1] - a[1]) / (b[2] - a[2]) * 1e6 if b[2] > a[2] else math.nan
        for a, b in ((first, mid), (mid, last))
    ]
    text = (
        f"held-out pass@1 gained per million generated tokens: {_fmt(rates[0])} (steps "
        f"{first[0]}–{mid[0]}) → {_fmt(rates[1])} (steps {mid[0]}–{last[0]})"
    )
    values = {"first_half": rates[0], "second_half": rates[1]}
    return Evidence("eval/pass@1", (first[0], last[0]), text, values)


# --- 7. MoE routes disagree between training and rollout -----------------------------

ROUTE_MISMATCH = 0.01
"""Mean share of (token, layer) pairs whose top-k experts differ between the learner's own
routing and the rollout's (``moe/route_mismatch_frac``) from which the routes count as
disagreeing: one routing decision in a hundred changes the function that produced a token."""


def moe_route_mismatch(run: RunData) -> Outcome:
    """An MoE run whose routes disagree (mean ``moe/route_mismatch_frac`` >= ROUTE_MISMATCH)
    without routing replay; the κ tail and its correlation with the mismatch over the steps
    are the evidence that the disagreement reaches the log-probs."""
    why = " (logged by mixture-of-experts policies)"
    (mismatch,), needs = _needs(run, ("moe/route_mismatch_frac", WINDOW), why=why)
    if needs:
        return Outcome(False, needs=needs)
    average = mean(_values(mismatch))
    replayed = bool(run.setting("behaviour.routing_replay"))
    text = (
        f"moe/route_mismatch_frac: mean {_fmt(average)} (disagreeing at >= "
        f"{ROUTE_MISMATCH}); routing replay {'on' if replayed else 'off'}"
    )
    evidence = [
        Evidence(
            "moe/route_mismatch_frac",
            _span(mismatch),
            text,
            {"mean": average, "routing_replay": replayed},
        )
    ]
    kappa = trace(run.records, "ratio/kappa/p99_abs_log")
    if len(kappa) >= MIN_POINTS:
        r, tail = correlation(mismatch, kappa), mean(_values(kappa))
        evidence.append(
            Evidence(
                "ratio/kappa/p99_abs_log",
                _span(mismatch),
                f"κ p99 |log κ| mean {_fmt(tail)}; correlation with the route "
                f"mismatch over the steps {_fmt(r)}",
                {"mean": tail, "correlation": r},
            )
        )
    return Outcome(average >= ROUTE_MISMATCH and not replayed, tuple(evidence))


# --- 8. learner steps with nothing to train on --------------------------------------


def empty_steps(run: RunData) -> Outcome:
    """Steps that logged ``system/empty_step`` 1: every trajectory of the step was rejected
    (its reward failed or was excluded), so no weight moved. Detected on any such step — it
    is a count, not a trend: each one is a step the run's length overstates."""
    (flags,), needs = _needs(
        run, ("system/empty_step", 1), why=" (runs written before it was logged lack it)"
    )
    if needs:
        return Outcome(False, needs=needs)
    empty = [s for s, v in flags if v >= 1]
    text = f"{len(empty)} of {len(flags)} steps had nothing to train on" + (
        f" (steps {', '.join(map(str, empty[:10]))}{' …' if len(empty) > 10 else ''})"
        if empty
        else ""
    )
    evidence = [
        Evidence(
            "system/empty_step",
            _span(flags),
            text,
            {"empty": float(len(empty)), "steps": float(len(flags))},
        )
    ]
    window = (empty[0], empty[-1]) if empty else None
    return Outcome(bool(empty), tuple(evidence), window=window)


# --- 9. the AI judge's biases ------------------------------------------------------

POSITION_AGREEMENT_MIN = 0.8
"""Mean ``judge/position_agreement`` below which the judge's verdict depends on the order
the pair is shown in: one pair in five flips when swapped. A judge that picks at random
agrees half the time; one that always prefers the first shown, never."""
LENGTH_CORR_MAX = 0.3
"""|Mean ``judge/length_corr``| from which the judge rewards length itself: the
within-outcome correlation of its score with the response's length, where the verifier
says the responses are alike."""
JUDGE_STEPS = 2
"""Fewest steps with a bias probe that the rule reads (one step sees few pairs)."""


def judge_bias(run: RunData) -> Outcome:
    """A judge whose verdicts follow the order of the pair (mean position agreement below
    POSITION_AGREEMENT_MIN) or the length of the response at equal verifier outcome (|mean
    length correlation| at or above LENGTH_CORR_MAX: the mean over the steps first, so a
    step's noise averages out)."""
    position = trace(run.records, "judge/position_agreement")
    length = trace(run.records, "judge/length_corr")
    if len(position) < JUDGE_STEPS and len(length) < JUDGE_STEPS:
        why = " (logged by runs with feedback.source=judge or comparison)"
        return Outcome(
            False,
            needs=(
                f"judge/position_agreement or judge/length_corr on >= {JUDGE_STEPS} steps{why}",
            ),
        )
    evidence, detected = [], False
    if len(position) >= JUDGE_STEPS:
        agree = mean(_values(position))
        first = trace(run.records, "judge/first_preferred_frac")
        shown = f"; the first shown preferred in {_fmt(mean(_values(first)))}" if first else ""
        text = (
            f"pairs shown both ways agree in {_fmt(agree)} (biased below "
            f"{POSITION_AGREEMENT_MIN}){shown}"
        )
        evidence.append(
            Evidence("judge/position_agreement", _span(position), text, {"mean": agree})
        )
        detected |= agree < POSITION_AGREEMENT_MIN
    if len(length) >= JUDGE_STEPS:
        corr = mean(_values(length))
        evidence.append(
            Evidence(
                "judge/length_corr",
                _span(length),
                f"score–length correlation at equal verifier outcome "
                f"{_fmt(corr)} (biased at |r| >= {LENGTH_CORR_MAX})",
                {"mean": corr},
            )
        )
        detected |= abs(corr) >= LENGTH_CORR_MAX
    return Outcome(detected, tuple(evidence))


# --- the registry and applying it ---------------------------------------------------

registry: Registry[Rule] = Registry("symptom")
for _rule in (
    Rule(symptoms.REWARD_UP_HELDOUT_DOWN, reward_up_heldout_down),
    Rule(symptoms.ENTROPY_COLLAPSE, entropy_collapse),
    Rule(symptoms.ZERO_GROUP_LOSS, zero_group_loss),
    Rule(symptoms.LENGTH_DRIFT, length_drift),
    Rule(symptoms.LATE_COLLAPSE, late_collapse),
    Rule(symptoms.ASYNC_EFFICIENCY, async_efficiency),
    Rule(symptoms.MOE_ROUTE_MISMATCH, moe_route_mismatch),
    Rule(symptoms.EMPTY_STEPS, empty_steps),
    Rule(symptoms.JUDGE_BIAS, judge_bias),
):
    registry.add(_rule.symptom.id, _rule)


def reading(run: RunData, source: str, window: tuple[int, int]) -> Evidence | None:
    """What the run logged for one interface input over ``window``; None if nothing."""
    kind, _, key = source.partition(":")
    if key and kind in ("config", "ledger"):
        value = run.setting(key) if kind == "config" else run.ledger.get(key)
        if value is None:
            return None
        where = f"{kind}.yaml" if kind == "config" else f"{kind}.json"
        return Evidence(f"{where}: {key}", None, f"{key} = {value} ({where})", {"value": value})
    points = within(trace(run.records, source), *window)
    if not points:
        return None
    (first_step, first), (last_step, last) = points[0], points[-1]
    top_step, top = max(points, key=lambda p: p[1])
    average = mean(_values(points))
    text = (
        f"{source}, steps {first_step}–{last_step}: {_fmt(first)} → {_fmt(last)}; "
        f"mean {_fmt(average)}, max {_fmt(top)} at step {top_step}"
    )
    values = {"first": first, "last": last, "mean": average, "max": top, "max_step": top_step}
    return Evidence(source, (first_step, last_step), text, values)


def _checks(run: RunData, symptom: Symptom, window: tuple[int, int] | None) -> tuple[Check, ...]:
    checks = []
    for interface in symptom.check:
        found = [] if window is None else [reading(run, s, window) for s in interface.reads]
        readings = tuple(r for r in found if r is not None)
        checks.append(Check(interface.name, readings, interface.hint))
    return tuple(checks)


def check(run: RunData, rule: Rule) -> Finding:
    """Apply one rule: its verdict, evidence and (when detected) the interface readings."""
    outcome = rule.detect(run)
    status: Status = "not checked" if outcome.needs else "quiet"
    if outcome.detected and not outcome.needs:
        status = "detected"
    window = (outcome.window or run.steps) if status == "detected" else None
    s = rule.symptom
    checks = _checks(run, s, window)
    return Finding(
        s.id,
        s.title,
        s.source,
        status,
        outcome.evidence,
        checks,
        s.not_first,
        outcome.needs,
        outcome.window if status == "detected" else None,
    )


def check_all(run: RunData) -> tuple[Finding, ...]:
    """Every registered rule on ``run``, in the map's order."""
    return tuple(check(run, registry.get(name)) for name in registry.names())
