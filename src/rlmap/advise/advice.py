"""``rlmap advise``: the six questions, then the selection table's answer for a task.

The recipe map's selection table (一张选择表) gives seven task conditions, each with
the baseline to establish first, the next change to try and what must not be
ignored; :mod:`rlmap.recipes.selection` holds it as data. :func:`advise` answers the
six questions in order and composes one config:

1. the base: the most specific matching row that names a recipe
   (``BASE_PRECEDENCE``), or, when no such row applies, a fallback decided by the
   first two questions (``FALLBACKS``, marked as not from the table);
2. the task's own settings: multi-turn → the calculator tool task, and the verifier;
3. the overrides of the rows that qualify any recipe (rows 4 and 5: they say how
   to run, not which recipe).

"First" is the easiest baseline to establish and interpret, not a verdict (the
table's own footnote). Everything here is pure (the interactive prompt is
:mod:`rlmap.advise.prompts`); the CLI prints :func:`render` and writes :func:`config_yaml`
(:func:`write_config`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlmap import correction, estimators, reduction
from rlmap.assembly.available import refuse_unavailable
from rlmap.core.errors import ConfigError
from rlmap.recipes.build import build_config
from rlmap.recipes.config import RecipeConfig, apply_overrides
from rlmap.recipes.explain import composition
from rlmap.recipes.selection import (
    BASE_PRECEDENCE,
    FALLBACKS,
    TABLE,
    Row,
    TaskProfile,
)
from rlmap.runs.rundir import write_new_text

DISCLAIMER = (
    '"First" means the baseline that is easiest to establish and to interpret; it is not a '
    "verdict and does not spare the experimental comparison (compare at equal generated "
    "tokens, budget/generated_tokens, over several seeds)."
)


@dataclass(frozen=True)
class Feedback:
    """What a verifier kind means for question 1, and how rlmap is set up for it."""

    answer: str
    reason: str
    overrides: tuple[str, ...]
    note: str = ""
    """What rlmap lacks for this kind, if anything."""


FEEDBACK: dict[str, Feedback] = {
    "exact": Feedback(
        "a deterministic outcome verifier (exact match)",
        "reliable as far as its spec and parser are: an incomplete spec or a parser error is "
        "learned as faithfully as the task",
        ("feedback.verifier=exact_match",),
    ),
    "math": Feedback(
        "a deterministic outcome verifier (math answer equivalence, math-verify)",
        "parser errors and equivalent forms are the risk: check rewarded samples by hand",
        ("feedback.verifier=math_equiv",),
    ),
    "code": Feedback(
        "a deterministic outcome verifier (code tests in a sandbox)",
        "test loopholes and sandbox failures are the risk; an infrastructure failure is not "
        "a zero reward",
        ("feedback.verifier=code_tests",),
    ),
    "reward-model": Feedback(
        "a learned reward model",
        "distribution shift and reward hacking are the risk: keep a held-out verifier or "
        "human review beside it",
        ("feedback.source=reward_model",),
    ),
    "none": Feedback(
        "no verifier: the reward is an environment's return",
        "with an unreliable reward any optimiser only exploits its loopholes faster: first "
        "build held-out checks, human review, an error taxonomy, isolated infrastructure "
        "failures",
        ("feedback.source=environment",),
    ),
}

MULTI_TURN_TASK = ("data.task=calculator",)
"""rlmap's built-in multi-turn task (a calculator tool); replace it with your own."""

SEGMENTS = "data.context_policy=truncate_oldest"
UNSEGMENTED = (
    "a learned reward model scores the whole episode, which segments would let outgrow its "
    "context: data.context_policy stays fail, so each turn's context must still fit"
)
"""Row 7's segments and a reward model: the one pair of its advice that cannot train."""


@dataclass(frozen=True)
class Answer:
    """One of the six questions, answered for a task."""

    question: str
    answer: str
    reason: str


@dataclass(frozen=True)
class Advice:
    """The six answers, the table rows that apply and the baseline's config."""

    profile: TaskProfile
    answers: tuple[Answer, ...]
    """The six questions, in order."""
    rows: tuple[Row, ...]
    """The table rows whose condition holds, in table order."""
    base: Row
    """The row (or fallback) whose baseline the config sets up."""
    recipe: str
    overrides: tuple[str, ...]
    config: RecipeConfig
    """The validated config of the baseline."""
    refused: str | None
    """Why ``rlmap train`` would refuse the baseline here (its own check); None: it trains."""
    closest: tuple[str, tuple[str, ...]] | None
    """(recipe, overrides) of the closest trainable baseline when ``refused``: the baseline
    without the override of the refused field; None when that does not train either."""
    notes: tuple[str, ...] = ()


