"""The symptoms of episodes cut into segments (``data.context_policy``, docs/formulas.md
§2.5): a boundary whose next context loses the state, and credit that stops at the
boundaries.

Each rule is a pure function of a :class:`~rlmap.diagnostics.run.RunData` returning an
:class:`~rlmap.diagnostics.symptoms.Outcome` (:mod:`rlmap.diagnostics.rules` registers it).
Both read the last third of the steps: the critic starts untrained, and what they judge is
what it learned. No healthy segmented run with a critic exists yet to set the thresholds on;
they are argued from the quantities themselves and set against the healthy unsegmented
critics (token- and turn-level PPO and VAPO on the calculator task, 100 steps), whose
figures each constant quotes. Unsegmented runs do not log their inputs: not checked.
docs/diagnose.md lists both rules.
"""

from __future__ import annotations

from rlmap.diagnostics.rule_inputs import MIN_POINTS, fmt, steps_of, values_of, wanted_traces
from rlmap.diagnostics.run import RunData
from rlmap.diagnostics.stats import Point, mean, trace, within
from rlmap.diagnostics.symptoms import Evidence, Outcome

GAP_REL = 0.3
"""``critic/segment_value_gap`` (mean |V(s_0^{k+1}) − V̂(s_final^k)|), as a fraction of the
returns' spread (``reward/std``), from which a boundary loses the state. The returns' spread
is the value scale: for a critic that is the expected return given what it reads, the value
given the next (smaller) context is the average of the value given the closing one
(V_cut = E[V_full | cut]), so E[gap²] = Var V_full − Var V_cut ≤ Var R — the gap is at most
std R, and a mean |gap| of 0.3·std R means the dropped context alone explained at least
0.3² = 9% of the return's variance (outcome rewards, γ = 1: V predicts R). Not
``critic/value_error_last``: it measures the critic against sampled returns, whose outcome
noise the gap does not contain (both readings are of one state, nothing sampled between); on
the healthy calculator critics it is 0.25-0.35 of ``reward/std``, so a gap of 0.3 is as large
as the critic's whole error where it is most accurate."""

SEGMENTED_MIN = 1.5
"""Mean ``env/segments`` (rows per episode) from which the boundaries carry much of the
credit: with S̄ rows per episode a share 1 − 1/S̄ of the rows close at a boundary — a third
at 1.5 — and their actions see the outcome only through V(s_0^{k+1})."""

EV_LOW = 0.1
"""Mean ``critic/explained_variance`` at or below which the critic carries (almost) nothing
of the outcome across a boundary: it explains at most a tenth of its targets' variance. The
healthy calculator critics explain 0.32-0.45 over their last third (0.09-0.22 over their
first, while they learn)."""


def _last_third(points: list[Point]) -> list[Point]:
    return points[-max(len(points) // 3, 1) :]


def segment_state_loss(run: RunData) -> Outcome:
    """Over the last third of the steps that logged it, the mean state-sufficiency gap
    (``critic/segment_value_gap``) is at least GAP_REL of the mean ``reward/std`` over the
    same steps. The signed gap's mean is the evidence of what kind of loss it is."""
    why = " (critic recipes on segmented episodes: data.context_policy=truncate_oldest|compact)"
    (gap,), needs = wanted_traces(run, ("critic/segment_value_gap", MIN_POINTS), why=why)
    if needs:
        return Outcome(False, needs=needs)
    late = _last_third(gap)
    window = steps_of(late)
    spread = within(trace(run.records, "reward/std"), *window)
    if not spread:
        return Outcome(False, needs=(f"reward/std on steps {window[0]}–{window[1]}",))
    size, scale = mean(values_of(late)), mean(values_of(spread))
    values = {"mean": size, "reward_std": scale, "relative": size / scale if scale > 0 else 0.0}
    text = (
        f"state-sufficiency gap, steps {window[0]}–{window[1]}: mean |gap| {fmt(size)} = "
        f"{fmt(values['relative'])} of the returns' spread (reward/std {fmt(scale)}); the state "
        f"is lost at >= {GAP_REL}"
    )
    evidence = [Evidence("critic/segment_value_gap", window, text, values)]
    signed = within(trace(run.records, "critic/segment_value_gap_signed"), *window)
    if signed:
        bias = mean(values_of(signed))
        text = (
            f"signed gap: mean {fmt(bias)} — near 0 against |gap|, the next context dropped "
            "what the critic valued (its value there is the average over what was lost); far "
            "from 0, the critic reads the context's form (length, position) and every "
            "boundary's bootstrap is biased by it"
        )
        evidence.append(Evidence("critic/segment_value_gap_signed", window, text, {"mean": bias}))
    return Outcome(scale > 0 and size >= GAP_REL * scale, tuple(evidence), window=window)


def segment_credit_cut(run: RunData) -> Outcome:
    """Over the last third of the steps, episodes have SEGMENTED_MIN rows or more on average
    (``env/segments``) and the critic that carries credit across their boundaries explains
    EV_LOW or less of its targets (``critic/explained_variance``): the trace stops at every
    boundary (§2.5), so the earlier segments' actions barely see the outcome."""
    why = " (critic recipes on segmented episodes)"
    wanted = (("env/segments", MIN_POINTS), ("critic/explained_variance", MIN_POINTS))
    (segments, explained), needs = wanted_traces(run, *wanted, why=why)
    if needs:
        return Outcome(False, needs=needs)
    late = _last_third(explained)
    window = steps_of(late)
    rows = within(segments, *window)
    if not rows:
        return Outcome(False, needs=(f"env/segments on steps {window[0]}–{window[1]}",))
    per_episode, ev = mean(values_of(rows)), mean(values_of(late))
    closing = 1 - 1 / per_episode if per_episode > 0 else 0.0
    text = (
        f"env/segments, steps {window[0]}–{window[1]}: {fmt(per_episode)} rows per episode, "
        f"so {closing:.0%} of the rows close at a boundary (segmented at >= {SEGMENTED_MIN})"
    )
    evidence = [
        Evidence("env/segments", window, text, {"mean": per_episode, "closing": closing}),
        Evidence(
            "critic/explained_variance",
            window,
            f"the critic explains {fmt(ev)} of its targets' variance over the same steps; "
            f"credit crosses a boundary only through it (too little at <= {EV_LOW})",
            {"mean": ev},
        ),
    ]
    detected = per_episode >= SEGMENTED_MIN and ev <= EV_LOW
    return Outcome(detected, tuple(evidence), window=window)
