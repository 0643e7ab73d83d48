"""``rlmap advise`` with no flags: the task profile asked for interactively, one question at a
time, a bad answer asked again, Enter or end of input keeping the default. The advice itself
is :mod:`rlmap.advise.advice` (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from rlmap.recipes.selection import (
    Barrier,
    TaskProfile,
    Verifier,
)


@dataclass(frozen=True)
class Prompt:
    """One interactive question about the task."""

    question: int
    """Which of the six questions it informs."""
    field: str
    """The :class:`TaskProfile` field it sets."""
    text: str
    parse: Callable[[str], Any]
    """Reads an answer; raises ValueError on a bad one (the prompt is asked again)."""


def _yes_no(raw: str) -> bool:
    if raw.lower() in ("y", "yes"):
        return True
    if raw.lower() in ("n", "no"):
        return False
    raise ValueError("answer y or n")


def _one_of(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"answer one of: {', '.join(options)}")
        return raw

    return parse


def _tokens(raw: str) -> int | None:
    if raw.lower() in ("?", "unknown"):
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError("answer a number of tokens (or 'unknown')")
    return int(raw)


PROMPTS: tuple[Prompt, ...] = (
    Prompt(
        1,
        "verifier",
        f"What checks a response? ({'/'.join(get_args(Verifier))})",
        _one_of(get_args(Verifier)),
    ),
    Prompt(2, "cheap_samples", "Are many samples of the same prompt cheap?", _yes_no),
    Prompt(2, "rare_correct", "Are correct samples extremely rare?", _yes_no),
    Prompt(3, "multi_turn", "Several turns per episode (tools, an environment)?", _yes_no),
    Prompt(3, "response_length", "Typical response length in tokens?", _tokens),
    Prompt(3, "long_context", "Do contexts exceed the model's window?", _yes_no),
    Prompt(3, "critic_unstable", "Has a value critic been clearly unstable?", _yes_no),
    Prompt(4, "separate_rollout", "Are rollout and learner separate processes?", _yes_no),
    Prompt(4, "moe_routing_mismatch", "MoE with routing that differs train/rollout?", _yes_no),
    Prompt(
        6, "barrier", "How severe is the group barrier? (mild/severe)", _one_of(get_args(Barrier))
    ),
)


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return "Y/n" if default else "y/N"
    return "unknown" if default is None else str(default)


def ask_profile(ask: Callable[[str], str] | None = None) -> TaskProfile:
    """Ask for the task, question by question (``ask`` defaults to :func:`input`); Enter
    keeps the default shown, end of input keeps the defaults of the remaining questions."""
    ask = ask or input  # looked up at call time, so a test can stand in for the terminal
    values: dict[str, Any] = {}
    try:
        for prompt in PROMPTS:
            values[prompt.field] = _ask_one(prompt, ask)
    except EOFError:
        pass
    return TaskProfile(**values)


def _ask_one(prompt: Prompt, ask: Callable[[str], str]) -> Any:
    default = getattr(TaskProfile(), prompt.field)
    while True:
        raw = ask(f"[{prompt.question}] {prompt.text} [{_shown(default)}] ").strip()
        if not raw:
            return default
        try:
            return prompt.parse(raw)
        except ValueError as exc:
            print(f"    {exc}")  # and ask again