def advise(profile: TaskProfile) -> Advice:
    """Walk the six questions and the selection table for ``profile``."""
    rows = tuple(row for row in TABLE if row.applies(profile))
    base = _base_row(rows, profile)
    assert base.preset is not None
    feedback = FEEDBACK[profile.verifier]
    overrides = _last_wins(
        base.overrides,
        MULTI_TURN_TASK if profile.multi_turn else (),
        feedback.overrides,
        *(row.overrides for row in rows if row.preset is None),
    )
    notes: tuple[str, ...] = (feedback.note,) if feedback.note else ()
    if "feedback.source=reward_model" in overrides and SEGMENTS in overrides:
        overrides = tuple(o for o in overrides if o != SEGMENTS)
        notes += (UNSEGMENTED,)
    config = build_config(base.preset, None, overrides)
    refused = _refusal(config)
    closest = None if refused is None else _closest_trainable(base.preset, overrides, refused)
    answers = tuple(Answer(q.text, *q.answer(profile, config)) for q in QUESTIONS)
    return Advice(
        profile, answers, rows, base, base.preset, overrides, config, refused, closest, notes
    )


def _base_row(rows: tuple[Row, ...], profile: TaskProfile) -> Row:
    by_number = {row.number: row for row in rows}
    for number in BASE_PRECEDENCE:
        if number in by_number:
            return by_number[number]
    return next(row for row in FALLBACKS if row.applies(profile))


def _last_wins(*groups: Iterable[str]) -> tuple[str, ...]:
    """Dotted overrides with one entry per key: the last value, at the first position."""
    merged: dict[str, str] = {}
    for group in groups:
        for item in group:
            merged[item.partition("=")[0]] = item
    return tuple(merged.values())


def _refusal(config: RecipeConfig) -> str | None:
    """The one-line reason ``rlmap train`` would refuse ``config`` (same check), or None."""
    try:
        refuse_unavailable(config)
    except ConfigError as exc:
        return str(exc)
    return None


def _closest_trainable(
    recipe: str, overrides: tuple[str, ...], refused: str
) -> tuple[str, tuple[str, ...]] | None:
    """The baseline without the override of the field ``refused`` names (a refusal names its
    field first), checked the same way; None when no override is to blame or it is refused
    too. Derived from the refusal rather than from a list of what rlmap lacks, which would
    go stale as rlmap grows."""
    field = refused.partition(":")[0]
    kept = tuple(o for o in overrides if o.partition("=")[0] != field)
    if kept == overrides:
        return None
    try:
        trains = _refusal(build_config(recipe, None, kept)) is None
    except ConfigError:  # the rest no longer validates without it
        trains = False
    return (recipe, kept) if trains else None


def emit_config(profile: TaskProfile) -> dict[str, Any]:
    """The baseline as a config mapping: its preset under ``recipe`` and the overrides
    as nested sections (what ``build_config``/``load_config`` read)."""
    return _config_mapping(advise(profile))


def _config_mapping(advice: Advice) -> dict[str, Any]:
    return {"recipe": advice.recipe, **apply_overrides({}, advice.overrides)}


def config_yaml(advice: Advice) -> str:
    """The emitted config file: a commented header, then ``recipe:`` and its overrides."""
    base = advice.base
    where = (
        f"row {base.number} of the selection table"
        if base.number
        else ("a fallback (no table row names a recipe)")
    )
    lines = [
        f"rlmap advise: the baseline to establish first, from {where} "
        f"({base.condition}): {base.baseline}.",
        f"Next change to try: {base.next_change}.",
    ]
    lines += _refusal_lines(advice)
    lines += [*advice.notes, DISCLAIMER]
    wrapped = [part for line in lines for part in textwrap.wrap(line, 86, break_on_hyphens=False)]
    header = "".join(f"# {line}\n" for line in wrapped)
    return header + yaml.safe_dump(_config_mapping(advice), sort_keys=False, allow_unicode=True)


def write_config(advice: Advice, path: Path, *, force: bool = False) -> None:
    """``--emit-config``: :func:`config_yaml` into ``path``, atomically. An existing file
    is refused unless ``force``, and only a regular file is ever replaced; a directory,
    a missing parent or a failed write is an InputError naming the path."""
    write_new_text(Path(path), config_yaml(advice), force=force)


def _refusal_lines(advice: Advice) -> list[str]:
    """Why ``rlmap train`` would refuse the baseline, and the closest one it trains."""
    if advice.refused is None:
        return []
    lines = [f"Not trainable here: {advice.refused}."]
    if advice.closest is not None:
        lines.append(f"Closest trainable baseline: {_train_command(*advice.closest)}")
    return lines


def _train_command(recipe: str, overrides: Iterable[str]) -> str:
    return " ".join(["rlmap train --recipe", recipe, *overrides])


