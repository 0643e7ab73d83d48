"""Combination checks: invalid recipes fail before any work, naming the field.

Per-field types are pydantic's job (:mod:`rlmap.recipes.config`); this module
checks what only the whole composition can tell. Component properties (needs a
group, needs a critic, corrects κ, needs L_max) come from the registries, so no
check here branches on a component's name.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from rlmap import correction, estimators, feedback, reduction, sampling
from rlmap.core.errors import ConfigError
from rlmap.core.registry import Registry
from rlmap.feedback import process
from rlmap.recipes import validate_data, validate_feedback, validate_system
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.system_params import SystemParams

Check = Callable[[RecipeConfig], Iterator[str]]


def validate(cfg: RecipeConfig) -> None:
    """Raise :class:`ConfigError` with the first problem found, as one line."""
    _known_components(cfg)
    for check in CHECKS:
        for problem in check(cfg):
            raise ConfigError(problem)


def _known_components(cfg: RecipeConfig) -> None:
    """Unknown names raise UnknownComponentError, prefixed with the field."""
    names: list[tuple[str, Registry[Any], str]] = [
        ("credit.estimator", estimators.registry, cfg.credit.estimator),
        ("behaviour.objective", correction.registry, cfg.behaviour.objective),
        ("reduction.name", reduction.registry, cfg.reduction.name),
        ("sampling.filter", sampling.registry, cfg.sampling.filter),
    ]
    for name in cfg.behaviour.corrections:
        names.append(("behaviour.corrections", correction.corrections, name))
    if cfg.feedback.source == "verifier":
        names.append(("feedback.verifier", feedback.registry, cfg.feedback.verifier))
    if cfg.feedback.source == "process_reward" and cfg.feedback.process_reward is not None:
        names.append(("feedback.process_reward", process.registry, cfg.feedback.process_reward))
    if cfg.feedback.eval_verifier is not None:
        names.append(("feedback.eval_verifier", feedback.registry, cfg.feedback.eval_verifier))
    for field, registry, name in names:
        if name not in registry:
            known = ", ".join(registry.names())
            raise ConfigError(f"{field}: unknown {registry.kind} '{name}'; known: {known}")


_AT_LEAST_ONE = (
    "generation.max_new_tokens",
    "generation.eval_samples",
    "data.train_size",
    "data.eval_size",
    "run.eval_every",
    "run.checkpoint_every",
    "run.keep_checkpoints",
    "kl.horizon",
    "system.worker_prompts",
    "feedback.length_target",
)
"""Counts and intervals: 0 would divide by zero, loop for ever or produce nothing."""

_AT_LEAST_ZERO = (
    "behaviour.max_staleness",
    "behaviour.positive_nll",
    "optim.warmup_steps",
    "optim.weight_decay",
    "model.lora_rank",
    "run.samples",
)
"""Bounds and weights where 0 means "none" and a negative value means nothing (η < 0 would
admit no trajectory ever: the asynchronous loop would wait for ever)."""

_POSITIVE = (
    "generation.temperature",
    "optim.critic_lr",
    "optim.max_grad_norm",
    "behaviour.tis_cap",
    "behaviour.decoupled_cap",
    "behaviour.sapo_tau_pos",
    "behaviour.sapo_tau_neg",
    "credit.c_bar",
    "credit.rho_bar_pg",
    "model.lora_alpha",
)
"""Scales and caps that are divided by or clip at their value, so 0 is meaningless.
``generation.temperature`` is among them: the learner scores tokens under π_θ^{1/T}, which
T = 0 makes undefined (logits / 0), and greedy samples are not draws from π: a group's
G greedy samples are identical: nothing for a policy gradient to learn from."""


_WHY = {
    "generation.temperature": (
        " (the learner scores tokens under softmax(z/T), undefined at T = 0, and greedy "
        "samples are not draws from π: a group's G samples would all be the same)"
    ),
    "behaviour.max_staleness": " (η = 0 admits only trajectories of the current version)",
}


def _field(cfg: RecipeConfig, dotted: str) -> Any:
    section, name = dotted.split(".")
    return getattr(getattr(cfg, section), name)


def _bounds(cfg: RecipeConfig) -> Iterator[str]:
    """Every number finite; counts >= 1, bounds >= 0, scales > 0 (None means unset)."""
    yield from _finite(cfg)
    rules = (
        (_AT_LEAST_ONE, lambda v: v >= 1, "must be >= 1"),
        (_AT_LEAST_ZERO, lambda v: v >= 0, "must be >= 0"),
        (_POSITIVE, lambda v: v > 0, "must be > 0"),
    )
    for fields, ok, rule in rules:
        for dotted in fields:
            value = _field(cfg, dotted)
            if value is not None and not ok(value):
                yield f"{dotted}: {rule}, got {value}{_WHY.get(dotted, '')}"
    top_p = cfg.generation.top_p
    if not 0 < top_p <= 1:
        yield f"generation.top_p: must be in (0, 1], got {top_p}"
    if not 0 < cfg.system.engine_memory <= 1:
        yield f"system.engine_memory: must be in (0, 1], got {cfg.system.engine_memory}"
    elif cfg.system.engine != "vllm" and cfg.system.engine_memory != SystemParams.engine_memory:
        yield (
            "system.engine_memory: only the vLLM engine reserves memory; it changes nothing "
            f"with system.engine={cfg.system.engine}"
        )
    t = cfg.generation.temperature
    if cfg.system.engine == "vllm" and (0 < t < 0.01 or t > 2):
        yield (
            f"generation.temperature: {t} is outside what vLLM samples at as given "
            "(below 0.01 it raises it to 0.01, above 2 it refuses); use a value in "
            "[0.01, 2]"
        )
    b = cfg.behaviour
    for low, high in (("icepop_low", "icepop_high"), ("masked_is_low", "masked_is_high")):
        lo, hi = getattr(b, low), getattr(b, high)
        if not 0 <= lo < hi:
            yield f"behaviour.{low}: needs 0 <= {low} < {high}, got {lo} and {hi}"


def _finite(cfg: RecipeConfig) -> Iterator[str]:
    """A NaN passes every comparison (``nan <= 0`` is False), so it is refused first."""
    for section in type(cfg).model_fields:
        values = getattr(cfg, section)
        if not dataclasses.is_dataclass(values):
            continue
        for f in dataclasses.fields(values):
            value = getattr(values, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                yield f"{section}.{f.name}: must be a finite number, got {value}"


def _group(cfg: RecipeConfig) -> Iterator[str]:
    g = cfg.sampling.group_size
    for field in ("group_size", "prompts_per_step", "max_rounds"):
        if getattr(cfg.sampling, field) < 1:
            yield f"sampling.{field}: must be >= 1, got {getattr(cfg.sampling, field)}"
    if estimators.registry.get(cfg.credit.estimator).needs_group and g < 2:
        yield (
            f"sampling.group_size: estimator '{cfg.credit.estimator}' needs a group of "
            f"G >= 2 to form its baseline, got {g}"
        )
    if sampling.registry.get(cfg.sampling.filter).needs_group and g < 2:
        yield (
            f"sampling.filter: '{cfg.sampling.filter}' keeps groups whose rewards differ, "
            f"which needs G >= 2, got {g}"
        )


def _group_scope(cfg: RecipeConfig) -> Iterator[str]:
    """``sampling.group_scope=turn`` (GiGPO, docs/formulas.md §2.4) needs later turns to group,
    a group estimator that takes a second baseline, and γ counted in turns; ω means
    nothing without it. G >= 2 is :func:`_group`'s (every such estimator needs a group)."""
    s, c = cfg.sampling, cfg.credit
    if s.group_scope == "branch":
        yield from _branch(cfg)
    if s.group_scope != "turn":
        if c.step_advantage_weight != estimators.CreditParams.step_advantage_weight:
            yield (
                "credit.step_advantage_weight: only sampling.group_scope=turn has a step "
                "advantage to weigh"
            )
        return
    if not estimators.registry.get(c.estimator).turn_scope:
        takers = [n for n in estimators.registry.names() if estimators.registry.get(n).turn_scope]
        yield (
            f"sampling.group_scope: turn applies the group estimator's baseline over anchor "
            f"states too; credit.estimator '{c.estimator}' has none (use "
            f"{', '.join(takers)})"
        )
    if cfg.data.turn_budget < 2:
        yield (
            f"sampling.group_scope: turn groups the turns of multi-turn episodes, but "
            f"data.task {cfg.data.task!r} with data.max_turns={cfg.data.max_turns} has one "
            "turn per episode (use prompt)"
        )
    if c.step_advantage_weight < 0:
        yield f"credit.step_advantage_weight: must be >= 0, got {c.step_advantage_weight}"
    if c.gamma < 1 and c.time_unit != "turn":
        yield (
            "credit.time_unit: with sampling.group_scope=turn, credit.gamma discounts per "
            f"turn (G_k = Σ γ^(k'−k) r_k'); set credit.time_unit=turn to say so, got "
            f"'{c.time_unit}'"
        )


