"""The symptoms that show on the learning curves: the reward rises while the held-out score
falls, entropy collapses, group losses are zero, length drifts, a late collapse.

Each rule is a pure function of a :class:`~rlmap.diagnostics.run.RunData` returning an
:class:`~rlmap.diagnostics.symptoms.Outcome` (:mod:`rlmap.diagnostics.rules` registers it).
Thresholds are the named constants below; each says why it sits where it does. They were set
so that the healthy embedded runs (GRPO, RLOO, token- and turn-level PPO, VAPO on the
calculator task, 100 steps) stay quiet with margin. docs/diagnose.md lists every rule with
its inputs and thresholds.
"""

from __future__ import annotations

import math
from typing import Any

from rlmap.diagnostics.rule_inputs import (
    MIN_EVALS,
    MIN_POINTS,
    TREND_T,
    WINDOW,
    fmt,
    shift_values,
    steps_of,
    values_of,
    wanted_traces,
)
from rlmap.diagnostics.run import RunData
from rlmap.diagnostics.stats import Point, correlation, mean, rolling, shift, step_noise, trace
from rlmap.diagnostics.symptoms import Evidence, Outcome

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


# --- 1. reward rises while held-out ability falls ----------------------------------


def reward_up_heldout_down(run: RunData) -> Outcome:
    """Held-out pass@1 ends clearly below its best evaluation (HELDOUT_DROP, HELDOUT_DROP_REL)
    while the trained reward, from that best evaluation to the end, rises (t >= TREND_T)."""
    (held, reward), needs = wanted_traces(
        run, ("eval/pass@1", MIN_EVALS), ("reward/mean", MIN_POINTS)
    )
    if needs:
        return Outcome(False, needs=needs)
    best_step, best = max(held, key=lambda p: (p[1], -p[0]))  # the earliest best
    last_step, last = held[-1]
    drop, needed = best - last, max(HELDOUT_DROP, HELDOUT_DROP_REL * best)
    text = (
        f"held-out pass@1: best {fmt(best)} at step {best_step}, last {fmt(last)} at step "
        f"{last_step}, a drop of {fmt(drop)} (a fall is >= {fmt(needed)})"
    )
    values = {"best": best, "best_step": best_step, "last": last, "drop": drop}
    evidence = [Evidence("eval/pass@1", steps_of(held), text, values)]
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
    evidence.append(Evidence("reward/mean", steps_of(after), text, shift_values(rise)))
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
        f"the training verifier accepts {fmt(end)} more of the held-out samples than the "
        f"held-out verifier over the last evaluations (steps {tail[0][0]}-{tail[-1][0]}), "
        f"{fmt(start)} at step {gaps[0][0]} (reward hacking shows as >= {fmt(HACK_GAP)})"
    )
    values = {"gap_start": start, "gap_end": end}
    evidence = Evidence("eval/train_verifier_pass@1", steps_of(gaps), text, values)
    detected = end >= HACK_GAP and end - start >= HACK_GAP
    return Outcome(detected, (evidence,), window=(tail[0][0], tail[-1][0]))


# --- 2. entropy collapses quickly ---------------------------------------------------


