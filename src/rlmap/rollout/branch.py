"""``sampling.group_scope=branch``: a prompt's G samples continue one replayed state.

Two trajectories of one prompt stop being comparable after their first turn. Here, for each
prompt, the sampler runs one *root* trajectory, draws a branch turn k from its turns,
re-runs its first k actions in G fresh environments (:func:`rlmap.tasks.replay.replay`,
checked token for token against the root's context c_k, docs/formulas.md §2.4) and draws
the G continuations from there, all of a round's in one batched :func:`run_episodes` call.
Each continuation is one training row::

    prompt x | the rest of c_k: a_0 o_0 … a_{k−1} o_{k−1} | its own turns a'_k o'_k …
               context (action mask 0, turn −1,            actions and observations,
               as a segment's carried context)             turns numbered from 0

so the G rows of a prompt's group start from one state by construction, and what reads
group ids — group statistics, the dynamic-sampling filter, the zero-advantage
diagnostics — follows the scope with nothing of its own.

Decided here:

- **k ~ Uniform{0, …, K−1}** over the root's K turns, seeded by the run's seed and the
  group id: no setting to tune, every state the root stood in before acting equally
  likely, and the same k whichever round, rank or worker runs the group. k = 0 is the
  prompt itself (the prompt scope's group); a root of one turn has only that state.
- **The root is not trained on.** k is drawn after seeing the root's length, so its own
  turns from s_k are a selected sample, not a draw from π(·|s_k) like the G; and its
  prefix is every row's context already.
- **A row's rewards are its own steps'**: the return from s_k. The prefix's rewards are the
  group's in common and rewarded actions none of the row trains on.
- **The turn budget is the episode's**: a continuation has ``max_turns`` − k turns left.
- **Failures**: an environment failing during a replay aborts that continuation (an
  infrastructure failure, excluded and counted, as in an episode); an environment that does
  not declare itself replayable (ConfigError, before anything is generated) or a replay
  that does not reproduce the root (:class:`~rlmap.tasks.replay.ReplayMismatch`) stops
  the run.

- **The root's tokens are spent by its rows**: it is not trained on, but it was generated,
  so each of the G rows carries a share (``Episode.spent``, the first ``n mod G`` one more)
  and ``sampling/generated_tokens`` and the budget count the root whole.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from rlmap.core.errors import ConfigError
from rlmap.engines.engine import StopStrings
from rlmap.rollout.episodes import Episode
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvFactory, Environment, EnvStep
from rlmap.tasks.replay import (
    Branch,
    ReplayMismatch,
    context_at,
    replay,
    require_replayable,
    turn_actions,
)

Run = Callable[[Sequence[Environment]], list[Episode]]
"""One episode in each environment, batched: :func:`rlmap.rollout.episodes.run_episodes`
with the round's engine and sampling settings."""


@dataclass(frozen=True)
class BranchGroup:
    """One prompt's root trajectory, its branch turn and the G rows continuing from there."""

    root: Episode
    """The trajectory whose first ``turn`` actions were replayed (not trained on)."""
    turn: int
    """k: the rows continue from the state before the root's turn k."""
    rows: tuple[Episode, ...]
    """The G continuations as training rows (the module docstring's layout)."""


def branch_turn(turns: int, seed: int, group: int) -> int:
    """k ~ Uniform{0, …, turns − 1} from a generator seeded by the run's ``seed`` and the
    ``group`` id (0 for a root without a turn: aborted at reset)."""
    return random.Random(f"branch/{seed}/{group}").randrange(max(turns, 1))


def branch_groups(
    run: Run,
    make: EnvFactory,
    examples: Sequence[Example],
    first_group: int,
    group_size: int,
    seed: int,
    max_turns: int,
) -> list[BranchGroup]:
    """For each example (group ``first_group + i``): a root trajectory, a branch turn
    (:func:`branch_turn`) and ``group_size`` continuations of the replayed state, the roots
    in one ``run`` and the continuations in another. ConfigError, before either, when an
    environment does not declare itself replayable."""
    root_envs = [require_replayable(make(e)) for e in examples]
    roots = run(root_envs)
    turns = [branch_turn(r.turns, seed, first_group + i) for i, r in enumerate(roots)]
    starts = [
        start
        for e, env, root, k in zip(examples, root_envs, roots, turns, strict=True)
        for start in _starts(make, e, env, root, k, group_size, max_turns)
    ]
    ends = run(starts)
    rows = [as_row(end, start.prompt_len) for end, start in zip(ends, starts, strict=True)]
    groups = [rows[i * group_size : (i + 1) * group_size] for i in range(len(roots))]
    return [
        BranchGroup(root, k, spend(root.action_tokens, group))
        for root, k, group in zip(roots, turns, groups, strict=True)
    ]


