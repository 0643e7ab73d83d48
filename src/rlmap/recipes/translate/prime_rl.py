"""prime-rl's TOML (``rl @ file.toml``) → rlmap, and the inverse.

Defaults are those the research note ``TRANSLATE.md`` §4 read at prime-rl @ 559b4477
(``packages/prime-rl-configs/src/prime_rl/configs/``: ``orchestrator.py``, ``trainer.py``,
``rl.py``), cited below as ``P:file:line``; they were not re-read for this module.
prime-rl is always asynchronous and uses the inference log-probs as π_old (bypass).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import tomllib

from rlmap.core.errors import ConfigError, InputError
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.translate import IMPLIED, Lookup, Mapped, Mapping, flatten, implied

P = "prime-rl@559b4477 (TRANSLATE.md §4)"
ORCH = "orchestrator."
ALGOS = ("grpo", "echo", "max_rl", "rae", "hierarchical_grpo", "opd", "opsd", "sft")


def _field(name: str, note: str = "", kind: str = "exact") -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({name: value}, kind, note)

    return convert


def _algo(value: Any, get: Lookup) -> Mapped:
    if value not in ALGOS:
        raise ConfigError(
            f"{ORCH}algo.type: {value!r} is not a prime-rl value (one of {', '.join(ALGOS)})"
        )
    if value == "grpo":
        return Mapped({"credit.estimator": "dr_grpo"},
                      note="trap: prime-rl's grpo is R − group mean, no std")  # fmt: skip
    return Mapped({}, "none", f"rlmap has no {value} algorithm; the closest preset's is kept")


def _batch(value: Any, get: Lookup) -> Mapped:
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
    why = ("drops zero-advantage tokens without refilling; rlmap refuses a group filter in "
           "async mode (0/1 rewards: the token-mean denominator differs)")  # fmt: skip
    return Mapped({}, "none", why)


def _staleness(value: Any, get: Lookup) -> Mapped:
    return Mapped({"system.mode": "async", "behaviour.max_staleness": value,
                   "behaviour.corrections": ["staleness"]})  # fmt: skip


def _loss(value: Any, get: Lookup) -> Mapped:
    if value != "default":
        return Mapped({}, "none", f"trainer.loss.type={value}: no rlmap equivalent")
    low, high = get("trainer.loss.dppo_mask_low"), get("trainer.loss.dppo_mask_high")
    return Mapped({"behaviour.objective": "direct_gate", "behaviour.gate_low": low,
                   "behaviour.gate_high": high}, "approximate",
                  "DPPO masks on p_θ − μ, one-sided by the sign of A; rlmap's gate is a two-sided "
                  "ratio band (equal for μ ≈ 1)")  # fmt: skip


def _neutral(what: str, neutral: Any) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return (
            Mapped({}, note="neutral: needs nothing")
            if value == neutral
            else Mapped({}, "none", what)
        )

    return convert


def _read_with(other: str) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({}, note=f"read with {other}")

    return convert


def _schedule(value: Any, get: Lookup) -> Mapped:
    if value == "constant":
        return Mapped({"optim.schedule": "constant"})
    if value == "cosine":
        return Mapped({"optim.schedule": "cosine"}, "approximate", "prime-rl's min_lr")
    return Mapped({}, "none", f"{value}: rlmap offers constant or cosine only")


IMPLIED_FIELDS = {"behaviour.mode": "bypass", "kl.placement": "none", "kl.beta": 0.0,
                  "reduction.name": "token_mean", "reduction.max_len": None,
                  "generation.top_p": 1.0, "sampling.filter": "none", "critic.enabled": False,
                  "feedback.overlong_cache": None, "behaviour.positive_nll": 0.0}  # fmt: skip


TABLE: tuple[Mapping, ...] = (
    Mapping(
        IMPLIED + "prime-rl trainer",
        implied(
            IMPLIED_FIELDS,
            "π_old = inference "
            "log-probs (bypass), no reference KL, global token mean, top_p fixed at 1",
        ),
        "bypass",
        f"{P}: P:src/prime_rl/trainer/rl/loss.py",
    ),
    Mapping(ORCH + "algo.type", _algo, "grpo", f"{P}: orchestrator.py:448"),
    Mapping(
        ORCH + "group_size",
        _field("sampling.group_size", "trap: 1 by default"),
        1,
        f"{P}: orchestrator.py:517",
    ),
    Mapping(ORCH + "batch_size", _batch, None, f"{P}: orchestrator.py:508"),
    Mapping(ORCH + "max_off_policy_steps", _staleness, 8, f"{P}: orchestrator.py:532"),
    Mapping(ORCH + "train.filter_zero_advantages", _filter_zero, True, f"{P}: orchestrator.py:270"),
    Mapping(
        ORCH + "train.sampling.temperature",
        _field("generation.temperature"),
        1.0,
        f"{P}: orchestrator.py:47",
    ),
    Mapping(
        ORCH + "train.sampling.max_completion_tokens",
        _field("generation.max_new_tokens", "per turn in prime-rl", "approximate"),
        None,
        f"{P}: orchestrator.py:50",
    ),
    Mapping(
        "seq_len",
        _neutral("a context limit, not a run setting", None),
        None,
        f"{P}: orchestrator.py:520",
    ),
    Mapping(
        "trainer.loss.dppo_mask_low",
        _read_with("trainer.loss.type"),
        0.2,
        f"{P}: trainer.py:497",
    ),
    Mapping(
        "trainer.loss.dppo_mask_high",
        _read_with("trainer.loss.type"),
        0.2,
        f"{P}: trainer.py:500",
    ),
    Mapping("trainer.loss.type", _loss, "default", f"{P}: trainer.py:494"),
    Mapping(
        "trainer.loss.adv_tau",
        _neutral("rlmap cannot scale the advantage", 1.0),
        1.0,
        f"{P}: trainer.py:503",
    ),
    Mapping(
        "trainer.loss.kl_tau",
        _neutral("rlmap has no (log π/μ)² term toward μ", 0.0),
        1e-3,
        f"{P}: trainer.py:506",
    ),
    Mapping("trainer.optim.lr", _field("optim.lr"), 1e-6, f"{P}: trainer.py:416"),
    Mapping(
        "trainer.optim.weight_decay", _field("optim.weight_decay"), 0.01, f"{P}: trainer.py:419"
    ),
    Mapping("trainer.optim.max_norm", _field("optim.max_grad_norm"), 1.0, f"{P}: trainer.py:422"),
    Mapping("trainer.scheduler.type", _schedule, "constant", f"{P}: trainer.py:609"),
    Mapping("trainer.model.lora.rank", _field("model.lora_rank"), None, f"{P}: trainer.py:104"),
    Mapping("trainer.model.lora.alpha", _field("model.lora_alpha"), None, f"{P}: trainer.py:107"),
    Mapping("max_steps", _field("optim.steps"), None, f"{P}: rl.py:284"),
    Mapping(
        "model.name",
        _field("model.path", "the source's model"),
        "Qwen/Qwen3-0.6B",
        f"{P}: rl.py:124",
    ),
)
"""The rows, in the order they apply (a later row's fields win)."""


def table(world_size: int = 1) -> tuple[Mapping, ...]:
    """The table (its rows do not depend on the number of processes)."""
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


def inverse(cfg: RecipeConfig) -> tuple[str, list[str]]:
    """prime-rl TOML that comes closest to ``cfg``, and what it cannot reproduce."""
    b, s = cfg.behaviour, cfg.sampling
    checks = [
        (
            cfg.credit.estimator != "dr_grpo",
            f"credit.estimator={cfg.credit.estimator}: prime-rl's "
            "grpo is mean-only (rlmap dr_grpo)",
        ),
        (
            b.objective != "direct_gate",
            f"behaviour.objective={b.objective}: prime-rl's loss is DPPO",
        ),
        (b.objective == "direct_gate", "direct_gate ≈ DPPO-TV (a probability band, one-sided)"),
        (b.mode != "bypass", "behaviour.mode: prime-rl always uses the inference log-probs"),
        (cfg.system.mode != "async", "system.mode: prime-rl is always asynchronous"),
        (cfg.kl.placement != "none", "kl: prime-rl has no reference-policy KL"),
        (
            cfg.reduction.name != "token_mean",
            f"reduction.name={cfg.reduction.name}: token mean only",
        ),
        (s.filter != "none", "sampling.filter: prime-rl drops zero-advantage tokens instead"),
    ]
    lines = [
        f"max_steps = {cfg.optim.steps}",
        "[model]",
        f'name = "{cfg.model.path}"',
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
        f"dppo_mask_low = {b.gate_low}",
        f"dppo_mask_high = {b.gate_high}",
        "kl_tau = 0.0",
        "[trainer.optim]",
        f"lr = {cfg.optim.lr}",
        f"weight_decay = {cfg.optim.weight_decay}",
        f"max_norm = {cfg.optim.max_grad_norm}",
        "[trainer.scheduler]",
        f'type = "{cfg.optim.schedule}"',
    ]
    return "\n".join(lines) + "\n", [text for failed, text in checks if failed]