def _branch(cfg: RecipeConfig) -> Iterator[str]:
    """``sampling.group_scope=branch`` (docs/formulas.md §2.4) continues a root trajectory's
    later state, rebuilt token for token by replaying its actions: it needs later turns, the
    whole context, and G >= 2 continuations to compare. Whether the environment replays is
    its own to say: refused when the first round makes one
    (:func:`rlmap.rollout.branch.branch_groups`)."""
    d = cfg.data
    if d.turn_budget < 2:
        yield (
            f"sampling.group_scope: branch continues a later turn's state, but data.task "
            f"{d.task!r} with data.max_turns={d.max_turns} has one turn per episode (use prompt)"
        )
    if d.context_policy != "fail":
        yield (
            "sampling.group_scope: branch rebuilds a trajectory's context token for token by "
            f"replaying it, which data.context_policy={d.context_policy} cuts into segments "
            "(use fail)"
        )
    if cfg.sampling.group_size < 2:
        yield (
            "sampling.group_size: branch compares G continuations of one state; needs G >= 2, "
            f"got {cfg.sampling.group_size}"
        )


def _critic(cfg: RecipeConfig) -> Iterator[str]:
    needs_critic = estimators.registry.get(cfg.credit.estimator).needs_critic
    if needs_critic and not cfg.critic.enabled:
        yield (
            f"critic.enabled: estimator '{cfg.credit.estimator}' needs a value critic; "
            "set critic.enabled=true or pick a critic-free estimator"
        )
    if cfg.critic.enabled and not needs_critic:
        yield (
            f"critic.enabled: estimator '{cfg.credit.estimator}' gives the critic no targets; "
            "pick a critic estimator (gae, vtrace) or set critic.enabled=false"
        )
    if cfg.critic.pretrain_mc and cfg.critic.warmup_steps < 1:
        yield (
            "critic.pretrain_mc: value pre-training runs during the warm-up, which needs "
            f"critic.warmup_steps >= 1, got {cfg.critic.warmup_steps}"
        )
    if cfg.critic.updates_per_step < 1:
        yield f"critic.updates_per_step: must be >= 1, got {cfg.critic.updates_per_step}"
    if cfg.critic.warmup_steps < 0:
        yield f"critic.warmup_steps: must be >= 0, got {cfg.critic.warmup_steps}"
    if cfg.critic.value_clip <= 0:
        yield f"critic.value_clip: must be > 0, got {cfg.critic.value_clip}"