# --------------------------------------------------------------------------- the six questions

AnswerFn = Callable[[TaskProfile, RecipeConfig], tuple[str, str]]


@dataclass(frozen=True)
class Question:
    """One of the six questions and how a profile (and the chosen config) answers it."""

    text: str
    answer: AnswerFn


def _q_feedback(p: TaskProfile, cfg: RecipeConfig) -> tuple[str, str]:
    f = FEEDBACK[p.verifier]
    return f.answer, f.reason


def _q_sampling(p: TaskProfile, cfg: RecipeConfig) -> tuple[str, str]:
    g = cfg.sampling.group_size
    if g > 1:
        if p.rare_correct:
            why = "correct samples are rare: a larger group more often holds one to compare with"
        else:
            why = "samples are cheap: a group baseline needs no critic, at the price of G "
            why += "rollouts per prompt and a wait for the whole group"
        if p.multi_turn:
            why += "; a group compares episodes of one prompt, the same state only at the "
            why += "first turn: sampling.group_scope=turn adds a step baseline over identical "
            why += "observation histories (GiGPO's anchor states), and, where the environment "
            why += "replays, sampling.group_scope=branch draws the G continuations from one "
            why += "replayed state (docs/formulas.md §2.4)"
        return f"G = {g} per prompt, a group baseline", why
    why = "a learned critic shares statistics across states and bootstraps mid-trajectory, "
    why += "at the price of value bias and extra compute"
    if not p.cheap_samples:
        why = "samples are expensive: " + why
    elif p.multi_turn and p.barrier == "severe":
        why = "waiting for a group of agent episodes is the bottleneck: " + why
    return "one trajectory per state, a value critic as the baseline", why


def _q_credit(p: TaskProfile, cfg: RecipeConfig) -> tuple[str, str]:
    c = cfg.credit
    entry = estimators.registry.get(c.estimator)
    if not entry.needs_critic:
        scope = "every action token of the episode" if p.multi_turn else "the response"
        answer = f"{c.estimator}: one advantage per trajectory, broadcast over {scope}"
        why = "a terminal reward broadcast is acceptable here; check length weighting and "
        return answer, why + "reward variance"
    answer = f"{c.estimator} per {c.time_unit} with a value critic (γ = {c.gamma}, λ = {c.lam})"
    if p.long_context:
        why = "contexts exceed the window: credit crosses tools and segments, so one step per "
        return answer, why + "turn; check the observation mask and segment boundaries"
    if p.multi_turn:
        why = "a multi-step trajectory: a true terminal stops bootstrap and trace, a truncation "
        why += "with a final observation still bootstraps"
    else:
        why = "a single sequence: the critic gives a per-token baseline and bootstraps mid-way"
    if p.long_responses:
        why += "; a length-adaptive λ (vapo) means what it says only when length is counted "
        why += "in the GAE's time step"
    return answer, why


def _q_behaviour(p: TaskProfile, cfg: RecipeConfig) -> tuple[str, str]:
    objective = correction.registry.get(cfg.behaviour.objective)
    sources = []
    if p.separate_rollout:
        sources.append("a separate rollout engine (μ), not the learner's π_old")
    if p.moe_routing_mismatch:
        sources.append("an engine whose expert routing differs from training")
    if sources:
        why = "measure κ = π_old/μ before correcting it (ratio/kappa/*): PPO's clip fraction "
        why += "cannot reveal an engine mismatch, nor TIS limit reuse; if κ's tails stay "
        why += "large, drop the tokens of largest (log κ)² over each mini-batch (m2po) or bound "
        why += "the probability gap to μ (dppo_tv in bypass mode); with generation.top_p < 1, "
        why += "replay the kept set (behaviour.replay_sampling_set), or κ carries the top-p mass"
        return "; ".join(sources), why
    name = cfg.behaviour.objective
    if objective.uses_ratio:
        why = f"{name} bounds how far π_θ moves from π_old (ρ)"
    else:
        why = f"{name} is on-policy: one update per batch, no ratio"
    answer = "the learner's own weights, in the same process (μ = π_old up to numerics)"
    return answer, why + "; rlmap still records μ and reports κ"


def _q_reduction(p: TaskProfile, cfg: RecipeConfig) -> tuple[str, str]:
    name = cfg.reduction.name
    why = "pin the denominator and report reward together with response length"
    if p.long_responses:
        why += "; with long responses the unit moves the weight most (compare token_mean)"
    return f"{name}: {reduction.registry.get(name).summary}", why


