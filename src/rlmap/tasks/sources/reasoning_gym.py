"""reasoning-gym's procedural tasks (``data.task=reasoning_gym:NAME``, or a mixture
``NAME*W+NAME2``; :mod:`rlmap.tasks.reasoning_gym`), scored by their own ``score_answer``
on the item's key, with a curriculum of levels (``sampling.curriculum``)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from rlmap.core.errors import ConfigError
from rlmap.feedback.reasoning_gym import dataset
from rlmap.tasks import reasoning_gym
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.kind import DataSettings, Labelled, Split, TaskKind, numbered_prompts

SFT_BATCH = 32
"""The character-level model's warm-start batch on a reasoning-gym task (the chat model's is
the default 128). Its prompts are prose, a character a token, ~7 times an arithmetic
prompt's tokens, so a batch of 128 would take about 15 minutes here; 32 is affordable but
learns too little for RL to build on (docs/tasks.md: 0.08 held-out after 400 steps, where
128 reaches 0.57)."""

PROSE_MODEL = "embedded:tiny-chat"
"""The embedded model a reasoning-gym task gets when the run names none: the chat model
(a byte-level BPE trained on the task's text too), the one that learns its prose; the
character-level default stalls there (docs/tasks.md, "What the embedded models learn")."""


def splits(d: DataSettings) -> tuple[list[Example], list[Example]]:
    """The task's (train, held-out) items: disjoint questions."""
    return reasoning_gym.make_splits(d.task, d.task_args, d.split_seed, d.train_size, d.eval_size)


def prompts(d: DataSettings) -> list[Labelled]:
    """``data.task=<task> example <i>`` for each train, then held-out, item."""
    return numbered_prompts(d, *splits(d))


def check_settings(d: DataSettings, model_path: str) -> Iterator[str]:
    """``data.task_args`` the generator refuses, or an unknown task: a ConfigError."""
    reasoning_gym.parse(d.task, d.task_args)  # a ConfigError naming the field
    yield from ()


def demonstrations(split: Split) -> list[Example]:
    """The warm start imitates the task's own training items."""
    return reasoning_gym.make_splits(
        split.task, split.task_args, split.split_seed, split.train_size, split.eval_size
    )[0]


def chat_corpus(split: Split) -> list[str]:
    """The chat tokenizer learns the training questions and answers too (a token a word,
    not one a byte)."""
    train, _ = reasoning_gym.make_splits(
        split.task, split.task_args, split.split_seed, split.train_size, split.eval_size
    )
    return [text for e in train for text in (e.prompt, e.answer)]


def warm_start(chat: bool) -> dict[str, Any]:
    """A smaller batch on the character-level model (prose a character a token)."""
    return {} if chat else {"batch_size": SFT_BATCH}


def note(task: str, model: str, task_args: Mapping[str, Any] | None) -> str | None:
    """On an embedded model: which model it trains (the chat model may have been picked for
    it), and, at the task's own settings, written for large models, that they may be beyond
    it — a newcomer's first run would otherwise learn nothing without a word."""
    if not model.startswith("embedded:"):
        return None
    said = f"note: {task} trains {model} (model.path names another)"
    if task_args:
        return said
    return (
        f"{said}; at the task's own settings (data.task_args unset), which may be beyond "
        "it: docs/tasks.md gives settings it learns (chain_sum: +22 points in 200 steps)"
    )


class Curriculum:
    """reasoning-gym's own curriculum of one task (not a mixture's)."""

    def check(self, d: DataSettings, sampling: Any, mode: str) -> Iterator[str]:
        """The curriculum's settings against the task's levels, one line each."""
        s = sampling
        if "+" in d.task:
            yield (
                f"sampling.curriculum: drives one reasoning-gym task's own curriculum, not "
                f"{d.task!r} (each task of a mixture would need its own)"
            )
            return
        if mode == "async":
            yield (
                "sampling.curriculum: its level moves at the learner's steps, which the "
                "asynchronous workers run ahead of; use system.mode=sync"
            )
            return
        name = reasoning_gym.parse(d.task, {})[0].name  # unknown: data.task's ConfigError
        top, highest = s.curriculum_top, reasoning_gym.top_level(name)  # a ConfigError if none
        if top is None or not 0 <= s.curriculum_start <= top <= highest:
            yield (
                f"sampling.curriculum_start, curriculum_top: need 0 <= start <= top <= "
                f"{highest} ({name}'s highest), got {s.curriculum_start} and "
                f"{top}"
            )
            return
        if not 0 <= s.curriculum_down < s.curriculum_up <= 1:
            yield (
                f"sampling.curriculum_down, curriculum_up: need 0 <= down < up <= 1, got "
                f"{s.curriculum_down} and {s.curriculum_up}"
            )
        if s.curriculum_window < 1:
            yield f"sampling.curriculum_window: must be >= 1, got {s.curriculum_window}"
        yield from _refused_levels(name, d.task_args, top)

    def target(
        self, task: str, task_args: Mapping[str, Any] | None, top: int | None
    ) -> tuple[dict[str, Any], int] | None:
        """(``data.task_args`` at level ``top`` — None: the highest —, that level); None
        for a mixture, an unknown task or one without a curriculum (validation says why).
        Given settings that disagree with the level are a ConfigError naming the field."""
        if "+" in task:
            return None
        try:
            name = reasoning_gym.parse(task, {})[0].name  # chain_sum*3 is chain_sum
            top = reasoning_gym.top_level(name) if top is None else top
        except ConfigError:
            return None
        if top < 0:
            return None  # validate names the field
        given = dict(task_args or {})
        target = reasoning_gym.level_args(name, given, top)
        for field in reasoning_gym.curriculum_fields(name):
            if field in given and given[field] != target[field]:
                raise ConfigError(
                    f"data.task_args.{field}: the curriculum sets it "
                    f"({target[field]!r} at level {top}, "
                    f"sampling.curriculum_top), not {given[field]!r}; "
                    "leave it out"
                )
        return target, top

    def levels(self, d: DataSettings, top: int) -> reasoning_gym.LevelPools:
        """The training prompts of each level up to ``top``."""
        name = reasoning_gym.parse(d.task, {})[0].name
        return reasoning_gym.LevelPools(
            d.task,
            name,
            json.dumps(d.task_args or {}, sort_keys=True),
            d.split_seed,
            d.train_size,
            d.eval_size,
            top,
        )


def _refused_levels(name: str, task_args: Mapping[str, Any] | None, top: int) -> Iterator[str]:
    """The first level up to ``top`` whose settings the generator refuses (a curriculum's
    top levels can be settings it refuses)."""
    for level in range(top + 1):
        args = reasoning_gym.level_args(name, task_args or {}, level)
        try:
            dataset(name, json.dumps(args, sort_keys=True), 0, 1)
        except ConfigError as exc:
            why = str(exc).split("refuses its settings ", 1)[-1]
            yield (
                f"sampling.curriculum_top: reasoning-gym's {name} refuses its level "
                f"{level} settings {why}; lower curriculum_top below {level}"
            )
            return


REASONING_GYM = TaskKind(
    name="reasoning_gym",
    matches=reasoning_gym.is_reasoning_gym,
    splits=splits,
    prompts=prompts,
    check_settings=check_settings,
    fits_context=True,
    items=True,
    default_verifier="reasoning_gym",
    prose=True,
    chat_corpus=chat_corpus,
    demonstrations=demonstrations,
    warm_start=warm_start,
    embedded_model=PROSE_MODEL,
    note=note,
    curriculum=Curriculum(),
)
