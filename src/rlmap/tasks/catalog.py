"""What ``data.task`` can name, for ``rlmap tasks``: the built-in tasks, data files and
``datasets`` datasets, the environment adapters and reasoning-gym's tasks."""

from __future__ import annotations

import dataclasses
import json
import textwrap

from rlmap.core.errors import ConfigError
from rlmap.feedback.reasoning_gym import dataset, require
from rlmap.tasks import reasoning_gym, registry


def listing() -> str:
    """The built-in tasks, then reasoning-gym's by category (or how to install it)."""
    lines = ["built in (data.task=NAME):"]
    kinds = registry.kinds()
    listed = [row for name in kinds for row in kinds.get(name).listing]  # each kind's own lines
    lines += [f"  {name:<17} {what}" for name, what in listed]
    try:
        names = reasoning_gym.names()
    except ConfigError:
        lines += [
            "",
            "reasoning-gym: not installed (pip install reasoning-gym==0.1.25) — its "
            "106 procedural tasks then run as data.task=reasoning_gym:NAME",
        ]
        return "\n".join(lines) + "\n"
    from reasoning_gym.factory import DATASETS

    by_category: dict[str, list[str]] = {}
    for name in names:
        module = DATASETS[name][0].__module__.split(".")
        by_category.setdefault(module[1] if len(module) > 2 else "other", []).append(name)
    lines += [
        "",
        f"reasoning-gym, {len(names)} tasks (data.task=reasoning_gym:NAME, a mixture "
        "NAME*W+NAME2; rlmap tasks NAME shows one):",
    ]
    for category, members in sorted(by_category.items()):
        lines += textwrap.wrap(
            ", ".join(members),
            width=96,
            initial_indent=f"  {category}: ",
            subsequent_indent=" " * (len(category) + 4),
        )
    return "\n".join(lines) + "\n"


def describe(name: str) -> str:
    """A reasoning-gym task's settings (its config's fields and defaults) and one item."""
    require()
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        reasoning_gym.parse(reasoning_gym.PREFIX + name, None)  # the error names the closest
    config = DATASETS[name][1]
    fields = [f for f in dataclasses.fields(config) if f.name not in ("seed", "size")]
    settings = {f.name: _default(f) for f in fields}
    item = dataset(name, "{}", 0, 1)[0]
    lines = [f"reasoning_gym:{name}", "settings (data.task_args), with their defaults:"]
    lines += [f"  {k}: {json.dumps(v, default=str)}" for k, v in settings.items()]
    lines += [
        "example (seed 0):",
        *textwrap.wrap(
            f"question: {item['question']}", width=96, initial_indent="  ", subsequent_indent="    "
        ),
    ]
    lines += [f"  answer: {item['answer']}"]
    return "\n".join(lines + _levels(name)) + "\n"


def _levels(name: str) -> list[str]:
    """The settings of each level of the task's curriculum (``sampling.curriculum``)."""
    from reasoning_gym.factory import has_curriculum

    if not has_curriculum(name):
        return ["curriculum: none (sampling.curriculum needs one)"]
    top = reasoning_gym.top_level(name)
    lines = [f"curriculum (sampling.curriculum): levels 0-{top}, the settings it sets at each:"]
    for level in range(top + 1):
        args = reasoning_gym.level_args(name, {}, level)
        lines.append(f"  {level}: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in args.items()))
    return lines


def _default(f: dataclasses.Field[object]) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None
