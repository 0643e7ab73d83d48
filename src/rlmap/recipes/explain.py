"""Recipes written out in full: the one-line composition and the axis-by-axis explanation.

The composition names every choice that changes the update: one component per axis, the
system's engine and backend, and — only where they leave the defaults, so that a preset's
line stays short — data-parallel learners and their sharding, bfloat16 passes, and LoRA
(rank, scale, target modules). ``rlmap compare`` sets runs side by side by this line.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from rlmap import correction, estimators, feedback, reduction, sampling
from rlmap.core.errors import UnknownComponentError
from rlmap.correction.params import BehaviourParams
from rlmap.recipes.catalog import registry
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.system_params import SystemParams


def _feedback(cfg: RecipeConfig) -> str:
    f = cfg.feedback
    text = f"{f.source}({f.verifier})" if f.source == "verifier" else f.source
    if f.overlong_cache is not None:
        text += f" + soft overlong punishment (L_c={f.overlong_cache})"
    return text


def _sampling(cfg: RecipeConfig) -> str:
    s = cfg.sampling
    text = f"G={s.group_size} per prompt" if s.group_size > 1 else "single rollout per prompt"
    if s.group_scope == "turn":
        text += " + turn groups (anchor states: equal observation histories)"
    if s.group_scope == "branch":
        text += " + branch groups (G continuations of one replayed state: a root's turn k ~ U)"
    if sampling.registry.get(s.filter).needs_group:
        text += f" + {s.filter}-group dynamic sampling (≤{s.max_rounds} rounds)"
    if s.curriculum:
        text += (
            f" + curriculum (levels {s.curriculum_start}→{s.curriculum_top}: up at a pass "
            f"rate ≥ {s.curriculum_up:g}, down ≤ {s.curriculum_down:g}, "
            f"over {s.curriculum_window})"
        )
    if s.rebalance:
        text += (
            f" + rebalancing (stale after {s.rebalance_after} uniform visits, kept "
            f"{s.rebalance_keep:g}; a pass rate ≤ {s.rebalance_rare:g} drawn again)"
        )
    return text


def _credit(cfg: RecipeConfig) -> str:
    text = _estimator(cfg)
    how = {
        "truncate_oldest": "oldest whole turns dropped",
        "compact": f"the policy's summary of ≤ {cfg.data.summary_tokens} tokens carried, trained",
    }.get(cfg.data.context_policy)
    if how is not None:
        bootstrap = "bootstraps V(next segment)" if _needs_critic(cfg) else "episode return"
        text += f" + segments past the window ({how}; a boundary is a truncation: {bootstrap})"
    return text


def _needs_critic(cfg: RecipeConfig) -> bool:
    return estimators.registry.get(cfg.credit.estimator).needs_critic


def _estimator(cfg: RecipeConfig) -> str:
    c = cfg.credit
    entry = estimators.registry.get(c.estimator)
    if not entry.needs_critic and cfg.sampling.group_scope == "turn":
        return (
            f"{c.estimator} advantage, GiGPO A = A_episode + {c.step_advantage_weight:g}·"
            f"A_step (γ={c.gamma:g} per turn)"
        )
    if not entry.needs_critic:
        return f"{c.estimator} advantage"
    lam_c = c.lam if c.lam_critic is None else c.lam_critic
    if c.adaptive_alpha is not None:
        lam_p = f"1-1/({c.adaptive_alpha}·l_{c.length_unit or c.time_unit})"
    else:
        lam_p = str(c.lam if c.lam_policy is None else c.lam_policy)
    lams = f"λ={lam_c}" if lam_p == str(lam_c) else f"λ_critic={lam_c}, λ_policy={lam_p}"
    return f"value critic + {c.estimator}(γ={c.gamma}, {lams}, per {c.time_unit})"


def _call(name: str, section: Any, fields: tuple[str, ...], *extra: str) -> str:
    args = [f"{f}={getattr(section, f)}" for f in fields if getattr(section, f) is not None]
    return f"{name}({', '.join([*args, *extra])})"


def _behaviour(cfg: RecipeConfig) -> str:
    b = cfg.behaviour
    objective = correction.registry.get(b.objective)
    mode = (b.mode,) if objective.uses_ratio else ()
    text = _call(b.objective, b, objective.params, *mode)
    for name in b.corrections:
        text += " + " + _call(name, b, correction.corrections.get(name).params)
    if b.positive_nll > 0:
        text += f" + positive NLL μ={b.positive_nll}"
    k = cfg.kl
    if k.placement == "none":
        return text + " + no KL"
    return text + f" + KL {k.estimator} in {k.placement} β={k.beta}"


def _reduction(cfg: RecipeConfig) -> str:
    r = cfg.reduction
    return r.name if r.max_len is None else f"{r.name}(L_max={r.max_len})"


def _system(cfg: RecipeConfig) -> str:
    s, default = cfg.system, SystemParams()
    text = "synchronous group barrier" if s.mode == "sync" else "asynchronous queue"
    if s.partial_rollout:
        text += " + partial rollout"
    where: list[str] = [s.engine, s.backend]
    if s.learners > 1:  # one learner shards nothing: its sharding is not shown
        where.append(f"{s.learners} {s.learner_sharding} learners")
    if (s.train_dtype, s.rollout_dtype) != (default.train_dtype, default.rollout_dtype):
        where.append(f"train {s.train_dtype} / rollout {s.rollout_dtype}")
    return text + f" ({', '.join(where)})"


def _adapters(cfg: RecipeConfig) -> str | None:
    """LoRA when on: only the adapters train, so the update is another one; None: full
    fine-tuning (the default)."""
    m = cfg.model
    if not m.lora_rank:
        return None
    return f"LoRA r={m.lora_rank}, α={m.resolved_lora_alpha:g} on {','.join(m.lora_modules)}"


AXES = (
    ("1 feedback", "feedback", _feedback),
    ("2 sampling", "sampling", _sampling),
    ("3 credit", "credit", _credit),
    ("4 behaviour", "behaviour", _behaviour),
    ("5 reduction", "reduction", _reduction),
    ("6 system", "system", _system),
)


def composition(cfg: RecipeConfig) -> str:
    """The recipe's full name: one component per axis, then LoRA when on, joined with ' · '."""
    parts = [describe(cfg) for _, _, describe in AXES]
    adapters = _adapters(cfg)
    return " · ".join(parts if adapters is None else [*parts, adapters])


