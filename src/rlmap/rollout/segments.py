"""Segments: an episode that outgrows the model's context goes on in a new one.

``data.context_policy`` says what happens when the next turn would not fit
(``engine.max_len``): ``fail`` ends the episode TRUNCATED (the default); ``truncate_oldest``
closes the current *segment* and opens the next one, whose context is the prompt plus
the newest whole (turn + observation) pairs that fit — the oldest turns dropped, the
environment not reset. Each segment is its own training row (``Episode.segments``,
``Batch.episode_id``/``Batch.segment``); credit crosses the boundary as docs/formulas.md
§2.5 says (:mod:`rlmap.estimators.segments`).

The next segment's context is built by a :data:`ContextBuilder` — the hook learned
compaction (``compact``, not built yet) will fill with a summary the policy writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from types import MappingProxyType

from rlmap.core.errors import ConfigError

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


CONTEXT_POLICIES: Mapping[str, ContextBuilder | None] = MappingProxyType(
    {"fail": None, "truncate_oldest": newest_turns}
)
"""``data.context_policy`` → the builder of the next segment's context; None: no segments
(the episode ends truncated when the context is full)."""


def context_builder(policy: str) -> ContextBuilder | None:
    """The builder of ``data.context_policy`` (None for ``fail``)."""
    if policy not in CONTEXT_POLICIES:
        known = ", ".join(CONTEXT_POLICIES)
        raise ConfigError(f"data.context_policy: '{policy}' is not built; built: {known}")
    return CONTEXT_POLICIES[policy]


def turn_pairs(tokens: Sequence[int], turn_ids: Sequence[int]) -> list[Pair]:
    """The (turn + observation) pairs of a response: cut where a policy turn starts
    (``turn_ids`` ≥ 0 and not the previous token's turn); tokens before the first turn, if
    any, lead the first pair."""
    starts = [j for j, t in enumerate(turn_ids) if t >= 0 and (j == 0 or turn_ids[j - 1] != t)]
    bounds = [0, *starts[1:], len(tokens)]
    return [tuple(tokens[a:b]) for a, b in pairwise(bounds) if b > a]
