"""One rule per symptom of the map: does it show in this run, and on what evidence?

Each rule is a pure function of a :class:`~rlmap.diagnostics.run.RunData` returning an
:class:`~rlmap.diagnostics.symptoms.Outcome`: detected or not, the evidence (metric,
steps, numbers), and the steps where the symptom shows. A rule whose inputs were not
logged says so (``not checked``, naming what it needs) rather than guess. The rules are
:mod:`rlmap.diagnostics.curve_rules`'s, :mod:`rlmap.diagnostics.setup_rules`'s and
:mod:`rlmap.diagnostics.segment_rules`'s (what they share:
:mod:`rlmap.diagnostics.rule_inputs`); here they are registered in the map's order and
applied, with the readings of each interface the map says to check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlmap.core.registry import Registry
from rlmap.diagnostics import symptoms
from rlmap.diagnostics.curve_rules import (
    entropy_collapse,
    late_collapse,
    length_drift,
    reward_up_heldout_down,
    zero_group_loss,
)
from rlmap.diagnostics.rule_inputs import fmt, values_of
from rlmap.diagnostics.run import RunData
from rlmap.diagnostics.segment_rules import segment_credit_cut, segment_state_loss
from rlmap.diagnostics.setup_rules import (
    async_efficiency,
    empty_steps,
    judge_bias,
    moe_route_mismatch,
)
from rlmap.diagnostics.stats import mean, trace, within
from rlmap.diagnostics.symptoms import Check, Evidence, Finding, Outcome, Status, Symptom


@dataclass(frozen=True)
class Rule:
    """A symptom of the map and the function that looks for it."""

    symptom: Symptom
    detect: Callable[[RunData], Outcome]


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
    Rule(symptoms.SEGMENT_STATE_LOSS, segment_state_loss),
    Rule(symptoms.SEGMENT_CREDIT_CUT, segment_credit_cut),
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
    average = mean(values_of(points))
    text = (
        f"{source}, steps {first_step}–{last_step}: {fmt(first)} → {fmt(last)}; "
        f"mean {fmt(average)}, max {fmt(top)} at step {top_step}"
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
