"""``rlmap translate``: another framework's config as an rlmap config, with a report.

Each framework is one module holding its mapping table as data (a tuple of
:class:`Mapping` rows: source key, the framework's default with where it is set, a
converter to rlmap fields, exact / approximate / none, and why). Translation reads the
file into flat dotted keys, runs every row — on the file's value, or on the framework's
default when the file leaves the key out, because a default the framework applies
silently (verl's dual clip at 3, TRL's ``loss_type=dapo``) decides the run as much as a
written value does — starts from the rlmap preset closest to the result, and writes the
fields that differ. Keys no row reads are reported as "not read", never an error.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from collections.abc import Mapping as AbcMapping
from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError, InputError
from rlmap.recipes.config import RecipeConfig, build_config, read_yaml

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


@dataclasses.dataclass(frozen=True)
class Mapping:
    """One row of a framework's table."""

    key: str
    """The source key, flattened with dots (a CLI flag without its dashes)."""
    convert: Callable[[Any, Lookup], Mapped]
    default: Any
    """The framework's default; None: reported only when the file sets the key."""
    cite: str
    """Where the default is set: repository and version, file:line."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the report."""

    key: str
    value: Any
    given: bool
    """True: the file sets it; False: the framework's default applied silently."""
    kind: str
    """exact / approximate / none / not read."""
    fields: dict[str, Any]
    note: str

    def line(self) -> str:
        src = "" if self.given else " (default)"
        to = ", ".join(f"{k}={v!r}" for k, v in self.fields.items()) or "—"
        note = f": {self.note}" if self.note else ""
        return f"{self.kind:<11} {self.key}={self.value!r}{src} → {to}{note}"


@dataclasses.dataclass(frozen=True)
class Translation:
    """The rlmap config a source file translates to, and the report that justifies it."""

    framework: str
    config: RecipeConfig
    data: dict[str, Any]
    """What is written: ``recipe`` (the closest preset) and every field that differs."""
    rows: tuple[Row, ...]

    def report(self) -> str:
        return "\n".join(row.line() for row in self.rows)

    def to_yaml(self) -> str:
        """The written config, the report on top as comments, so that the output loads as is."""
        import yaml

        head = [f"# translated from {self.framework}; every setting read:"]
        head += [f"#   {row.line()}" for row in self.rows]
        return "\n".join(head) + "\n" + yaml.safe_dump(self.data, sort_keys=False)


class _Null:
    """A framework default of None that still decides the run (TRL's ``delta=None``: no
    dual clip), as opposed to the Mapping default None, which means "no default"."""

    def __repr__(self) -> str:
        return "None"


NULL: Any = _Null()


FRAMEWORKS = ("verl", "trl", "openrlhf", "prime-rl", "skyrl")
READY = FRAMEWORKS
"""The frameworks with a table so far; the others are refused by name."""


def _module(source: str) -> Any:
    from rlmap.recipes.translate import openrlhf, prime_rl, skyrl, trl, verl

    modules: dict[str, Any] = {
        "verl": verl,
        "trl": trl,
        "prime-rl": prime_rl,
        "skyrl": skyrl,
        "openrlhf": openrlhf,
    }
    if source not in modules:
        raise ConfigError(f"--from {source}: not translated yet (ready: {', '.join(READY)})")
    return modules[source]


def implied(fields: dict[str, Any], note: str) -> Callable[[Any, Lookup], Mapped]:
    """A row for what the framework does without a key (no overlong shaping, π_old
    recomputed): fields the closest preset would otherwise bring in silently."""

    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped(fields, note=note)

    return convert


IMPLIED = "(no key) "
"""How a row without a source key is named in the report."""


def field(name: str, note: str = "", kind: str = "exact") -> Callable[[Any, Lookup], Mapped]:
    """A row whose value becomes one rlmap field as is."""

    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({name: value}, kind, note)

    return convert


def read_with(other: str) -> Callable[[Any, Lookup], Mapped]:
    """A row another row reads (``kl_loss_coef`` with ``use_kl_loss``): reported, no fields."""

    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({}, note=f"read with {other}")

    return convert


def off(what: str, neutral: tuple[Any, ...]) -> Callable[[Any, Lookup], Mapped]:
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


