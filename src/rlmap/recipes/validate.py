"""Combination checks: invalid recipes fail before any work, naming the field.

Per-field types are pydantic's job (:mod:`rlmap.recipes.config`); this module
checks what only the whole composition can tell. Component properties (needs a
group, needs a critic, corrects κ, needs L_max) come from the registries, so no
check here branches on a component's name.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from rlmap import correction, estimators, feedback, reduction, sampling
from rlmap.core.device import SETTING as DEVICE_SETTING
from rlmap.core.errors import ConfigError
from rlmap.core.registry import Registry
from rlmap.experiments import trackers
from rlmap.feedback import process
from rlmap.feedback.params import FeedbackParams
from rlmap.models.lora import TARGET_NAME
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.sections import ModelConfig
from rlmap.simulator.inputs import parse_duration
from rlmap.system.params import SystemParams
from rlmap.tasks.registry import kind_of

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
        yield (
            "sampling.group_scope: 'branch' (G continuations replayed from one state) is not "
            "built yet; use prompt or turn"
        )
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


def _feedback(cfg: RecipeConfig) -> Iterator[str]:
    f = cfg.feedback
    if f.source == "process_reward" and f.process_reward is None:
        yield "feedback.process_reward: feedback.source=process_reward needs a scorer name"
    scorer = f.process_reward if f.source == "process_reward" else None
    if scorer is not None and scorer in process.registry:
        tasks = process.registry.get(scorer).tasks
        if cfg.data.task not in tasks:
            yield (
                f"feedback.process_reward: '{scorer}' reads records that only data.task="
                f"{' or '.join(tasks)} keeps, got data.task={cfg.data.task}"
            )
    for term, weight in (("format_pattern", "format_weight"), ("length_target", "length_weight")):
        value, w = getattr(f, term), getattr(f, weight)
        if (value is None) != (w == 0):
            yield (
                f"feedback.{weight}: goes with feedback.{term} (a term needs a non-zero "
                f"weight), got {term}={value!r}, {weight}={w}"
            )
    if f.format_pattern is not None:
        try:
            re.compile(f.format_pattern)
        except re.error as exc:
            yield f"feedback.format_pattern: not a regular expression ({exc})"
    timeout = cfg.feedback.timeout_s
    if timeout is not None and timeout <= 0:
        yield f"feedback.timeout_s: must be > 0 (or null: in-process), got {timeout}"
    yield from _judge(cfg)
    cache = cfg.feedback.overlong_cache
    if cache is not None and not 0 < cache < cfg.generation.max_new_tokens:
        yield (
            f"feedback.overlong_cache: L_c must be in (0, generation.max_new_tokens="
            f"{cfg.generation.max_new_tokens}), got {cache}"
        )


JUDGE_DEFAULTS = FeedbackParams()


def _judge(cfg: RecipeConfig) -> Iterator[str]:
    f = cfg.feedback
    if f.source not in ("judge", "comparison"):
        for name in (
            x.name
            for x in dataclasses.fields(FeedbackParams)
            if x.name.startswith(("judge_", "comparison"))
        ):
            if getattr(f, name) != getattr(JUDGE_DEFAULTS, name):
                yield (
                    f"feedback.{name}: only a judge uses it (feedback.source=judge or "
                    f"comparison), not feedback.source={f.source}"
                )
                return
        return
    yield from _comparisons(cfg)
    if not f.uses_judge:  # comparisons by the learned reward model
        for name in (
            x.name for x in dataclasses.fields(FeedbackParams) if x.name.startswith("judge_")
        ):
            if getattr(f, name) != getattr(JUDGE_DEFAULTS, name):
                yield (
                    f"feedback.{name}: only an AI judge uses it, not "
                    f"feedback.comparison_model=reward_model"
                )
                return
        return
    pairwise_only = ("comparison", "comparison_model", "comparison_pairs", "judge_position_check")
    for name in pairwise_only if f.source == "judge" else ():
        if getattr(f, name) != getattr(JUDGE_DEFAULTS, name):
            yield (
                f"feedback.{name}: only pairwise comparisons use it "
                f"(feedback.source=comparison), not feedback.source=judge"
            )
    for name in ("judge_min", "judge_max") if f.source == "comparison" else ():
        if getattr(f, name) != getattr(JUDGE_DEFAULTS, name):
            yield (
                f"feedback.{name}: only a pointwise judge rates (feedback.source=judge), "
                f"not feedback.source=comparison"
            )
    s = cfg.system
    if s.backend == "ray" or s.learners > 1:
        where = "system.backend" if s.backend == "ray" else "system.learners"
        yield (
            f"{where}: a judge's requests would be made (and counted) outside the "
            f"learner's process; with feedback.source={f.source} use "
            f"system.backend=inprocess and system.learners=1"
        )
    if f.judge_url is None:
        yield f"feedback.judge_url: feedback.source={f.source} needs the judge's endpoint"
    elif not f.judge_url.startswith(("http://", "https://")):
        yield f"feedback.judge_url: an http(s):// URL ending in /v1, got {f.judge_url!r}"
    if not f.judge_min < f.judge_max:
        yield f"feedback.judge_max: must exceed judge_min={f.judge_min}, got {f.judge_max}"
    for name in ("judge_position_check", "judge_repeat_check"):
        if not 0.0 <= getattr(f, name) <= 1.0:
            yield f"feedback.{name}: a fraction in [0, 1], got {getattr(f, name)}"
    for name, low in (("judge_concurrency", 1), ("judge_retries", 0), ("judge_max_tokens", 1)):
        if getattr(f, name) < low:
            yield f"feedback.{name}: must be >= {low}, got {getattr(f, name)}"
    if not f.judge_timeout_s > 0 or f.judge_temperature < 0:
        yield (
            f"feedback.judge_timeout_s: must be > 0 (and judge_temperature >= 0), got "
            f"{f.judge_timeout_s} ({f.judge_temperature})"
        )


def _comparisons(cfg: RecipeConfig) -> Iterator[str]:
    f, g = cfg.feedback, cfg.sampling.group_size
    if f.source != "comparison":
        return
    if g < 2:
        yield f"sampling.group_size: feedback.source=comparison compares within a group, got {g}"
    k = f.comparison_pairs
    if k != "all" and g >= 2 and not g - 1 <= k <= g * (g - 1) // 2:
        yield (
            f"feedback.comparison_pairs: a group of {g} needs {g - 1} to {g * (g - 1) // 2} "
            f"pairs (connected, at most all), got {k}"
        )


def _curriculum(cfg: RecipeConfig) -> Iterator[str]:
    s, d = cfg.sampling, cfg.data
    if not s.curriculum:
        return
    curriculum = kind_of(d.task).curriculum
    if curriculum is None:
        yield (
            f"sampling.curriculum: drives one reasoning-gym task's own curriculum, not {d.task!r}"
        )
        return
    yield from curriculum.check(d, s, cfg.system.mode)


def _rebalance(cfg: RecipeConfig) -> Iterator[str]:
    s = cfg.sampling
    if not s.rebalance:
        return
    if s.group_size < 2:
        yield (
            f"sampling.rebalance: tells a uniform group (all correct or all wrong) from "
            f"a mixed one, which needs G >= 2, got sampling.group_size={s.group_size}"
        )
    if cfg.system.mode == "async":
        yield (
            "sampling.rebalance: it draws the prompts from what the learner has seen, "
            "which the asynchronous workers run ahead of; use system.mode=sync"
        )
    if s.rebalance_after < 1:
        yield f"sampling.rebalance_after: must be >= 1, got {s.rebalance_after}"
    if not 0 < s.rebalance_keep <= 1:
        yield f"sampling.rebalance_keep: must be in (0, 1], got {s.rebalance_keep}"
    if not 0 < s.rebalance_rare < 1:
        yield f"sampling.rebalance_rare: must be in (0, 1), got {s.rebalance_rare}"


def _data(cfg: RecipeConfig) -> Iterator[str]:
    d = cfg.data
    kind = kind_of(d.task)
    yield from kind.check_settings(d, cfg.model.path)  # or a ConfigError naming the field
    if kind.own_reward and cfg.feedback.eval_verifier is not None:
        yield (
            f"feedback.eval_verifier: {d.task!r} is scored by its environment's own reward, "
            "held-out episodes too; no verifier applies"
        )
    built_in = not kind.data_files
    for name, value, default in (
        ("prompt_field", d.prompt_field, "prompt"),
        ("answer_field", d.answer_field, "answer"),
    ):
        if built_in and value != default:
            yield f"data.{name}: only data files have fields to name, not {d.task!r}"
    if built_in and d.answer_format != "plain":
        yield (
            f"data.answer_format: only data files and hf: datasets have solutions to read "
            f"answers from, not {d.task!r}"
        )
    if built_in and d.eval_path is not None:
        yield (
            f"data.eval_path: only a data-file task takes a held-out file; {d.task!r} holds "
            "out data.eval_size of its own prompts"
        )
    named = (
        ("feedback.verifier", cfg.feedback.verifier),
        ("feedback.eval_verifier", cfg.feedback.eval_verifier),
    )
    for name, verifier in named:
        if verifier is None or verifier not in feedback.registry:
            continue
        if feedback.registry.get(verifier).items and not kind.items:
            yield (
                f"{name}: {verifier} scores reasoning-gym items; it needs "
                "data.task=reasoning_gym:NAME"
            )
    if d.max_turns < 1:
        yield f"data.max_turns: must be >= 1, got {d.max_turns}"
    if d.max_digits < 1:
        yield f"data.max_digits: must be >= 1, got {d.max_digits}"
    if d.env_latency is not None:
        try:
            parse_duration(d.env_latency, flag="data.env_latency")
        except ConfigError as exc:
            yield str(exc)


def _lora(cfg: RecipeConfig) -> Iterator[str]:
    m = cfg.model
    names = m.lora_modules
    if not names or any(not TARGET_NAME.fullmatch(name) for name in names):
        yield (
            f"model.lora_targets: needs one or more module names (a list, or a comma-"
            f"separated string such as q_proj,v_proj), got {m.lora_targets!r}"
        )
    if m.lora_rank == 0 and m.lora_alpha is not None:  # None: unset, 2·r once r > 0
        yield (
            f"model.lora_alpha: scales LoRA's update, and model.lora_rank=0 trains no "
            f"adapters (full fine-tuning); got lora_alpha={m.lora_alpha}"
        )
    if m.lora_rank == 0 and names != ModelConfig().lora_modules:
        yield (
            "model.lora_targets: names the layers that get adapters, and model.lora_rank=0 "
            f"trains none (full fine-tuning); got {m.lora_targets!r}"
        )
    if cfg.run.save_merged and m.lora_rank == 0:
        yield (
            "run.save_merged: needs model.lora_rank > 0 (a full fine-tuning checkpoint is "
            "already a plain model)"
        )


def _loggers(cfg: RecipeConfig) -> Iterator[str]:
    """``run.loggers``: known trackers, each named once and installed (here, so that a
    missing one fails before a run directory exists)."""
    names = cfg.run.logger_names
    for i, name in enumerate(names):
        if name not in trackers.registry:
            known = ", ".join(trackers.registry.names())
            yield f"run.loggers: unknown tracker '{name}'; known: {known}"
        elif name in names[:i]:
            yield f"run.loggers: '{name}' is named twice"
    if not cfg.run.project.strip():
        yield "run.project: must not be empty (the trackers' project or experiment name)"
    for name in cfg.run.trackers:
        if name in trackers.registry:
            field = "run.loggers" if name in names else "run.tensorboard"
            problem = trackers.not_installed(name, field)
            if problem is not None:
                yield problem


def _system(cfg: RecipeConfig) -> Iterator[str]:
    if not DEVICE_SETTING.fullmatch(cfg.system.device):
        yield f"system.device: one of auto, cpu, cuda, cuda:N, got {cfg.system.device!r}"
    if cfg.system.partial_rollout and cfg.system.mode != "async":
        yield (
            "system.partial_rollout: needs system.mode=async (the synchronous loop never "
            "updates weights while a trajectory runs)"
        )
    if cfg.system.deterministic:
        yield from _deterministic(cfg)
    if cfg.system.backend == "ray" and cfg.system.mode != "async":
        yield (
            "system.backend: 'ray' runs the asynchronous loop's rollout workers; "
            "set system.mode=async"
        )
    if cfg.system.mode == "async" and sampling.registry.get(cfg.sampling.filter).needs_group:
        yield (
            f"sampling.filter: '{cfg.sampling.filter}' filters whole groups, but the "
            "asynchronous queue consumes trajectories as they finish, not groups; use "
            "sampling.filter=none with system.mode=async"
        )
    bound = cfg.behaviour.max_staleness + 1
    if cfg.system.mode == "async" and cfg.system.publish_every > bound:
        yield (
            f"system.publish_every: {cfg.system.publish_every} steps between publications "
            f"exceed behaviour.max_staleness + 1 = {bound}: before each publication "
            "every queued trajectory would be too stale to consume"
        )
    for name in ("workers", "publish_every", "learners"):
        if getattr(cfg.system, name) < 1:
            yield f"system.{name}: must be >= 1, got {getattr(cfg.system, name)}"
    yield from _learners(cfg)
    yield from _engine_sleep(cfg.system)
    yield from _actors(cfg.system)


def _actors(s: SystemParams) -> Iterator[str]:
    """Where Ray's rollout actors run: settings that place nothing outside Ray, a share of
    more than one GPU (tensor parallelism is not built), and colocation asking for none."""
    field = "actor_gpus" if s.actor_gpus is not None else "actor_placement"
    if s.backend != "ray" and (s.actor_gpus is not None or s.actor_placement != "separate"):
        yield f"system.{field}: places Ray's rollout actors; set system.backend=ray"
    if s.actor_gpus is not None and not (s.actor_gpus == 0 or 1e-4 <= s.actor_gpus <= 1):
        yield (
            f"system.actor_gpus: must be 0 or in [0.0001, 1] (Ray's unit is 1e-4; more than "
            f"one GPU per actor is not built), got {s.actor_gpus}"
        )
    if s.actor_placement == "colocate" and s.actor_gpus == 0:
        yield (
            "system.actor_placement: colocate shares the learner's GPU with the actors, and "
            "system.actor_gpus=0 gives them none"
        )


def _engine_sleep(s: SystemParams) -> Iterator[str]:
    """Where vLLM cannot sleep while the learner steps (``auto`` resolves to off there): an
    explicit level needs the vLLM engine, an idle engine (the synchronous loop) and a build
    with sleep mode (vLLM's CUDA build), and a learner on the GPU to give the memory to."""
    level = s.engine_sleep
    if level in ("auto", "off"):
        return
    why = None
    if s.engine != "vllm":
        why = f"is for the vLLM engine; system.engine={s.engine} never sleeps"
    elif s.partial_rollout:
        why = (
            "cannot go with system.partial_rollout (its trajectories stay in the engine "
            "across weight updates)"
        )
    elif s.mode != "sync":
        why = (
            "needs system.mode=sync (the asynchronous loop's workers sample while the "
            "learner steps)"
        )
    elif not torch.cuda.is_available():
        why = "needs vLLM's CUDA build: its CPU build has no sleep mode"
    elif s.device == "cpu":
        why = "needs the learner on the GPU, and system.device=cpu puts it on the CPU"
    if why is not None:
        yield f"system.engine_sleep: {level} {why}; set system.engine_sleep=off or auto"


def _deterministic(cfg: RecipeConfig) -> Iterator[str]:
    s = cfg.system
    if s.mode != "async":
        yield (
            "system.deterministic: needs system.mode=async (the synchronous loop always "
            "repeats exactly)"
        )
    if s.partial_rollout:
        yield (
            "system.deterministic: not with system.partial_rollout (which weights arrive "
            "between two turns is up to timing)"
        )


def _learners(cfg: RecipeConfig) -> Iterator[str]:
    """What data-parallel learners (``system.learners > 1``) do not run yet, and a batch
    too small to give every rank a prompt."""
    n = cfg.system.learners
    if n <= 1:
        if cfg.system.learner_sharding != "ddp":
            yield (
                f"system.learner_sharding: '{cfg.system.learner_sharding}' shards over "
                "learner ranks; set system.learners > 1"
            )
        return
    if cfg.system.mode != "sync":
        yield (
            f"system.learners: {n} needs system.mode=sync (data-parallel learners run the "
            "synchronous loop; the asynchronous one is not there yet)"
        )
    elif cfg.model.lora_rank:
        yield (
            f"system.learners: {n} does not train LoRA adapters yet; set model.lora_rank=0 "
            "or system.learners=1"
        )
    elif cfg.sampling.prompts_per_step < n:
        yield (
            f"system.learners: {n} ranks need at least as many prompts per step, got "
            f"sampling.prompts_per_step={cfg.sampling.prompts_per_step} (a prompt's G "
            "samples never straddle ranks)"
        )


def _optim(cfg: RecipeConfig) -> Iterator[str]:
    o = cfg.optim
    for field in ("steps", "epochs_per_batch", "minibatches_per_epoch", "micro_batch_size"):
        if getattr(o, field) < 1:
            yield f"optim.{field}: must be >= 1, got {getattr(o, field)}"
    if o.lr <= 0:
        yield f"optim.lr: must be > 0, got {o.lr}"
    if not all(0.0 <= beta < 1.0 for beta in o.adam_betas):
        yield f"optim.adam_betas: each must be in [0, 1), got {list(o.adam_betas)}"


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
    _feedback,
    _curriculum,  # before _data: data.task_args holds the curriculum's top level
    _rebalance,
    _data,
    _lora,
    _loggers,
    _system,
    _optim,
)
