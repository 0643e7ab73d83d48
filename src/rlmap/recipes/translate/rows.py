"""What the framework tables are written in: a row (:class:`Mapping`), what a setting
becomes (:class:`Mapped`), and the converters more than one framework needs, written once
here so that a rule two frameworks share cannot drift apart between their modules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from rlmap.core.errors import ConfigError

Lookup = Callable[[str], Any]
"""A key's value: the file's, else the framework's default (None when it has none)."""


@dataclasses.dataclass(frozen=True)
class Mapped:
    """What one setting becomes: rlmap fields (dotted) and how faithful that is."""

    fields: dict[str, Any]
    kind: str = "exact"
    """exact (same mathematics), approximate (same intent, numbers differ), none."""
    note: str = ""
    """The difference (approximate), the reason (none), or a trap worth naming (exact)."""


Convert = Callable[[Any, Lookup], Mapped]
"""A row's converter: (the key's value, the lookup of the others) → what it becomes."""


@dataclasses.dataclass(frozen=True)
class Mapping:
    """One row of a framework's table."""

    key: str
    """The source key, flattened with dots (a CLI flag without its dashes)."""
    convert: Convert
    default: Any
    """The framework's default; None: reported only when the file sets the key."""
    cite: str
    """Where the default is set: repository and version, file:line."""


class _Null:
    """A framework default of None that still decides the run (TRL's ``delta=None``: no
    dual clip), as opposed to the Mapping default None, which means "no default"."""

    def __repr__(self) -> str:
        return "None"


NULL: Any = _Null()


def implied(fields: dict[str, Any], note: str) -> Convert:
    """A row for what the framework does without a key (no overlong shaping, π_old
    recomputed): fields the closest preset would otherwise bring in silently."""

    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped(fields, note=note)

    return convert


IMPLIED = "(no key) "
"""How a row without a source key is named in the report."""


def field(name: str, note: str = "", kind: str = "exact") -> Convert:
    """A row whose value becomes one rlmap field as is."""

    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({name: value}, kind, note)

    return convert


def read_with(other: str) -> Convert:
    """A row another row reads (``kl_loss_coef`` with ``use_kl_loss``): reported, no fields."""

    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({}, note=f"read with {other}")

    return convert


def off(what: str, neutral: tuple[Any, ...]) -> Convert:
    """A setting rlmap lacks: fine at a neutral value (``entropy_coeff=0``), else "none"
    with ``what`` as the reason."""

    def convert(value: Any, get: Lookup) -> Mapped:
        if value in neutral:
            return Mapped({}, note="off: needs nothing")
        return Mapped({}, "none", what)

    return convert


def betas(value: Any, get: Lookup) -> Mapped:
    """Adam's (β1, β2) as ``optim.adam_betas``; a malformed pair is one line."""
    if not (isinstance(value, (list, tuple)) and len(value) == 2):
        raise ConfigError(f"expected two numbers (β1, β2), got {value!r}")
    return Mapped({"optim.adam_betas": [float(v) for v in value]})


# ---------------------------------------------------------------- shared by frameworks

NO_ENTROPY = "rlmap has no entropy bonus"
NO_TOP_K = "rlmap has no top_k (docs/translate.md)"


def one_of(key: str, value: Any, known: Iterable[str], framework: str) -> None:
    """ConfigError naming ``key`` unless ``value`` is one of the ``framework``'s ``known``."""
    known = list(known)
    if value not in known:
        article = "an" if framework[:1] in "AEIOU" else "a"
        raise ConfigError(
            f"{key}: {value!r} is not {article} {framework} value (one of {', '.join(known)})"
        )


def minibatches(batch_key: str) -> Convert:
    """A mini-batch size in prompts (verl's ``ppo_mini_batch_size``, SkyRL's
    ``policy_mini_batch_size``) as optimiser steps per batch: it must divide ``batch_key``."""

    def convert(value: Any, get: Lookup) -> Mapped:
        batch = get(batch_key)
        if not value or batch % value:
            raise ConfigError(f"{value} does not divide {batch_key} {batch}")
        return Mapped(
            {"optim.minibatches_per_epoch": batch // value},
            note=f"trap: {batch}/{value} = {batch // value} updates a batch",
        )

    return convert


def lora(alpha_key: str) -> Convert:
    """A LoRA rank (0: full fine-tuning) with its α read from ``alpha_key``."""

    def convert(value: Any, get: Lookup) -> Mapped:
        if not value:
            return Mapped({"model.lora_rank": 0}, note="rank 0: full fine-tuning")
        return Mapped({"model.lora_rank": value, "model.lora_alpha": get(alpha_key)})

    return convert


def mixed_filter(rounds: int) -> dict[str, Any]:
    """DAPO's dynamic sampling (mixed groups only); a round cap ≤ 0 (unbounded in verl and
    SkyRL) keeps rlmap's finite one."""
    return {"sampling.filter": "mixed", **({"sampling.max_rounds": rounds} if rounds > 0 else {})}


def tis(level: str, cap: float) -> dict[str, Any]:
    """Truncated importance sampling, w = min(κ, C), per token or per sequence."""
    return {
        "behaviour.corrections": ["tis"],
        "behaviour.tis_level": level,
        "behaviour.tis_cap": cap,
    }


def icepop(low: float, high: float) -> dict[str, Any]:
    """IcePop, w = κ·1[lo ≤ κ ≤ hi] per token."""
    return {
        "behaviour.corrections": ["icepop"],
        "behaviour.icepop_low": low,
        "behaviour.icepop_high": high,
    }


def kl_controller(get: Lookup, ctrl: str, target: str) -> dict[str, Any]:
    """The in-reward KL's controller (verl's and SkyRL's ``kl_ctrl``, under prefix ``ctrl``):
    adaptive towards ``ctrl + target`` over ``ctrl + "horizon"``, else a fixed β."""
    if get(ctrl + "type") == "adaptive":
        return {"kl.target": get(ctrl + target), "kl.horizon": get(ctrl + "horizon")}
    return {"kl.target": None}


TRANSFORMERS_SCHEDULES = {
    "constant_with_warmup": "constant",
    "constant": "constant",
    "cosine": "cosine",
    "linear": "linear",
}
"""transformers' ``get_scheduler`` names (TRL's and SkyRL's) rlmap has, as rlmap's."""


def transformers_schedule(value: Any, warmup_key: str, get: Lookup) -> Mapped:
    """A transformers schedule; its ``constant`` ignores the warm-up given in ``warmup_key``."""
    if value not in TRANSFORMERS_SCHEDULES:
        return Mapped({}, "none", f"{value}: rlmap offers constant, cosine or linear")
    if value == "constant" and get(warmup_key):
        return Mapped(
            {"optim.schedule": "constant", "optim.warmup_steps": 0},
            "approximate",
            f"transformers' constant schedule ignores {warmup_key}",
        )
    return Mapped({"optim.schedule": TRANSFORMERS_SCHEDULES[value]})


def transformers_warmup(steps: int) -> Mapped:
    """A warm-up of ``steps`` optimiser steps under transformers' schedules."""
    if not steps:
        return Mapped({"optim.warmup_steps": 0})
    return Mapped(
        {"optim.warmup_steps": steps},
        "approximate",
        "transformers warms up as s/W (0 at the first step), rlmap as (s+1)/W",
    )
