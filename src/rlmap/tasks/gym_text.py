"""Gymnasium environments as multi-turn tasks: ``data.task=gym:ENV_ID``.

Each policy turn is one action; the environment's next observation is appended as tokens
(action mask 0) and the episode goes on until gymnasium says ``terminated`` or
``truncated`` — carried through unchanged to the credit axis, whose terminal-vs-truncation
handling bootstraps a truncated episode from its final state and a terminated one from 0
— or until ``data.max_turns`` policy turns have been taken (then truncated too). The
episode's return is the sum of gymnasium's step rewards.

Text in, text out:

- An environment whose observations are strings (a text environment following the
  ``reset()`` / ``step(action)`` API) passes them through, and gets each turn's text as its
  action.
- One with a ``Discrete`` action space (gymnasium's toy-text environments: FrozenLake,
  Taxi, CliffWalking, Blackjack) gets the response's first integer as its action. Its
  observation is shown as ``state <obs>``, followed by its ANSI rendering with the colour
  codes stripped and the highlighted cell (the agent's) as ``*``.

A response that names no valid action is the policy's mistake: the environment is not
stepped, the observation says so (counted as a tool error) and the turn is spent. A failure
of the environment itself — ``gymnasium.make``, ``reset`` or ``step`` raising — is
infrastructure: the episode is aborted, excluded and counted, never scored 0.

Episodes are numbered: training episode ``i`` resets with seed ``i``, held-out episode ``i``
with seed ``SPLIT_STRIDE + i`` (with ``data.split_seed`` moving both), so the two sets of
start states never share a seed. ``data.task_args`` holds ``gymnasium.make``'s keyword
arguments (``{"is_slippery": false}``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlmap.core.errors import ConfigError, first_line
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvStep
from rlmap.tasks.prompts import decode_response

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PREFIX = "gym:"
SPLIT_STRIDE = 10**9
_ANSI_HIGHLIGHT = re.compile(r"\x1b\[4\dm(.)\x1b\[0m")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_INTEGER = re.compile(r"-?\d+")
INSTRUCTION = "Act in {name}. Answer each observation with one action{choices}.\n"


def is_gym(task: str) -> bool:
    return task.startswith(PREFIX)


def require() -> Any:
    try:
        import gymnasium
    except ImportError:
        raise ConfigError(
            "data.task: gym tasks need gymnasium (pip install gymnasium==1.4.0)"
        ) from None
    return gymnasium


def make(task: str, task_args: Mapping[str, Any] | None) -> Any:
    """A fresh gymnasium environment for ``data.task=gym:ID``: rendering as text (``ansi``)
    when it can; ConfigError naming the field when gymnasium does not know the id or
    refuses the arguments."""
    gym = require()
    env_id = task.removeprefix(PREFIX)
    args = dict(task_args or {})
    try:
        spec = gym.spec(env_id)
    except Exception as exc:  # gymnasium's own error classes for unknown and deprecated ids
        raise ConfigError(
            f"data.task: gymnasium has no environment {env_id!r} ({first_line(exc)})"
        ) from None
    modes = (spec.kwargs.get("render_modes") or _render_modes(spec)) if spec else ()
    if "ansi" in modes and "render_mode" not in args:
        args["render_mode"] = "ansi"
    try:
        return gym.make(env_id, **args)
    except Exception as exc:  # the environment's constructor: anything it raises
        raise ConfigError(
            f"data.task_args: gymnasium's {env_id} refuses them ({first_line(exc)})"
        ) from None


def _render_modes(spec: Any) -> tuple[str, ...]:
    entry = spec.entry_point
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        cls = getattr(__import__(module, fromlist=[name]), name, None)
    else:
        cls = entry
    return tuple(getattr(cls, "metadata", {}).get("render_modes", ()))


def check(task: str, task_args: Mapping[str, Any] | None) -> None:
    """ConfigError now when the environment cannot be made, or has neither text
    observations nor a discrete action space."""
    env = make(task, task_args)
    try:
        obs, _ = env.reset(seed=0)
        if not isinstance(obs, str) and _choices(env) is None:
            raise ConfigError(
                f"data.task: {task} has neither text observations nor a "
                "discrete action space; rlmap cannot put it into words"
            )
    finally:
        env.close()


def _choices(env: Any) -> range | None:
    """The actions of a ``Discrete`` action space, else None."""
    space = env.action_space
    n, start = getattr(space, "n", None), getattr(space, "start", 0)
    if n is None or type(space).__name__ != "Discrete":
        return None
    return range(int(start), int(start) + int(n))


def observation_text(env: Any, obs: Any) -> str:
    """An observation as text (module docstring)."""
    if isinstance(obs, str):
        return obs
    text = f"state {obs}"
    if getattr(env, "render_mode", None) == "ansi":
        frame = str(env.render())
        frame = _ANSI.sub("", _ANSI_HIGHLIGHT.sub("*", frame))
        text += "\n" + frame.strip("\n")
    return text + "\n"


def splits(
    task: str, split_seed: int, train_size: int, eval_size: int
) -> tuple[list[Example], list[Example]]:
    """(train, held-out) episodes: each an Example whose ``reference`` is its reset seed
    and whose ``prompt`` names the task (the text the model sees comes from the
    environment)."""
    base = 2 * SPLIT_STRIDE * split_seed
    name = task.removeprefix(PREFIX)

    def episode(seed: int) -> Example:
        return Example(prompt=f"{name} episode {seed}", answer="", reference=str(seed))

    train = [episode(base + i) for i in range(train_size)]
    heldout = [episode(base + SPLIT_STRIDE + i) for i in range(eval_size)]
    return train, heldout


def opening(env: Any, example: Example) -> tuple[str, str]:
    """(instruction, first observation) of ``example``'s episode (resets ``env``)."""
    obs, _ = env.reset(seed=int(example.reference or 0))
    choices = _choices(env)
    shown = "" if choices is None else f" ({choices.start}-{choices.stop - 1})"
    intro = INSTRUCTION.format(name=example.prompt.split(" episode")[0], choices=shown)
    return intro, observation_text(env, obs)


