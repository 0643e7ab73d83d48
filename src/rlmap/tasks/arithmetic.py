"""The embedded single-turn task: integer arithmetic, checked by an exact verifier.

``37+85=`` → ``122``. Difficulty grows with the number of digits and the set of
operators. Train and held-out splits are drawn from one seeded stream of distinct
problems, so they are disjoint by construction.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass(frozen=True)
class Example:
    """One prompt and its reference answer."""

    prompt: str
    """What the policy sees, e.g. ``37+85=``."""
    answer: str
    """The exact expected response, e.g. ``122``."""
    reference: str | None = None
    """What a verifier that reads items rather than answers checks against (a
    reasoning-gym item's key); None: the answer."""
    task: str = ""
    """The task it comes from, when a run mixes several (``eval/<task>/pass@1``)."""
    messages: tuple[tuple[str, str], ...] | None = None
    """A chat-format prompt: its (role, content) messages, rendered with the model's chat
    template; ``prompt`` is then the last user message. None: the prompt is ``prompt``."""
    lead: str = ""
    """A demonstration's: text its answer's turn starts with, part of the prompt, not trained
    on (a compaction summary's lead, :data:`rlmap.tasks.env.SUMMARY_LEAD`)."""

    @property
    def chat(self) -> str | tuple[tuple[str, str], ...]:
        """What is encoded as the prompt: the messages, else the prompt text."""
        return self.prompt if self.messages is None else self.messages


def make_problem(a: int, op: str, b: int) -> Example:
    """The example ``a op b =`` with its exact answer."""
    return Example(prompt=f"{a}{op}{b}=", answer=str(OPERATORS[op](a, b)))


def make_splits(
    seed: int, train_size: int, eval_size: int, *, max_digits: int = 2, ops: str = "+-"
) -> tuple[list[Example], list[Example]]:
    """Disjoint (train, held-out) lists of distinct problems from one seeded stream.

    Operands have 1..``max_digits`` digits; raises ValueError when the space of
    distinct problems is smaller than ``train_size + eval_size``.
    """
    unknown = set(ops) - set(OPERATORS)
    if unknown:
        known = "".join(OPERATORS)
        raise ValueError(f"data.ops: unknown operators {sorted(unknown)}; known: {known}")
    high = 10**max_digits - 1
    space = len(ops) * (high + 1) ** 2
    need = train_size + eval_size
    if need > space:
        raise ValueError(f"data: {need} distinct problems asked, only {space} exist")
    rng = random.Random(seed)
    seen: dict[str, Example] = {}
    while len(seen) < need:
        example = make_problem(rng.randint(0, high), rng.choice(ops), rng.randint(0, high))
        seen.setdefault(example.prompt, example)
    examples = list(seen.values())
    return examples[eval_size:], examples[:eval_size]
