"""``rlmap translate``: another framework's config as an rlmap config, with a report.

Each framework has a module holding its mapping table as data (a tuple of
:class:`~rlmap.recipes.translate.rows.Mapping` rows: source key, the framework's default
with where it is set, a converter to rlmap fields, exact / approximate / none, and why;
the converters several frameworks share are in :mod:`.rows`), and an inverse for
``rlmap explain --as`` (:class:`Framework`). Translation reads the
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
from rlmap.recipes.build import build_config
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.translate.rows import NULL, Mapping
from rlmap.runs.rundir import read_yaml


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


FRAMEWORKS = ("verl", "trl", "openrlhf", "prime-rl", "skyrl")
READY = FRAMEWORKS
"""The frameworks with a table so far; the others are refused by name."""


@dataclasses.dataclass(frozen=True)
class Framework:
    """What translating one framework's files takes, and the way back."""

    table: Callable[[int, dict[str, Any]], tuple[Mapping, ...]]
    """Its rows for ``world_size`` processes and the file's flat keys."""
    read: Callable[[Path], dict[str, Any]]
    """Its file as flat dotted keys."""
    inverse: Callable[[RecipeConfig], tuple[str, list[str]]]
    """Its settings for an rlmap config, and what they cannot reproduce."""


def _framework(source: str) -> Framework:
    from rlmap.recipes.translate import (
        openrlhf,
        openrlhf_flags,
        openrlhf_inverse,
        prime_rl,
        skyrl,
        skyrl_inverse,
        trl,
        trl_inverse,
        verl,
        verl_inverse,
    )

    frameworks = {
        "verl": Framework(verl.table, verl.read, verl_inverse.inverse),
        "trl": Framework(trl.table, trl.read, trl_inverse.inverse),
        "prime-rl": Framework(prime_rl.table, prime_rl.read, prime_rl.inverse),
        "skyrl": Framework(skyrl.table, skyrl.read, skyrl_inverse.inverse),
        "openrlhf": Framework(openrlhf.table, openrlhf_flags.read, openrlhf_inverse.inverse),
    }
    if source not in frameworks:
        raise ConfigError(f"--from {source}: not translated yet (ready: {', '.join(READY)})")
    return frameworks[source]


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
    return resolve(_framework(source).read(p), p)


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
    flat = read(path, source)
    try:
        fields, rows = run_table(_framework(source).table(world_size, flat), flat)
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

    text, differences = _framework(target).inverse(registry.get(name).build())
    notes = [f"# differs: {d}" for d in differences] or ["# every axis is reproduced exactly"]
    return "\n".join([f"# rlmap preset {name!r} as {target} settings", *notes, text])


def inverse_of(cfg: RecipeConfig, target: str) -> tuple[str, list[str]]:
    """``target``'s settings for any rlmap config (not only a preset), and what they cannot
    reproduce: the translation's inverse, for round trips of translated files."""
    text, differences = _framework(target).inverse(cfg)
    return text, list(differences)


def differences_as(name: str, target: str) -> list[str]:
    """What ``target`` cannot reproduce of preset ``name`` (empty: all of it)."""
    from rlmap.recipes.catalog import registry

    return list(_framework(target).inverse(registry.get(name).build())[1])
