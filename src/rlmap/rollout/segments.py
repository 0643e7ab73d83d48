"""Segments: an episode that outgrows the model's context goes on in a new one.

``data.context_policy`` says what happens when the next turn would not fit
(``engine.max_len``): ``fail`` ends the episode TRUNCATED (the default); ``truncate_oldest``
closes the current *segment* and opens the next one, whose context is the prompt plus
the newest whole (turn + observation) pairs that fit — the oldest turns dropped, the
environment not reset. Each segment is its own training row (``Episode.segments``,
``Batch.episode_id``/``Batch.segment``); credit crosses the boundary as docs/formulas.md
§2.5 says (:mod:`rlmap.estimators.segments`).

The next segment's context is built by a :data:`ContextBuilder`, or, under ``compact``,
written by the policy (:class:`Compaction`): at the boundary it is asked for a summary —
its turn starts with the task's lead (``TaskKind.summary_lead``, e.g. ``summary: ``) — and
the next segment's context is the prompt, the lead and the summary, and the newest
observation (the one the policy has not answered yet). The summary is a turn of the closing
segment: actions, trained with the credit of what follows (docs/formulas.md §2.5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from rlmap.core.errors import ConfigError
from rlmap.tasks.registry import kind_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Pair = tuple[int, ...]
"""One policy turn's tokens followed by the observation that answered it."""

ContextBuilder = Callable[[Sequence[Pair], int], tuple[int, ...]]
"""``build(pairs, room)``: the tokens the next segment's context holds after the prompt,
at most ``room`` of them, from the episode's (turn + observation) pairs so far, oldest
first."""


def newest_turns(pairs: Sequence[Pair], room: int) -> tuple[int, ...]:
    """``truncate_oldest``: the newest whole pairs whose tokens fit in ``room``, in order
    (none when even the newest does not fit). A pair is never split: a turn without the
    observation that answered it, or an observation without its call, would show the
    policy a state no episode passes through."""
    kept: list[Pair] = []
    used = 0
    for pair in reversed(pairs):
        if used + len(pair) > room:
            break
        kept.append(pair)
        used += len(pair)
    return tuple(t for pair in reversed(kept) for t in pair)


@dataclass(frozen=True)
class Compaction:
    """``data.context_policy=compact``: at a boundary the policy writes the next segment's
    context. A segment closes when its context leaves no room for another turn and a whole
    summary (``engine.max_len`` − context < ``max_new_tokens`` + lead + ``max_tokens``); the
    summary is then sampled after ``lead`` in the room left, at most ``max_tokens``."""

    lead: tuple[int, ...]
    """The request: the ids the summary turn starts with (context, not actions)."""
    max_tokens: int
    """The most tokens a summary may take (``data.summary_tokens``)."""

    def reserve(self, max_new_tokens: int) -> int:
        """Positions a segment's context must leave free: a turn, then a whole summary."""
        return max_new_tokens + len(self.lead) + self.max_tokens


ContextPolicy = ContextBuilder | Compaction
"""How the next segment's context is made: built from the episode's pairs, or written by
the policy."""

CONTEXT_POLICIES: Mapping[str, ContextBuilder | None] = MappingProxyType(
    {"fail": None, "truncate_oldest": newest_turns}
)
"""``data.context_policy`` → the builder of the next segment's context; None: no segments
(the episode ends truncated when the context is full). ``compact`` is
:func:`run_context_policy`'s: it needs the tokenizer and the task's lead."""


def context_builder(policy: str) -> ContextBuilder | None:
    """The builder of ``data.context_policy`` (None for ``fail``)."""
    if policy not in CONTEXT_POLICIES:
        known = ", ".join([*CONTEXT_POLICIES, "compact"])
        raise ConfigError(f"data.context_policy: '{policy}' is not built here; built: {known}")
    return CONTEXT_POLICIES[policy]


class ContextSettings(Protocol):
    """The fields of the ``data`` section a context policy reads."""

    @property
    def task(self) -> str: ...
    @property
    def context_policy(self) -> str: ...
    @property
    def summary_tokens(self) -> int: ...


def run_context_policy(
    data: ContextSettings, tokenizer: PreTrainedTokenizerBase
) -> ContextPolicy | None:
    """A run's ``data.context_policy``: ``compact`` with its task's lead in the run's ids
    (``TaskKind.summary_lead``) and ``data.summary_tokens``; the others' builders."""
    if data.context_policy != "compact":
        return context_builder(data.context_policy)
    lead = tokenizer.encode(kind_of(data.task).summary_lead, add_special_tokens=False)
    return Compaction(tuple(int(i) for i in lead), data.summary_tokens)


def given(ids: tuple[int, ...]) -> ContextBuilder:
    """The builder of a context already made (a summary the policy wrote, and what follows)."""
    return lambda pairs, room: ids


def newest_observation(tokens: Sequence[int], action: Sequence[bool]) -> tuple[int, ...]:
    """The tokens after the last action token: the observation the policy has not answered."""
    end = len(tokens)
    while end and not action[end - 1]:
        end -= 1
    return tuple(tokens[end:])


def turn_pairs(tokens: Sequence[int], turn_ids: Sequence[int]) -> list[Pair]:
    """The (turn + observation) pairs of a response: cut where a policy turn starts
    (``turn_ids`` ≥ 0 and not the previous token's turn); tokens before the first turn, if
    any, lead the first pair."""
    starts = [j for j, t in enumerate(turn_ids) if t >= 0 and (j == 0 or turn_ids[j - 1] != t)]
    bounds = [0, *starts[1:], len(tokens)]
    return [tuple(tokens[a:b]) for a, b in pairwise(bounds) if b > a]