def _get(cfg: RecipeConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def scaled(name: str) -> list[tuple[str, Any, Any]]:
    """(field, paper value, preset value) for each quoted value the preset changed."""
    entry, cfg = registry.get(name), registry.get(name).build()
    return [
        (q.field, q.value, _get(cfg, q.field))
        for q in entry.quotes
        if q.field is not None and _get(cfg, q.field) != q.value
    ]


def _fields(section: Any) -> str:
    pairs = [f"{f.name}={getattr(section, f.name)!r}" for f in dataclasses.fields(section)]
    return textwrap.fill(" ".join(pairs), width=96, initial_indent="    ", subsequent_indent="    ")


def _component_note(section: str, cfg: RecipeConfig) -> str:
    lookup = {
        "feedback": lambda: (
            feedback.registry.get(cfg.feedback.verifier).summary
            if cfg.feedback.source == "verifier"
            else f"{cfg.feedback.source} feedback"
        ),
        "sampling": lambda: sampling.registry.get(cfg.sampling.filter).summary,
        "credit": lambda: estimators.registry.get(cfg.credit.estimator).summary,
        "behaviour": lambda: correction.registry.get(cfg.behaviour.objective).summary,
        "reduction": lambda: reduction.registry.get(cfg.reduction.name).summary,
        "system": lambda: "",
    }
    return lookup[section]()


COMPONENTS: tuple[tuple[str, str, Any], ...] = (
    ("1 feedback", "feedback.verifier", feedback.registry),
    ("2 sampling", "sampling.filter", sampling.registry),
    ("3 credit", "credit.estimator", estimators.registry),
    ("4 behaviour", "behaviour.objective", correction.registry),
    ("4 behaviour", "behaviour.corrections", correction.corrections),
    ("4 behaviour", "kl.estimator", correction.kl_estimators),
    ("5 reduction", "reduction.name", reduction.registry),
)
"""Where each axis's registered components are chosen: (axis, config field, registry)."""


def component(name: str, field: str | None = None) -> str | None:
    """The cards of every registered component called ``name`` (only the one chosen by
    ``field``, e.g. ``behaviour.objective``, when given): axis, how to choose it, its formula
    in a line, paper and anchor code, and the fields it reads with their defaults; None when
    no registry has it."""
    cards = [
        _card(name, axis, where, reg.get(name))
        for axis, where, reg in COMPONENTS
        if name in reg and field in (None, where)
    ]
    return "\n\n".join(cards) if cards else None


def _card(name: str, axis: str, field: str, entry: Any) -> str:
    choose = f"{field}=[{name}]" if field == "behaviour.corrections" else f"{field}={name}"
    out = [
        f"{name}: {entry.summary}",
        f"axis {axis}, chosen by {choose} (e.g. rlmap train --recipe grpo {choose})",
    ]
    for label in ("paper", "code"):
        if getattr(entry, label, ""):
            out.append(f"{label}: {getattr(entry, label)}")
    defaults = BehaviourParams()
    reads = [f"behaviour.{f}={getattr(defaults, f)!r}" for f in getattr(entry, "params", ())]
    if reads:
        out.append("reads (defaults): " + " ".join(reads))
    return "\n".join(out)


def _component_or_refuse(name: str, field: str) -> str:
    card = component(name, field or None)
    if card is not None:
        return card
    if not field:
        presets = ", ".join(registry.names())
        raise UnknownComponentError(
            f"unknown recipe or component {name!r}; presets: {presets} (components: rlmap papers)"
        )
    fields = {where: reg for _, where, reg in COMPONENTS}
    if field not in fields:
        raise UnknownComponentError(
            f"{field}: not a field that chooses a component; one of {', '.join(fields)}"
        )
    raise UnknownComponentError(
        f"{field}: no component called {name!r}; known: {', '.join(fields[field].names())}"
    )


def explain(name: str) -> str:
    """Axis by axis: component, hyper-parameters, paper, and values scaled for the default.
    ``name`` is a preset, or a registered component (``dppo_kl``, ``m2po``; ``field=name``
    picks one where two axes share a name): then its card (:func:`component`)."""
    field, _, short = name.rpartition("=")
    if field or name not in registry:
        return _component_or_refuse(short, field)
    entry = registry.get(name)
    cfg = entry.build()
    out = [f"{name}: {entry.summary}", f"paper: {entry.paper}", ""]
    for label, section, describe in AXES:
        note = _component_note(section, cfg)
        out.append(f"{label:<12} {describe(cfg)}" + (f"  — {note}" if note else ""))
        out.append(_fields(getattr(cfg, section)))
        if section == "credit":
            out.append("    critic: " + _fields(cfg.critic).strip())
        if section == "behaviour":
            out.append("    kl: " + _fields(cfg.kl).strip())
    out += ["", "quoted from the paper:"]
    out += [f"  - {q.text}" for q in entry.quotes] or ["  (no hyper-parameters quoted)"]
    rows = scaled(name)
    out += ["", "scaled for the embedded default (paper → preset):"]
    out += [f"  - {field}: {paper!r} → {ours!r}" for field, paper, ours in rows] or ["  (none)"]
    if entry.note:
        out += ["", f"note: {entry.note}"]
    out += [
        f"the component {name!r} too: rlmap explain {where}={name}"
        for _, where, reg in COMPONENTS
        if name in reg
    ]
    return "\n".join(out)