def _q_system(p: TaskProfile, cfg: RecipeConfig) -> tuple[str, str]:
    waits = "the learner waits for every trajectory of the batch"
    answer = f"{cfg.system.mode}: " + (waits if cfg.system.mode == "sync" else "a queue, no wait")
    if p.barrier == "severe":
        why = "the barrier is severe: profile it first (rollout duration p50/p95/p99, "
        why += "system/learner_wait_s, system/learner_utilisation); asynchrony trades idle "
        why += "time for staleness, queue selection bias and version bookkeeping, it is not free; "
        why += "stale batches are what m2po and dppo_tv's trust region on μ are for"
    else:
        why = "the wait for the slowest trajectory is affordable: keep the barrier, no drift"
    if p.separate_rollout:
        why += "; separate processes drift anyway: record policy versions "
        why += "(system/max_version_lag)"
    why += "; on a GPU, train and roll out in bfloat16 (system.train_dtype=bfloat16 "
    why += "system.rollout_dtype=bfloat16: autocast over float32 master weights and AdamW "
    why += "state) and watch the mismatch it makes (ratio/kappa/*)"
    return answer, why


QUESTIONS: tuple[Question, ...] = (
    Question("Is the feedback reliable?", _q_feedback),
    Question("How many trajectories can each state afford?", _q_sampling),
    Question("How far must credit travel?", _q_credit),
    Question("Which distribution really produces the data?", _q_behaviour),
    Question("In what unit is the loss reduced?", _q_reduction),
    Question("Can the system afford a synchronous barrier, or must it drift?", _q_system),
)


# --------------------------------------------------------------------------------- rendering


def _wrap(text: str, indent: str, hang: int = 2) -> list[str]:
    """``text`` wrapped at 96 columns; continuation lines indented ``hang`` further."""
    following = " " * (len(indent) + hang)
    return textwrap.wrap(
        text, 96, initial_indent=indent, subsequent_indent=following, break_on_hyphens=False
    )


def _field(label: str, text: str) -> list[str]:
    """``label`` in a column of its own, ``text`` wrapped beside it."""
    lines = _wrap(text, " " * 21, hang=0)
    return [f"    {label:<17}{lines[0][21:]}", *lines[1:]]


def render(advice: Advice) -> str:
    """The advice as text: the six answers, the table rows that apply, the baseline."""
    lines = [f"Task: {_describe(advice.profile)}", "", "The six questions, in order:"]
    for i, a in enumerate(advice.answers, 1):
        lines += [f"  {i}. {a.question}", *_wrap(f"→ {a.answer}", "     ")]
        lines += _wrap(f"why: {a.reason}", "       ")
    shown = advice.rows if advice.base in advice.rows else (*advice.rows, advice.base)
    lines += ["", "The selection table:"]
    for row in shown:
        lines += _render_row(row)
    lines += ["", *_render_baseline(advice), "", *_wrap(DISCLAIMER, "", hang=0)]
    return "\n".join(lines) + "\n"


def _render_row(row: Row) -> list[str]:
    label = f"row {row.number}" if row.number else "no row names a recipe (fallback, not the table)"
    lines = _wrap(f"{label}: {row.condition}", "  ")
    lines += _field("first:", row.baseline)
    if row.baseline_in_rlmap:
        lines += _field("", f"in rlmap: {row.baseline_in_rlmap}")
    lines += _field("next change:", row.next_change)
    if row.next_in_rlmap:
        lines += _field("", f"in rlmap: {row.next_in_rlmap}")
    for i, watch in enumerate(row.must_not_ignore):
        lines += _field("must not ignore:" if i == 0 else "", f"{watch.item} — {watch.how}")
    return lines


def _render_baseline(advice: Advice) -> list[str]:
    where = f"row {advice.base.number}" if advice.base.number else "the fallback"
    lines = [f"Baseline to establish first ({where}): {advice.recipe}"]
    lines += _wrap(composition(advice.config), "  ", hang=4)
    lines += _wrap(_train_command(advice.recipe, advice.overrides), "  ", hang=4)
    lines += [line for text in _refusal_lines(advice) for line in _wrap(text, "  ")]
    lines += [line for note in advice.notes for line in _wrap(f"Note: {note}.", "  ")]
    return lines


_FLAG_WORDS = {
    "critic_unstable": "critic unstable",
    "rare_correct": "rare correct samples",
    "moe_routing_mismatch": "MoE routing mismatch",
    "separate_rollout": "separate rollout",
    "long_context": "contexts past the window",
}


def _describe(p: TaskProfile) -> str:
    parts = [
        "multi-turn" if p.multi_turn else "single-turn",
        f"verifier {p.verifier}",
        "cheap samples" if p.cheap_samples else "expensive samples",
        f"responses ~{p.response_length} tokens" if p.response_length else "length unknown",
        f"{p.barrier} barrier",
    ]
    parts += [text for name, text in _FLAG_WORDS.items() if getattr(p, name)]
    return ", ".join(parts)