def _credit(cfg: RecipeConfig) -> Iterator[str]:
    c = cfg.credit
    if not 0.0 <= c.gamma <= 1.0:
        yield f"credit.gamma: must be in [0, 1], got {c.gamma}"
    for field in ("lam", "lam_critic", "lam_policy"):
        value = getattr(c, field)
        if value is not None and not 0.0 <= value <= 1.0:
            yield f"credit.{field}: must be in [0, 1], got {value}"
    if c.std_eps <= 0:
        yield f"credit.std_eps: must be > 0, got {c.std_eps}"
    if c.rho_bar < c.c_bar:
        yield f"credit.rho_bar: V-trace needs ρ̄ >= c̄, got ρ̄={c.rho_bar} < c̄={c.c_bar}"
    if c.adaptive_alpha is not None:
        if c.adaptive_alpha <= 0:
            yield f"credit.adaptive_alpha: must be > 0, got {c.adaptive_alpha}"
        unit = c.length_unit or c.time_unit
        if unit != c.time_unit and not c.allow_length_unit_mismatch:
            yield (
                f"credit.length_unit: length-adaptive λ counts length in '{unit}' steps but "
                f"GAE steps by '{c.time_unit}'; λ = 1 - 1/(α·l) only has its meaning when "
                "both agree (set credit.allow_length_unit_mismatch=true to insist)"
            )
        if c.lam_policy is not None:
            yield ("credit.lam_policy: set either a fixed lam_policy or adaptive_alpha, not both")


