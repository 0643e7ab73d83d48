"""prime-rl's TOML (``rl @ file.toml``) → rlmap, and the inverse.

Defaults re-read at PrimeIntellect-ai/prime-rl @ 559b44772e471d1538537b8805cc77f3824a5e64
(the commit of ``TRANSLATE.md`` §4): ``packages/prime-rl-configs/src/prime_rl/configs/``
``orchestrator.py``, ``trainer.py``, ``algorithm.py``, ``rl.py``, ``shared.py`` (cited
``P:file:line``); the loss from ``src/prime_rl/trainer/rl/loss.py`` (``default_loss_fn``:
the DPPO binary-TV mask on p_θ − μ, the raw ratio, τ·(log π_θ/μ)² on every token, a sum
over the step's tokens divided by their global count) and the schedules from
``src/prime_rl/trainer/scheduler.py``. prime-rl is always asynchronous and uses the
inference log-probs as π_old (bypass): rlmap's ``dppo_tv`` in bypass mode is its loss.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import tomllib

from rlmap.core.errors import ConfigError, InputError
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.translate import flatten
from rlmap.recipes.translate.rows import (
    IMPLIED,
    NULL,
    Lookup,
    Mapped,
    Mapping,
    field,
    implied,
    off,
    one_of,
    read_with,
)

P = "prime-rl@559b4477 packages/prime-rl-configs/src/prime_rl/configs"
ORCH = "orchestrator."
LOSS = "trainer.loss."
SCHED = "trainer.scheduler."
LORA = "trainer.model.lora."
ALGOS = ("grpo", "echo", "max_rl", "rae", "hierarchical_grpo", "opd", "opsd", "sft")


def _algo(value: Any, get: Lookup) -> Mapped:
    one_of(ORCH + "algo.type", value, ALGOS, "prime-rl")
    if value == "grpo":
        return Mapped(
            {"credit.estimator": "dr_grpo"}, note="trap: prime-rl's grpo is R − group mean, no std"
        )
    return Mapped({}, "none", f"rlmap has no {value} algorithm; the closest preset's is kept")


def _batch(value: Any, get: Lookup) -> Mapped:
    if get(ORCH + "token_batch_size") is not None:
        return Mapped({}, "none", "token_batch_size: a step of N tokens, not of N rollouts")
    group = get(ORCH + "group_size")
    if value % group:
        raise ConfigError(
            f"{ORCH}batch_size: {value} rollouts is not a multiple of group_size {group}"
        )
    return Mapped(
        {"sampling.prompts_per_step": value // group}, note=f"{value} rollouts / G={group}"
    )


def _filter_zero(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({})
    why = (
        "drops zero-advantage tokens (their policy gradient is 0) from the loss's token "
        "count and its kl_tau term; rlmap keeps them, and refuses a group filter in async "
        "mode"
    )
    return Mapped({}, "none", why)


def _staleness(value: Any, get: Lookup) -> Mapped:
    return Mapped(
        {
            "system.mode": "async",
            "behaviour.max_staleness": value,
            "behaviour.corrections": ["staleness"],
        }
    )


def _loss(value: Any, get: Lookup) -> Mapped:
    if value != "default":
        return Mapped({}, "none", f"trainer.loss.type={value}: no rlmap equivalent")
    return Mapped(
        {
            "behaviour.objective": "dppo_tv",
            "behaviour.dppo_tv_low": get(LOSS + "dppo_mask_low"),
            "behaviour.dppo_tv_high": get(LOSS + "dppo_mask_high"),
            "behaviour.dppo_tau": get(LOSS + "kl_tau"),
        },
        note="DPPO binary-TV against μ, raw ratio, + kl_tau·(log π_θ/μ)² "
        "(default_loss_fn); at Â = 0 prime-rl applies the low test, which drops no "
        "gradient",
    )


def _adv_tau(value: Any, get: Lookup) -> Mapped:
    if value == 1.0:
        return Mapped({}, note="neutral: needs nothing")
    return Mapped({}, "none", "rlmap cannot scale the advantage against the kl_tau term")


def _optimizer(value: Any, get: Lookup) -> Mapped:
    if value != "adamw":
        return Mapped({}, "none", f"{value}: rlmap's optimiser is AdamW")
    return Mapped({"optim.adam_betas": [get("trainer.optim.betas1"), get("trainer.optim.betas2")]})


def _schedule(value: Any, get: Lookup) -> Mapped:
    """constant; cosine: warm-up W then cosine to min_lr over max_steps − W; linear: warm-up,
    constant, then a linear decay over the last decay_steps (scheduler.py)."""
    one_of(SCHED + "type", value, ("constant", "linear", "cosine"), "prime-rl")
    if value == "constant":
        return Mapped({"optim.schedule": "constant", "optim.warmup_steps": 0})
    warm, floor = get(SCHED + "warmup_steps"), get(SCHED + "min_lr")
    fields = {"optim.schedule": value, "optim.warmup_steps": warm}
    notes = [f"min_lr={floor}: rlmap decays to 0"] if floor else []
    if value == "linear":
        decay, steps = get(SCHED + "decay_steps"), get("max_steps")
        if steps is None or warm + decay != steps:
            return Mapped(
                {},
                "none",
                "a linear decay over the last decay_steps only; rlmap's "
                "linear decays from the end of warm-up",
            )
    if warm:
        notes.append("prime-rl warms up as s/W (LinearLR from ~0), rlmap as (s+1)/W")
    return Mapped(fields, "approximate" if notes else "exact", "; ".join(notes))


def _lora(value: Any, get: Lookup) -> Mapped:
    """LoRA is on when the file has a ``[trainer.model.lora]`` table (rank 16, α 32 unless
    it says otherwise: trainer.py LoRAConfig)."""
    table = get("trainer.model.lora") is not None or get(LORA + "alpha") is not None
    if value is None and not table:
        return Mapped({"model.lora_rank": 0}, note="no [trainer.model.lora]: full fine-tuning")
    alpha = get(LORA + "alpha")
    return Mapped(
        {"model.lora_rank": value or 16, "model.lora_alpha": 32.0 if alpha is None else alpha}
    )


IMPLIED_FIELDS = {
    "feedback.source": "verifier",
    "behaviour.mode": "bypass",
    "kl.placement": "none",
    "kl.beta": 0.0,
    "reduction.name": "token_mean",
    "reduction.max_len": None,
    "generation.top_p": 1.0,
    "sampling.filter": "none",
    "critic.enabled": False,
    "feedback.overlong_cache": None,
    "behaviour.positive_nll": 0.0,
}


TABLE: tuple[Mapping, ...] = (
    Mapping(
        IMPLIED + "prime-rl trainer",
        implied(
            IMPLIED_FIELDS,
            "π_old = inference log-probs (bypass), no reference KL, "
            "global token mean, top_p fixed at 1 (orchestrator.py to_sampling_args)",
        ),
        "bypass",
        "prime-rl src/prime_rl/trainer/rl/loss.py",
    ),
    Mapping(ORCH + "algo.type", _algo, "grpo", f"{P}/orchestrator.py:448"),
    Mapping(
        ORCH + "group_size",
        field("sampling.group_size", "trap: 1 by default"),
        1,
        f"{P}/orchestrator.py:517",
    ),
    Mapping(
        ORCH + "token_batch_size", read_with(ORCH + "batch_size"), None, f"{P}/orchestrator.py:511"
    ),
    Mapping(
        ORCH + "batch_size",
        _batch,
        128,
        f"{P}/orchestrator.py:508 (None → 128 without token_batch_size, :627)",
    ),
    Mapping(ORCH + "max_off_policy_steps", _staleness, 8, f"{P}/orchestrator.py:532"),
    Mapping(ORCH + "train.filter_zero_advantages", _filter_zero, True, f"{P}/orchestrator.py:270"),
    Mapping(
        ORCH + "train.sampling.temperature",
        field("generation.temperature"),
        1.0,
        f"{P}/orchestrator.py:47",
    ),
    Mapping(
        ORCH + "train.sampling.max_completion_tokens",
        field("generation.max_new_tokens", "per turn in prime-rl", "approximate"),
        None,
        f"{P}/orchestrator.py:50",
    ),
    Mapping("seq_len", off("a context limit, not a run setting", ()), None, f"{P}/rl.py:287"),
    Mapping(
        ORCH + "seq_len",
        off("a context limit, not a run setting", ()),
        None,
        f"{P}/orchestrator.py:520",
    ),
    Mapping(LOSS + "dppo_mask_low", read_with(LOSS + "type"), 0.2, f"{P}/trainer.py:497"),
    Mapping(LOSS + "dppo_mask_high", read_with(LOSS + "type"), 0.2, f"{P}/trainer.py:500"),
    Mapping(LOSS + "kl_tau", read_with(LOSS + "type"), 1e-3, f"{P}/trainer.py:506"),
    Mapping(LOSS + "type", _loss, "default", f"{P}/trainer.py:495"),
    Mapping(LOSS + "adv_tau", _adv_tau, 1.0, f"{P}/trainer.py:503"),
    Mapping("trainer.optim.lr", field("optim.lr"), 1e-6, f"{P}/trainer.py:416"),
    Mapping("trainer.optim.weight_decay", field("optim.weight_decay"), 0.01, f"{P}/trainer.py:419"),
    Mapping("trainer.optim.max_norm", field("optim.max_grad_norm"), 1.0, f"{P}/trainer.py:422"),
    Mapping("trainer.optim.betas1", read_with("trainer.optim.type"), 0.9, f"{P}/trainer.py:439"),
    Mapping("trainer.optim.betas2", read_with("trainer.optim.type"), 0.999, f"{P}/trainer.py:442"),
    Mapping("trainer.optim.type", _optimizer, "adamw", f"{P}/trainer.py:437"),
    Mapping(SCHED + "warmup_steps", read_with(SCHED + "type"), 10, f"{P}/trainer.py:381"),
    Mapping(SCHED + "decay_steps", read_with(SCHED + "type"), 10, f"{P}/trainer.py:371"),
    Mapping(SCHED + "min_lr", read_with(SCHED + "type"), 0.0, f"{P}/trainer.py:384"),
    Mapping(SCHED + "type", _schedule, "constant", f"{P}/trainer.py:609"),
    Mapping(LORA + "alpha", read_with(LORA + "rank"), None, f"{P}/trainer.py:107"),
    Mapping(LORA + "rank", _lora, NULL, f"{P}/trainer.py:104 (the table: :256)"),
    Mapping("max_steps", field("optim.steps"), None, f"{P}/rl.py:284"),
    Mapping(
        "model.name", field("model.path", "the source's model"), "Qwen/Qwen3-0.6B", f"{P}/rl.py:124"
    ),
)
"""The rows, in the order they apply (a later row's fields win)."""


def table(world_size: int = 1, flat: dict[str, Any] | None = None) -> tuple[Mapping, ...]:
    """The table (its rows depend neither on the number of processes nor on the file)."""
    return TABLE


def read(path: Path) -> dict[str, Any]:
    """The TOML as flat dotted keys; a syntax error names the file and line."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"line (\d+)", str(exc))
        raise InputError(f"{path}:{line.group(1) if line else '?'}: not valid TOML") from None
    return flatten(data)


def differences(cfg: RecipeConfig) -> list[str]:
    """What prime-rl's settings cannot reproduce of ``cfg``, one line each."""
    b, s, o = cfg.behaviour, cfg.sampling, cfg.optim
    checks = [
        (
            cfg.credit.estimator != "dr_grpo",
            f"credit.estimator={cfg.credit.estimator}: prime-rl's grpo is mean-only (dr_grpo)",
        ),
        (
            b.objective != "dppo_tv",
            f"behaviour.objective={b.objective}: prime-rl's loss is DPPO binary-TV (dppo_tv)",
        ),
        (b.mode != "bypass", "behaviour.mode: prime-rl always uses the inference log-probs"),
        (
            cfg.system.mode != "async" or tuple(b.corrections) != ("staleness",),
            "system.mode / corrections: prime-rl is always asynchronous, staleness only",
        ),
        (cfg.kl.placement != "none", "kl: prime-rl has no reference-policy KL"),
        (
            cfg.reduction.name != "token_mean",
            f"reduction.name={cfg.reduction.name}: token mean only",
        ),
        (s.filter != "none", "sampling.filter: prime-rl drops zero-advantage tokens instead"),
        (cfg.generation.top_p != 1.0, "generation.top_p: prime-rl samples at top_p 1"),
        (cfg.feedback.overlong_cache is not None, "feedback.overlong_cache: not in prime-rl"),
        (cfg.critic.enabled, "critic: prime-rl has none"),
        (o.epochs_per_batch * o.minibatches_per_epoch != 1, "optim: one update per step"),
        (o.warmup_steps > 0, "optim.warmup_steps: prime-rl warms up as s/W"),
        (o.schedule == "linear", "optim.schedule=linear: prime-rl decays over decay_steps"),
    ]
    return [text for failed, text in checks if failed]


def inverse(cfg: RecipeConfig) -> tuple[str, list[str]]:
    """prime-rl TOML that comes closest to ``cfg``, and what it cannot reproduce."""
    b, s, o, m = cfg.behaviour, cfg.sampling, cfg.optim, cfg.model
    lines = [
        f"max_steps = {o.steps}",
        "[model]",
        f'name = "{m.path}"',
        "[orchestrator]",
        f"batch_size = {s.prompts_per_step * s.group_size}",
        f"group_size = {s.group_size}",
        f"max_off_policy_steps = {b.max_staleness}",
        "[orchestrator.train]",
        "filter_zero_advantages = false",
        "[orchestrator.train.sampling]",
        f"temperature = {cfg.generation.temperature}",
        f"max_completion_tokens = {cfg.generation.max_new_tokens}",
        "[trainer.loss]",
        f"dppo_mask_low = {b.dppo_tv_low}",
        f"dppo_mask_high = {b.dppo_tv_high}",
        f"kl_tau = {b.dppo_tau}",
        "[trainer.optim]",
        f"lr = {o.lr}",
        f"weight_decay = {o.weight_decay}",
        f"max_norm = {o.max_grad_norm}",
        f"betas1 = {o.adam_betas[0]}",
        f"betas2 = {o.adam_betas[1]}",
        "[trainer.scheduler]",
        f'type = "{o.schedule}"',
    ]
    if o.schedule != "constant":
        lines += [f"warmup_steps = {o.warmup_steps}"]
    if m.lora_rank:
        alpha = 2 * m.lora_rank if m.lora_alpha is None else m.lora_alpha
        lines += ["[trainer.model.lora]", f"rank = {m.lora_rank}", f"alpha = {alpha}"]
    return "\n".join(lines) + "\n", differences(cfg)
