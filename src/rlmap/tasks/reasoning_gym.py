"""reasoning-gym's procedural tasks as rlmap tasks: ``data.task=reasoning_gym:NAME``.

``reasoning_gym:chain_sum`` is one task; ``reasoning_gym:chain_sum+basic_arithmetic`` a
mixture, with optional weights ``chain_sum*3+basic_arithmetic`` (three chain sums to one
arithmetic problem). ``data.task_args`` holds the generator's settings: for one task its
config's fields (``{"min_terms": 2, "max_terms": 3}``); for a mixture a mapping from task
name to such fields.

Splits: reasoning-gym draws item ``i`` of a dataset with seed ``s`` from ``Random(s + i)``,
so two seeds a few apart share almost every item. The training and held-out items of a
task come from bases ``SPLIT_STRIDE`` apart (no index reaches the next base), and any
training question that is also a held-out one is dropped, as are repeats, so the splits are
disjoint in their questions, not only in their seeds.

Scoring: the task's own ``score_answer``. Its reference is the item's key (task, settings,
seed, index) as JSON, from which the item is regenerated exactly — metadata and all — in
whichever process scores it (the verifier runs in its isolation worker). reasoning-gym
gives partial credit on some tasks (a response *containing* the answer scores
len(answer)/len(response)); ``reasoning_gym`` counts only a full score (1 or 0, what
pass@k means), ``reasoning_gym_partial`` passes the score through as the reward.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlmap.core.errors import ConfigError
from rlmap.feedback.reasoning_gym import dataset, item_key, require
from rlmap.tasks.arithmetic import Example

PREFIX = "reasoning_gym:"
SPLIT_STRIDE = 10**9
"""Distance between the seed bases of the train and held-out items (larger than any size)."""
UNREPEATABLE = frozenset(
    {
        "isomorphic_strings",
        "knight_swap",
        "list_functions",
        "polynomial_multiplication",
        "ransom_note",
        "word_ladder",
    }
)
"""Tasks whose items differ between processes (measured under two ``PYTHONHASHSEED``
values; ``list_functions`` even within one): a resume, a second learner rank, a rollout
actor or a later ``rlmap eval`` would each see other items, so rlmap refuses them."""
_PART = re.compile(r"^([a-z0-9_]+)(?:\*(\d+(?:\.\d+)?))?$")


def is_reasoning_gym(task: str) -> bool:
    return task.startswith(PREFIX)


def names() -> list[str]:
    """Every task reasoning-gym registers, sorted."""
    require()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


@dataclass(frozen=True)
class Part:
    """One task of a mixture: its name, weight and generator settings."""

    name: str
    weight: float
    args: Mapping[str, Any]


def parse(task: str, task_args: Mapping[str, Any] | None) -> list[Part]:
    """The parts of ``data.task`` (``reasoning_gym:a*2+b``) with their ``data.task_args``;
    ConfigError naming the field on an unknown task, a bad weight or settings that the
    task's config does not take."""
    spec = task.removeprefix(PREFIX)
    known = set(names())
    parts, args = [], dict(task_args or {})
    pieces = spec.split("+")
    for piece in pieces:
        match = _PART.match(piece.strip())
        if match is None:
            raise ConfigError(f"data.task: {piece!r} in {task!r} is not NAME or NAME*WEIGHT")
        name, weight = match.group(1), float(match.group(2) or 1)
        if name not in known:
            close = sorted(known, key=lambda k: _distance(k, name))[:3]
            raise ConfigError(
                f"data.task: reasoning-gym has no task {name!r} (closest: "
                f"{', '.join(close)}; rlmap tasks lists them)"
            )
        if weight <= 0:
            raise ConfigError(f"data.task: weight of {name!r} must be > 0, got {weight:g}")
        if name in UNREPEATABLE:
            raise ConfigError(
                f"data.task: reasoning-gym's {name} does not generate the same "
                "items in every process (they depend on Python's hash seed), so "
                "a resume or a second process would see other items"
            )
        parts.append(Part(name, weight, {}))
    if len({p.name for p in parts}) < len(parts):
        raise ConfigError(f"data.task: a task appears twice in {task!r}")
    if len(parts) > 1:
        unknown = set(args) - {p.name for p in parts}
        if unknown:
            raise ConfigError(
                f"data.task_args: a mixture's settings are keyed by task name; "
                f"{sorted(unknown)[0]!r} is not one of its tasks"
            )
        for name, value in args.items():
            if not isinstance(value, Mapping):
                kind = type(value).__name__
                raise ConfigError(
                    f"data.task_args.{name}: a task's settings are a mapping "
                    f"of its config's fields, got {kind}"
                )
        parts = [Part(p.name, p.weight, dict(args.get(p.name) or {})) for p in parts]
    else:
        parts = [Part(parts[0].name, parts[0].weight, args)]
    for p in parts:
        dataset(p.name, json.dumps(dict(p.args), sort_keys=True), 0, 1)  # settings checked now
    return parts


