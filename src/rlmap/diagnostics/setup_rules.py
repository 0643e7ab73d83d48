"""The symptoms of the set-up around learning: asynchrony paid in sample efficiency, MoE
routes that disagree, steps with nothing to train on, an AI judge's biases.

Written as :mod:`rlmap.diagnostics.curve_rules`' are (pure functions of a run's records,
thresholds as named constants set on the healthy embedded runs).
"""

from __future__ import annotations

import math

from rlmap.diagnostics.rule_inputs import (
    MIN_EVALS,
    MIN_POINTS,
    WINDOW,
    fmt,
    steps_of,
    values_of,
    wanted_traces,
)
from rlmap.diagnostics.run import RunData
from rlmap.diagnostics.stats import Point, correlation, mean, trace
from rlmap.diagnostics.symptoms import Evidence, Outcome

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


# --- 6. async throughput up, sample efficiency down ---------------------------------


def async_efficiency(run: RunData) -> Outcome:
    """An asynchronous run (it logs ``system/checkpoint_age_mean``) pays for its throughput in
    at least one of: mean checkpoint age >= STALE_AGE, accepted token fraction <=
    ACCEPTED_MIN, direct-ratio p99 |log d| >= DIRECT_TAIL, trained / held-out length <=
    SHORT_BIAS. The capability gain per generated token is reported with it."""
    why = " (logged by the asynchronous loop)"
    (age,), needs = wanted_traces(run, ("system/checkpoint_age_mean", WINDOW), why=why)
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
            average = mean(values_of(points))
            costly = average >= limit if sign == ">=" else average <= limit
            detected |= costly
            verdict = "a cost" if costly else "no cost"
            text = f"{what}: mean {fmt(average)}, {verdict} (a cost at {sign} {limit})"
            evidence.append(
                Evidence(name, steps_of(points), text, {"mean": average, "cost": costly})
            )
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
        f"held-out pass@1 gained per million generated tokens: {fmt(rates[0])} (steps "
        f"{first[0]}–{mid[0]}) → {fmt(rates[1])} (steps {mid[0]}–{last[0]})"
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
    (mismatch,), needs = wanted_traces(run, ("moe/route_mismatch_frac", WINDOW), why=why)
    if needs:
        return Outcome(False, needs=needs)
    average = mean(values_of(mismatch))
    replayed = bool(run.setting("behaviour.routing_replay"))
    text = (
        f"moe/route_mismatch_frac: mean {fmt(average)} (disagreeing at >= "
        f"{ROUTE_MISMATCH}); routing replay {'on' if replayed else 'off'}"
    )
    evidence = [
        Evidence(
            "moe/route_mismatch_frac",
            steps_of(mismatch),
            text,
            {"mean": average, "routing_replay": replayed},
        )
    ]
    kappa = trace(run.records, "ratio/kappa/p99_abs_log")
    if len(kappa) >= MIN_POINTS:
        r, tail = correlation(mismatch, kappa), mean(values_of(kappa))
        evidence.append(
            Evidence(
                "ratio/kappa/p99_abs_log",
                steps_of(mismatch),
                f"κ p99 |log κ| mean {fmt(tail)}; correlation with the route "
                f"mismatch over the steps {fmt(r)}",
                {"mean": tail, "correlation": r},
            )
        )
    return Outcome(average >= ROUTE_MISMATCH and not replayed, tuple(evidence))


# --- 8. learner steps with nothing to train on --------------------------------------


def empty_steps(run: RunData) -> Outcome:
    """Steps that logged ``system/empty_step`` 1: every trajectory of the step was rejected
    (its reward failed or was excluded), so no weight moved. Detected on any such step — it
    is a count, not a trend: each one is a step the run's length overstates."""
    (flags,), needs = wanted_traces(
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
            steps_of(flags),
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
        agree = mean(values_of(position))
        first = trace(run.records, "judge/first_preferred_frac")
        shown = f"; the first shown preferred in {fmt(mean(values_of(first)))}" if first else ""
        text = (
            f"pairs shown both ways agree in {fmt(agree)} (biased below "
            f"{POSITION_AGREEMENT_MIN}){shown}"
        )
        evidence.append(
            Evidence("judge/position_agreement", steps_of(position), text, {"mean": agree})
        )
        detected |= agree < POSITION_AGREEMENT_MIN
    if len(length) >= JUDGE_STEPS:
        corr = mean(values_of(length))
        evidence.append(
            Evidence(
                "judge/length_corr",
                steps_of(length),
                f"score–length correlation at equal verifier outcome "
                f"{fmt(corr)} (biased at |r| >= {LENGTH_CORR_MAX})",
                {"mean": corr},
            )
        )
        detected |= abs(corr) >= LENGTH_CORR_MAX
    return Outcome(detected, tuple(evidence))
