"""Gymnasium environments with text observations (``data.task=gym:ENV_ID``; one action per
turn, the environment's own reward; :mod:`rlmap.tasks.gym_text`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rlmap.tasks import gym_text
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvFactory
from rlmap.tasks.kind import DataSettings, Labelled, Scoring, Split, TaskKind

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

OBSERVATION_SLACK = 16
"""Tokens an observation may take beyond the first one's (a line, a longer number)."""


def splits(d: DataSettings) -> tuple[list[Example], list[Example]]:
    """Train and held-out episodes: their reset seeds."""
    return gym_text.splits(d.task, d.split_seed, d.train_size, d.eval_size)


def prompts(d: DataSettings) -> list[Labelled]:
    """All episodes begin alike: the first one's text stands for all."""
    train, _ = splits(d)
    env = gym_text.make(d.task, d.task_args)
    return [
        (f"data.task={d.task} episode {train[0].reference}", gym_text.first_text(env, train[0]))
    ]


def environment(
    tokenizer: PreTrainedTokenizerBase, d: DataSettings, scoring: Scoring
) -> EnvFactory:
    """The environment's own reward: no verifier."""
    return gym_text.factory(tokenizer, d.task, d.task_args, d.max_turns)


def check_settings(d: DataSettings, model_path: str) -> Iterator[str]:
    """An unknown environment or settings it refuses: a ConfigError."""
    gym_text.check(d.task, d.task_args)
    yield from ()


def context_need(
    d: DataSettings, tokenizer: PreTrainedTokenizerBase, longest: int, turn: int
) -> int:
    """The first prompt, then ``data.max_turns`` responses, each followed by an observation
    (taken as long as the first one, plus ``OBSERVATION_SLACK``; the one after the last turn
    stays in the final state)."""
    _, first = gym_text.opening(gym_text.make(d.task, d.task_args), splits(d)[0][0])
    observation = len(tokenizer(first, add_special_tokens=False)["input_ids"]) + OBSERVATION_SLACK
    return longest + d.max_turns * (turn + observation)


def demonstrations(split: Split) -> list[Example]:
    """Nothing to imitate."""
    return []


def warm_start(chat: bool) -> dict[str, Any]:
    """No supervised steps: the model starts from its initialisation."""
    return {"steps": 0, "blur_steps": 0}


GYM = TaskKind(
    name="gym",
    matches=gym_text.is_gym,
    splits=splits,
    prompts=prompts,
    environment=environment,
    check_settings=check_settings,
    context_need=context_need,
    fits_context=True,
    templated=False,
    multi_turn=True,
    own_reward=True,
    prose=True,
    demonstrations=demonstrations,
    warm_start=warm_start,
    listing=(("gym:ENV_ID", "a gymnasium environment, one action per turn (gym:FrozenLake-v1)"),),
)