def _distance(a: str, b: str) -> int:
    """Edit distance, for naming the closest task to a misspelt one."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def _counts(parts: list[Part], size: int) -> list[int]:
    """Items per part for ``size`` in all, in proportion to the weights (largest remainder)."""
    total = sum(p.weight for p in parts)
    exact = [size * p.weight / total for p in parts]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(parts)), key=lambda i: counts[i] - exact[i])
    for i in by_remainder[: size - sum(counts)]:
        counts[i] += 1
    return counts


def _items(part: Part, seed: int, size: int) -> list[Example]:
    args = json.dumps(dict(part.args), sort_keys=True)
    items = dataset(part.name, args, seed, size)
    out = []
    for index in range(size):
        item = items[index]
        key = item_key(part.name, args, seed, size, index)
        out.append(
            Example(
                prompt=str(item["question"]),
                answer=str(item["answer"]),
                reference=key,
                task=part.name,
            )
        )
    return out


@functools.lru_cache(maxsize=8)
def _splits(
    task: str, args: str, split_seed: int, train_size: int, eval_size: int
) -> tuple[tuple[Example, ...], tuple[Example, ...]]:
    parts = parse(task, json.loads(args))
    held, trained = (
        _shares(parts, eval_size, "data.eval_size", "held out"),
        _shares(parts, train_size, "data.train_size", "to train on"),
    )
    base = 2 * SPLIT_STRIDE * split_seed
    taken: set[str] = set()  # every held-out question first, then the training ones
    heldout = [
        e
        for part, n in zip(parts, held, strict=True)
        for e in _distinct(_items(part, base + SPLIT_STRIDE, n), taken)
    ]
    train = [
        e
        for part, n in zip(parts, trained, strict=True)
        for e in _distinct(_items(part, base, n), taken)
    ]
    return tuple(train), tuple(heldout)


def _shares(parts: list[Part], size: int, field: str, what: str) -> list[int]:
    """:func:`_counts` of ``size`` (``field``), or a ConfigError when a task would get no
    item: naming ``field`` when it is below one per task, else ``data.task`` and the weight
    whose share rounds to 0 (reasoning-gym would refuse a dataset of size 0, an error that
    reads as a fault of ``data.task_args``)."""
    if size < len(parts):
        raise ConfigError(
            f"{field}: {size} {what} for {len(parts)} tasks; each task needs one at least"
        )
    counts, total = _counts(parts, size), sum(p.weight for p in parts)
    for part, n in zip(parts, counts, strict=True):
        if n == 0:
            raise ConfigError(
                f"data.task: weight {part.weight:g} of {part.name!r} (of "
                f"{total:g} in all) leaves it none of the {size} items {what} "
                f"({field}); raise its weight or {field}"
            )
    return counts


def _distinct(examples: list[Example], taken: set[str]) -> list[Example]:
    """``examples`` without repeated questions or ones in ``taken``."""
    out = []
    for e in examples:
        if e.prompt not in taken:
            taken.add(e.prompt)
            out.append(e)
    return out


# ---------------------------------------------------------------- curricula


def _curriculum(name: str) -> Any:
    """A fresh instance of reasoning-gym's curriculum for ``name`` (its levels are state);
    ConfigError naming ``sampling.curriculum`` when the task has none."""
    require()
    from reasoning_gym.factory import create_curriculum, has_curriculum

    if not has_curriculum(name):
        raise ConfigError(
            f"sampling.curriculum: reasoning-gym's {name} has no curriculum "
            "(rlmap tasks lists the tasks; most have one)"
        )
    return create_curriculum(name)


def curriculum_fields(name: str) -> list[str]:
    """The settings (``data.task_args`` fields) that the curriculum of ``name`` sets."""
    out = []
    for attr in _curriculum(name).attributes.values():
        lower, upper = (
            getattr(attr, "lower_field_name", None),
            getattr(attr, "upper_field_name", None),
        )
        out += [lower, upper] if lower and upper else [attr.field_name]
    return out


def top_level(name: str) -> int:
    """The highest global level of the curriculum of ``name`` (its longest attribute's)."""
    return max(len(a.levels) - 1 for a in _curriculum(name).attributes.values())


def level_args(name: str, args: Mapping[str, Any], level: int) -> dict[str, Any]:
    """``args`` with the curriculum's fields at global ``level`` (reasoning-gym's
    ``set_global_level``: every attribute at that level or its highest; a range from the
    lowest level's value up to this one's)."""
    curriculum = _curriculum(name)
    curriculum.set_global_level(level)
    config = curriculum.generate_configuration(defaults={})
    return dict(args) | {f: getattr(config, f) for f in curriculum_fields(name)}


@dataclass(frozen=True)
class LevelPools:
    """The training prompts of each level of a reasoning-gym task's curriculum; the
    held-out items are those of ``data.task_args``, which hold the top level's settings."""

    task: str
    """``data.task`` (``reasoning_gym:NAME``, a weight allowed)."""
    name: str
    """The reasoning-gym task's name."""
    args: str
    """``data.task_args`` as JSON: the settings at the top level."""
    split_seed: int
    train_size: int
    eval_size: int
    top: int

    @property
    def fields(self) -> list[str]:
        """The settings the curriculum sets."""
        return curriculum_fields(self.name)

    def settings(self, level: int) -> dict[str, Any]:
        """The generator's settings at ``level``."""
        return level_args(self.name, json.loads(self.args), level)

    def pool(self, level: int) -> list[Example]:
        """``train_size`` items generated at ``level`` from the training seeds, without
        repeats or a held-out question; at the top level, the run's training split."""
        return list(_level_pool(self, level))


@functools.lru_cache(maxsize=32)
def _level_pool(pools: LevelPools, level: int) -> tuple[Example, ...]:
    _, heldout = _splits(
        pools.task, pools.args, pools.split_seed, pools.train_size, pools.eval_size
    )
    taken = {e.prompt for e in heldout}
    part = Part(pools.name, 1.0, pools.settings(level))
    base = 2 * SPLIT_STRIDE * pools.split_seed  # as _splits: the training seeds
    train = _distinct(_items(part, base, pools.train_size), taken)
    if not train:
        raise ConfigError(
            f"sampling.curriculum: level {level} of {pools.task} has no training "
            "question that is not held out; raise data.train_size"
        )
    return tuple(train)


def make_splits(
    task: str,
    task_args: Mapping[str, Any] | None,
    split_seed: int,
    train_size: int,
    eval_size: int,
) -> tuple[list[Example], list[Example]]:
    """(train, held-out) examples of a reasoning-gym task or mixture: disjoint questions
    (module docstring); each example's ``task`` is its reasoning-gym task. A ConfigError
    when the task's questions run out before one training prompt is left."""
    args = json.dumps(dict(task_args or {}), sort_keys=True)
    train, heldout = _splits(task, args, split_seed, train_size, eval_size)
    if not train:
        raise ConfigError(
            f"data.task: {task} has no training question left that is not "
            "held out; lower data.eval_size or widen data.task_args"
        )
    return list(train), list(heldout)