def entropy_collapse(run: RunData) -> Outcome:
    """The rolling-mean entropy falls to ENTROPY_COLLAPSE_FRAC of its start within the first
    ENTROPY_QUICK_FRAC of the run, and is still that low at the end."""
    (entropy,), needs = wanted_traces(run, ("entropy", 3 * WINDOW))
    if needs:
        return Outcome(False, needs=needs)
    first, last = steps_of(entropy)
    start = mean(values_of(entropy[:WINDOW]))
    if start <= 0:
        return Outcome(False, (Evidence("entropy", (first, last), "entropy starts at 0", {}),))
    floor = ENTROPY_COLLAPSE_FRAC * start
    smooth = rolling(entropy, WINDOW)
    end_step, end = smooth[-1]
    text = (
        f"entropy {fmt(start)} (mean of steps {first}–{entropy[WINDOW - 1][0]}) → {fmt(end)} "
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
    (zero,), needs = wanted_traces(run, ("group/zero_adv_frac", WINDOW), why=why)
    if needs:
        return Outcome(False, needs=needs)
    average, late = mean(values_of(zero)), mean(values_of(zero[-(len(zero) // 3) :]))
    often = sum(v >= ZERO_GROUP_FRAC for _, v in zero)
    text = (
        f"groups with zero advantage: {average:.0%} of the groups on average (last third "
        f"{late:.0%}); {ZERO_GROUP_FRAC:.0%} or more on {often} of {len(zero)} steps"
    )
    values = {"mean": average, "last_third_mean": late, "steps_at_or_above": often}
    evidence = [Evidence("group/zero_adv_frac", steps_of(zero), text, values)]
    kept = trace(run.records, "sampling/kept_frac")
    discarded = 1.0 - mean(values_of(kept)) if kept else 0.0
    if discarded > 0:
        text = f"the group filter discarded {discarded:.0%} of the generated trajectories"
        evidence.append(
            Evidence("sampling/kept_frac", steps_of(kept), text, {"discarded": discarded})
        )
    outcome = trace(run.records, "reward/outcome_mean")
    if outcome and all(v == 0 for _, v in outcome):
        text = "no trajectory was ever rewarded: 0 on every step"
        evidence.append(Evidence("reward/outcome_mean", steps_of(outcome), text, {}))
    detected = average >= ZERO_GROUP_FRAC or discarded >= ZERO_GROUP_FRAC
    return Outcome(detected, tuple(evidence))


# --- 4. response length keeps drifting ----------------------------------------------


def length_drift(run: RunData) -> Outcome:
    """Mean length moves by LENGTH_DRIFT_REL or more (first vs last third, |t| >= TREND_T), is
    still moving the same way over the last half, and that is not learning: the trained
    reward no longer rises over the last half, or the truncated fraction grows to
    TRUNCATION_FRAC or more (the length runs into the limit)."""
    wanted = (("length/mean", 2 * MIN_POINTS), ("reward/mean", 2 * MIN_POINTS))
    (length, reward), needs = wanted_traces(run, *wanted)
    if needs:
        return Outcome(False, needs=needs)
    whole, late = shift(length), shift(length[len(length) // 2 :])
    text = (
        f"mean length {whole.describe()} ({whole.relative:+.0%}); over the last half "
        f"{late.describe()}"
    )
    values = shift_values(whole) | {"relative": whole.relative, "last_half_t": late.t}
    evidence = [Evidence("length/mean", steps_of(length), text, values)]
    drifting = abs(whole.relative) >= LENGTH_DRIFT_REL and abs(whole.t) >= TREND_T
    still = late.change * whole.change > 0 and abs(late.t) >= TREND_T
    if not (drifting and still):
        return Outcome(False, tuple(evidence))
    gain, corr = shift(reward[len(reward) // 2 :]), correlation(reward, length)
    text = f"trained reward over the last half {gain.describe()}; reward–length correlation "
    values = {"last_half_t": gain.t, "reward_length_correlation": corr}
    evidence.append(Evidence("reward/mean", steps_of(reward), text + f"{corr:+.2f}", values))
    truncated = trace(run.records, "length/truncated_frac")
    into_limit = False
    if len(truncated) >= MIN_POINTS:
        cut = shift(truncated)
        into_limit = cut.after >= TRUNCATION_FRAC and cut.change > 0
        text = f"truncated fraction {cut.describe()}"
        evidence.append(
            Evidence("length/truncated_frac", steps_of(truncated), text, shift_values(cut))
        )
    return Outcome(gain.t < TREND_T or into_limit, tuple(evidence))


# --- 5. PPO stable at first, then collapses -----------------------------------------


def late_collapse(run: RunData) -> Outcome:
    """The rolling-mean reward peaks no earlier than its (WINDOW+1)-th window (a stable or
    improving start); the reward of the last 2·WINDOW steps is at least COLLAPSE_Z standard
    errors and COLLAPSE_RANGE_FRAC of the rolling mean's range below that peak."""
    (reward,), needs = wanted_traces(run, ("reward/mean", 4 * WINDOW))
    if needs:
        return Outcome(False, needs=needs)
    smooth = rolling(reward, WINDOW)
    peak_at = max(range(len(smooth)), key=lambda i: (smooth[i][1], -i))
    (peak_step, peak), end_step = smooth[peak_at], reward[-1][0]
    end = mean(values_of(reward[-2 * WINDOW :]))
    span = peak - min(values_of(smooth))
    noise = step_noise(values_of(reward)) * math.sqrt(1 / WINDOW + 1 / (2 * WINDOW))
    drop = peak - end
    z = drop / noise if noise > 0 else (math.inf if drop > 0 else 0.0)
    text = (
        f"trained reward: best rolling mean ({WINDOW} steps) {fmt(peak)} at step {peak_step}, "
        f"mean of the last {2 * WINDOW} steps {fmt(end)}; a drop of {fmt(drop)}, z = {z:.1f}, "
        f"{drop / span if span > 0 else 0.0:.0%} of its range"
    )
    values = {"peak": peak, "peak_step": peak_step, "end": end, "drop": drop, "z": z}
    evidence = [Evidence("reward/mean", steps_of(reward), text, values)]
    detected = peak_at >= WINDOW and z >= COLLAPSE_Z and drop >= COLLAPSE_RANGE_FRAC * span
    if not detected:
        return Outcome(False, tuple(evidence))
    held = trace(run.records, "eval/pass@1")
    if len(held) >= 2 and held[-1][0] > peak_step:
        (best_step, best), (last_step, last) = max(held[:-1], key=lambda p: p[1]), held[-1]
        text = f"held-out pass@1 {fmt(best)} at step {best_step} → {fmt(last)} at step {last_step}"
        values = {"before": best, "after": last}
        evidence.append(Evidence("eval/pass@1", (best_step, last_step), text, values))
    before_peak = reward[max(peak_at - WINDOW, 0)][0]  # readings compare before with after
    return Outcome(True, tuple(evidence), window=(before_peak, end_step))