def _behaviour(cfg: RecipeConfig) -> Iterator[str]:
    correction.check_behaviour(cfg.behaviour, cfg.kl)  # the axis's own checks
    b = cfg.behaviour
    on_policy = not correction.registry.get(b.objective).uses_ratio
    updates = cfg.optim.epochs_per_batch * cfg.optim.minibatches_per_epoch
    if on_policy and updates > 1:
        yield (
            f"behaviour.objective: '{b.objective}' has no importance ratio, so the "
            f"{updates - 1} updates after the first on each batch would be off-policy; "
            "use one update per batch or a ratio objective"
        )
    if b.routing_replay and cfg.system.engine == "vllm":
        # vLLM 0.32 returns routes (enable_return_routed_experts) from its V2 model runner
        # only, which needs Triton: its CPU build refuses it; not yet tried on a GPU.
        yield (
            "behaviour.routing_replay: the vLLM engine does not hand rlmap its expert "
            "routes yet (R3 replays the routes the engine took; vLLM 0.32 returns them only "
            "from its V2 model runner, which needs Triton); use system.engine=hf"
        )


def _replay(cfg: RecipeConfig) -> Iterator[str]:
    """Top-p kept-set replay: something to replay, and an engine that records it."""
    b = cfg.behaviour
    if b.sampling_set_cap < 1:
        yield f"behaviour.sampling_set_cap: must be >= 1, got {b.sampling_set_cap}"
    if not b.replay_sampling_set:
        return
    if cfg.generation.top_p >= 1:
        yield (
            "behaviour.replay_sampling_set: generation.top_p = 1 keeps the whole "
            "vocabulary, so there is no kept set to replay; set generation.top_p < 1 or "
            "leave it off"
        )
    if cfg.system.engine == "vllm" and not torch.cuda.is_available():
        # vLLM 0.32 returns sets (return_sampling_mask) from its V2 model runner only, which
        # needs Triton: its CPU build refuses it (tried: "Model Runner V2 requires Triton").
        yield (
            "behaviour.replay_sampling_set: vLLM's CPU build cannot return kept sets "
            "(return_sampling_mask needs its V2 model runner, which needs Triton); use "
            "system.engine=hf"
        )


def _kl(cfg: RecipeConfig) -> Iterator[str]:
    if cfg.kl.placement != "none" and cfg.kl.beta <= 0:
        yield f"kl.beta: must be > 0 when kl.placement is '{cfg.kl.placement}', got {cfg.kl.beta}"


def _reduction(cfg: RecipeConfig) -> Iterator[str]:
    reduction.check_params(cfg.reduction)  # the axis's own checks (L_max present, >= 1)
    r = cfg.reduction
    longest = cfg.generation.max_new_tokens * cfg.data.turn_budget
    if r.max_len is not None and r.max_len < longest:
        yield (
            f"reduction.max_len: {r.max_len} is below generation.max_new_tokens="
            f"{cfg.generation.max_new_tokens} × data.max_turns={cfg.data.turn_budget}; "
            "a response could exceed the fixed budget"
        )


CHECKS: tuple[Check, ...] = (
    _bounds,
    _group,
    _group_scope,
    _critic,
    _credit,
    _behaviour,
    _replay,
    _kl,
    _reduction,
    validate_feedback.check_feedback,
    validate_data.curriculum,  # before data: data.task_args holds the curriculum's top level
    validate_data.rebalance,
    validate_data.data,
    validate_data.context_policy,
    validate_data.lora,
    validate_system.loggers,
    validate_system.system,
    validate_system.optim,
)