def first_text(env: Any, example: Example) -> str:
    """The prompt of ``example``'s episode: the instruction, then the first observation."""
    return "".join(opening(env, example))


class GymTextEnv:
    """One episode of a gymnasium environment, in tokens (module docstring).

    ``replayable``: it resets a fresh environment with the episode's seed, so the same
    actions give the same observations (:mod:`rlmap.tasks.env`) — unless gymnasium's spec
    says the environment is nondeterministic even when seeded (:func:`deterministic`)."""

    stop_token_ids: tuple[int, ...] = ()
    waits = False  # toy-text environments step in microseconds; a service would say True

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        example: Example,
        make_env: Callable[[], Any],
        *,
        max_turns: int,
        replayable: bool = True,
    ) -> None:
        self.tokenizer, self.example, self.make_env = tokenizer, example, make_env
        self.max_turns = max_turns
        self.replayable = replayable
        self.turns = 0
        self.env: Any = None

    def reset(self) -> list[int]:
        self.env = self.make_env()
        return self._encode(first_text(self.env, self.example), first=True)

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        self.turns += 1
        out_of_turns = self.turns >= self.max_turns
        text = decode_response(self.tokenizer, tuple(action_ids))
        action = self._action(text)
        if action is None:
            choices = _choices(self.env)
            hint = "" if choices is None else f" {choices.start}-{choices.stop - 1}"
            return EnvStep(
                observation=tuple(self._encode(f"invalid action; answer{hint}\n")),
                truncated=out_of_turns,
                tool_call=True,
                tool_error=True,
            )
        obs, reward, terminated, truncated, _ = self.env.step(action)
        if terminated or truncated or out_of_turns:
            self.env.close()
        return EnvStep(
            observation=tuple(self._encode(observation_text(self.env, obs))),
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated) or (out_of_turns and not terminated),
        )

    def _action(self, text: str) -> Any:
        choices = _choices(self.env)
        if choices is None:
            return text
        found = _INTEGER.search(text)
        if found is None or int(found.group()) not in choices:
            return None
        return int(found.group())

    def _encode(self, text: str, *, first: bool = False) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=first)["input_ids"]
        return [int(i) for i in ids]


def factory(
    tokenizer: PreTrainedTokenizerBase,
    task: str,
    task_args: Mapping[str, Any] | None,
    max_turns: int,
) -> Callable[[Example], GymTextEnv]:
    """The environment maker of a gym task."""
    args = json.dumps(dict(task_args or {}), sort_keys=True)
    make_env = functools.partial(make, task, json.loads(args))
    seeded = deterministic(task)
    return lambda e: GymTextEnv(tokenizer, e, make_env, max_turns=max_turns, replayable=seeded)


def deterministic(task: str) -> bool:
    """Whether ``data.task=gym:ID`` replays from its seed: gymnasium's spec does not mark it
    ``nondeterministic`` (an environment with randomness outside its seeded ``np_random``);
    False for an id gymnasium does not know (:func:`make` says why, naming the field)."""
    try:
        spec = require().spec(task.removeprefix(PREFIX))
    except Exception:  # gymnasium's own error classes for unknown and deprecated ids
        return False
    return not bool(getattr(spec, "nondeterministic", False))