def flatten(data: AbcMapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested sections as dotted keys (``actor_rollout_ref.actor.clip_ratio_low``)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, AbcMapping) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


_INTERPOLATION = re.compile(r"^\$\{(?:oc\.select:)?([\w.]+)(?:,([^}]*))?\}$")


def resolve(flat: dict[str, Any], path: Path) -> dict[str, Any]:
    """Hydra's simple interpolations resolved: ``${a.b}`` and ``${oc.select:a.b,default}``
    (another key of the same file). Anything else is refused naming the key: resolving
    resolvers would need omegaconf, which rlmap does not depend on."""
    out = dict(flat)
    for key, value in flat.items():
        if not (isinstance(value, str) and "${" in value):
            continue
        match = _INTERPOLATION.match(value.strip())
        target = None if match is None else match.group(1)
        if match is None or (target not in flat and match.group(2) is None):
            raise InputError(
                f"{path}: {key}: cannot resolve {value!r}; translate the resolved "
                "config (verl writes it to the run's .hydra/config.yaml)"
            )
        out[key] = flat[target] if target in flat else _scalar(str(match.group(2)))
    return out


def _scalar(raw: str) -> Any:
    import yaml

    return yaml.safe_load(raw)


def run_table(table: tuple[Mapping, ...], flat: dict[str, Any]) -> tuple[dict[str, Any], list[Row]]:
    """Every row on the file's value or the default: the rlmap fields (later rows win) and
    the report; rows whose key is absent and has no default are skipped."""
    defaults = {m.key: m.default for m in table}

    def lookup(key: str) -> Any:
        value = flat.get(key, defaults.get(key))
        return None if value is NULL else value

    fields: dict[str, Any] = {}
    rows: list[Row] = []
    for m in table:
        given = m.key in flat
        if not given and m.default is None:
            continue
        try:
            mapped = m.convert(lookup(m.key), lookup)
        except ConfigError as exc:  # name the row's key unless the message names one
            text = str(exc)
            named = text.startswith("--") or any(text.startswith(f"{k}:") for k in defaults)
            raise ConfigError(text if named else f"{m.key}: {text}") from None
        fields.update(mapped.fields)
        note = mapped.note if given else f"{mapped.note} [default: {m.cite}]".strip()
        rows.append(Row(m.key, flat.get(m.key, m.default), given, mapped.kind, mapped.fields, note))
    known = set(defaults)
    rows += [
        Row(k, v, True, "not read", {}, "no row reads this key")
        for k, v in flat.items()
        if k not in known
    ]
    return fields, rows


def _dotted(cfg: RecipeConfig, field: str) -> Any:
    node: Any = cfg.model_dump(mode="json")
    for part in field.split("."):
        node = node[part]
    return node


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


_WEIGHT = {
    "credit.estimator": 10,
    "behaviour.objective": 10,
    "reduction.name": 10,
    "kl.placement": 10,
    "sampling.filter": 10,
    "critic.enabled": 10,
}
"""A component choice outweighs any number of hyper-parameters when choosing the preset."""


def closest_preset(fields: dict[str, Any]) -> str:
    """The preset that agrees with the most translated fields (the first on a tie)."""
    from rlmap.recipes.catalog import preset, registry

    def differences(name: str) -> int:
        cfg = preset(name)
        return sum(_WEIGHT.get(f, 1) * (_dotted(cfg, f) != _plain(v)) for f, v in fields.items())

    return min(registry.names(), key=differences)