def spend(tokens: int, rows: Sequence[Episode]) -> tuple[Episode, ...]:
    """``rows`` with ``tokens`` (a root's) shared out as ``Episode.spent``: each
    ⌊tokens / G⌋, the first ``tokens mod G`` one more, so that they add up to ``tokens``."""
    share, extra = divmod(tokens, max(len(rows), 1))
    return tuple(replace(r, spent=share + (i < extra)) for i, r in enumerate(rows))


def _starts(
    make: EnvFactory,
    example: Example,
    like: Environment,
    root: Episode,
    turn: int,
    n: int,
    max_turns: int,
) -> list[Continuation]:
    """``n`` independent replays of ``root`` to ``turn``, each checked against the root's
    c_k (unless the root failed at reset: it has no context to check against)."""
    actions = turn_actions(root.response_ids, root.turn_ids)
    expected = context_at(*_fields(root), turn) if root.prompt_ids else None
    out = []
    for _ in range(n):
        try:
            start: Branch | Exception = replay(make, example, actions, turn, expected=expected)
        except (ConfigError, ReplayMismatch):
            raise
        except Exception as exc:  # the environment failed while replaying: infrastructure
            start = exc
        out.append(Continuation(like, start, max_turns - turn))
    return out


def _fields(e: Episode) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    return e.prompt_ids, e.response_ids, e.turn_ids


class Continuation:
    """An environment standing at a branch point, for :func:`run_episodes`: ``reset`` shows
    c_k, ``step`` steps the replayed environment, which truncates after ``turns_left``
    turns (the episode's budget less the replayed ones; its own limit may come first).
    Holding a failed replay, ``reset`` raises its exception: the continuation is aborted.
    ``like`` (an environment of the same task and prompt) lends the stop tokens and strings
    and whether a step waits."""

    def __init__(self, like: Environment, start: Branch | Exception, turns_left: int) -> None:
        self.like, self.start, self.turns_left = like, start, turns_left

    @property
    def prompt_len(self) -> int:
        """len(x): where c_k's replayed tail starts (0 for a failed replay)."""
        return self.start.prompt_len if isinstance(self.start, Branch) else 0

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self.like.stop_token_ids

    @property
    def stop_strings(self) -> StopStrings | None:
        return getattr(self.like, "stop_strings", None)

    @property
    def waits(self) -> bool:
        return getattr(self.like, "waits", True)

    def reset(self) -> list[int]:
        if isinstance(self.start, Exception):
            raise self.start
        return list(self.start.context)

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        if isinstance(self.start, Exception):
            raise self.start
        s = self.start.env.step(action_ids)
        self.turns_left -= 1
        if self.turns_left <= 0 and not (s.terminated or s.truncated):
            return replace(s, truncated=True)
        return s


def as_row(e: Episode, prompt_len: int) -> Episode:
    """A continuation (whose prompt is c_k) as a training row: the prompt x, then the rest
    of c_k as context — action mask 0, log μ 0, version 0, turn −1, no kept set, as a
    segment's carried context (``carried``) —, then its own tokens. An episode aborted at
    reset (a failed replay) has no tokens and stays as it is."""
    if not e.prompt_ids:
        return e
    lead = e.prompt_ids[prompt_len:]
    n = len(lead)
    kept = e.kept
    if kept is not None and n:
        kept = torch.cat([torch.full((n, kept.shape[1]), -1, dtype=torch.int32), kept])
    return replace(
        e,
        prompt_ids=e.prompt_ids[:prompt_len],
        response_ids=lead + e.response_ids,
        action=(False,) * n + e.action,
        logprobs=(0.0,) * n + e.logprobs,
        versions=(0,) * n + e.versions,
        turn_ids=(-1,) * n + e.turn_ids,
        kept=kept,
        carried=n,
    )
