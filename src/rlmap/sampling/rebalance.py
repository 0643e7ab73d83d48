"""Prompt rebalancing: fewer visits to prompts that teach nothing, more to rare successes.

A group whose trajectories were all correct or all wrong gives GRPO-style advantages of 0:
its prompt taught nothing. A prompt whose groups were so for ``after`` consecutive visits is
*stale*: when the data order reaches it again it is kept with probability ``keep`` and
skipped otherwise (skips are counted: ``sampling/skipped``, the ledger's
``skipped_prompts``). A group with a rare success (a fraction of full scores in (0,
``rare``]) puts its prompt on the *revisit* queue: the next step draws it again, ahead of
the data order (at most half of a step's prompts are revisits, so none with one prompt a
step). A visit that is neither uniform nor rare
clears the prompt's count. Prompts are known by their text. Pure functions of plain data:
the state goes into checkpoints as it is, so a resume is exact.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Visits:
    """What rebalancing remembers of the prompts it has seen."""

    uniform: tuple[tuple[str, int], ...] = ()
    """(prompt, consecutive visits whose group was all correct or all wrong), count >= 1."""
    revisit: tuple[str, ...] = ()
    """Prompts with a rare success, to be drawn again, oldest first."""


def kept(visits: Visits, prompt: str, position: int, seed: int, *, after: int, keep: float) -> bool:
    """Whether the data order's prompt at ``position`` is visited: always unless stale,
    else with probability ``keep`` (a draw that depends only on ``seed`` and ``position``)."""
    if dict(visits.uniform).get(prompt, 0) < after:
        return True
    return random.Random(f"rebalance:{seed}:{position}").random() < keep


def visited(
    visits: Visits, groups: Sequence[tuple[str, Sequence[float]]], *, rare: float
) -> Visits:
    """The state after this step's groups, (prompt, its valid trajectories' outcomes) each:
    a uniform group (every outcome 0, or every one >= 1) adds one to its prompt's count; a
    rare success (the fraction of full scores, outcome >= 1, in (0, ``rare``]: partial
    credit alone is no success) queues a revisit and, like any other group, clears the
    count. A group without a valid trajectory says nothing."""
    uniform, revisit = dict(visits.uniform), list(visits.revisit)
    for prompt, outcomes in groups:
        if not outcomes:
            continue
        if all(x <= 0 for x in outcomes) or all(x >= 1 for x in outcomes):
            uniform[prompt] = uniform.get(prompt, 0) + 1
            continue
        uniform.pop(prompt, None)
        solved = sum(x >= 1 for x in outcomes) / len(outcomes)
        if 0 < solved <= rare and prompt not in revisit:
            revisit.append(prompt)
    return Visits(tuple(sorted(uniform.items())), tuple(revisit))