def nest(fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dotted, value in fields.items():
        *parents, leaf = dotted.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _plain(value)
    return out


EMBEDDED_SIZES = (
    "model.path",
    "generation.max_new_tokens",
    "sampling.prompts_per_step",
    "optim.lr",
    "optim.critic_lr",
    "optim.micro_batch_size",
    "optim.steps",
    "optim.warmup_steps",
)
"""Fields that size a run for the source's model and cluster; ``--embedded`` takes the
preset's values for them (as ``rlmap explain``'s "scaled for the embedded default"). The
group size is the algorithm's (it shows in the composition) and is kept."""


def embedded(fields: dict[str, Any], name: str) -> dict[str, Any]:
    """The translated fields with the model and sizes of preset ``name``: the same
    composition, trainable on the embedded default. Length-derived values scale with the
    length limit (an overlong cache of 4096 of 20480 tokens → 1/5 of the embedded limit)."""
    from rlmap.recipes.catalog import preset

    cfg = preset(name)
    out = dict(fields)
    length = _dotted(cfg, "generation.max_new_tokens")
    source_len = fields.get("generation.max_new_tokens", length)
    for field in EMBEDDED_SIZES:
        out[field] = _dotted(cfg, field)
    if out.get("reduction.max_len") is not None:
        out["reduction.max_len"] = length
    if out.get("feedback.overlong_cache") is not None:
        scaled = round(out["feedback.overlong_cache"] * length / source_len)
        out["feedback.overlong_cache"] = max(1, min(scaled, length - 1))
    return out


def read(path: str | Path, source: str) -> dict[str, Any]:
    """The file as flat dotted keys (interpolations resolved)."""
    p = Path(path)
    return resolve(_module(source).read(p), p)


TRL_KEYS = ("loss_type", "num_generations", "normalize_advantages", "reward_clip_range")
"""Keys only a TRL GRPOConfig / RLOOConfig file has at its top level."""


def detect(path: str | Path) -> str:
    """``--from auto``: the framework the file's own keys name, else one line asking."""
    p = Path(path)
    text = p.read_text(encoding="utf-8", errors="replace") if p.is_file() else ""
    if "openrlhf" in text:
        return "openrlhf"
    if p.suffix == ".toml":
        return "prime-rl"
    data = read_yaml(p)
    if "actor_rollout_ref" in data:
        return "verl"
    if isinstance(data.get("trainer"), dict) and "algorithm" in data["trainer"]:
        return "skyrl"
    if data.get("trainer") in ("grpo", "rloo") or any(k in data for k in TRL_KEYS):
        return "trl"
    raise InputError(
        f"{p}: --from auto: no key says which framework wrote it; give --from "
        f"{'|'.join(FRAMEWORKS)}"
    )


def translate(
    path: str | Path, source: str, *, to_embedded: bool = False, world_size: int = 1
) -> Translation:
    """The rlmap config for ``path`` written by ``source`` ('auto': detected), and the report.

    ``world_size``: the number of training processes, which TRL's batch sizes count per
    device. ``to_embedded``: the embedded model and sizes (:func:`embedded`)."""
    source = detect(path) if source == "auto" else source
    module = _module(source)
    flat = read(path, source)
    try:
        fields, rows = run_table(module.table(world_size, flat), flat)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    name = closest_preset(fields)
    if to_embedded:
        fields = embedded(fields, name)
    data = {"recipe": name, **nest(_differing(fields, name))}
    try:
        config = build_config(None, data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: the translated config is refused: {exc}") from None
    return Translation(source, config, data, tuple(rows))


def _differing(fields: dict[str, Any], name: str) -> dict[str, Any]:
    from rlmap.recipes.catalog import preset

    cfg = preset(name)
    return {f: v for f, v in fields.items() if _dotted(cfg, f) != _plain(v)}


def explain_as(name: str, target: str) -> str:
    """The settings of ``target`` that reproduce preset ``name``, in its file format, with
    each difference named (``rlmap explain NAME --as TARGET``)."""
    from rlmap.recipes.catalog import registry

    module = _module(target)
    text, differences = module.inverse(registry.get(name).build())
    notes = [f"# differs: {d}" for d in differences] or ["# every axis is reproduced exactly"]
    return "\n".join([f"# rlmap preset {name!r} as {target} settings", *notes, text])


def inverse_of(cfg: RecipeConfig, target: str) -> tuple[str, list[str]]:
    """``target``'s settings for any rlmap config (not only a preset), and what they cannot
    reproduce: the translation's inverse, for round trips of translated files."""
    text, differences = _module(target).inverse(cfg)
    return text, list(differences)


def differences_as(name: str, target: str) -> list[str]:
    """What ``target`` cannot reproduce of preset ``name`` (empty: all of it)."""
    from rlmap.recipes.catalog import registry

    return list(_module(target).inverse(registry.get(name).build())[1])
