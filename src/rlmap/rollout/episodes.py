"""Episodes: running them against environments, batched, turn by turn — and cutting those
that outgrow the model's context into segments (:mod:`rlmap.rollout.segments`). The batch
record of scored episodes is :mod:`rlmap.rollout.packing`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch

from rlmap.core.batch import End, RewardStatus
from rlmap.engines.engine import Completion, RolloutEngine
from rlmap.feedback.reward import worst
from rlmap.models.routing import NO_ROUTE
from rlmap.rollout.segments import (
    Compaction,
    ContextBuilder,
    ContextPolicy,
    given,
    newest_observation,
    turn_pairs,
)
from rlmap.rollout.stepping import aborted, step_all, stop_strings_of
from rlmap.tasks.env import Environment, EnvStep


@dataclass(frozen=True)
class Episode:
    """One trajectory: the prompt, then the policy's turns and the environment's observations."""

    prompt_ids: tuple[int, ...]
    """The prompt (``Environment.reset``); empty when the environment failed at reset."""
    response_ids: tuple[int, ...]
    """Every token after the prompt, in order: turns (actions) and observations."""
    action: tuple[bool, ...]
    """Per response token: True where the policy sampled it (trained on), False on observations."""
    logprobs: tuple[float, ...]
    """Per response token: log μ of action tokens as the engine reported them; 0 on observations."""
    versions: tuple[int, ...]
    """Per response token: the weight version that sampled it; 0 on observations."""
    turn_ids: tuple[int, ...]
    """Per response token: the index of its policy turn, -1 on observations."""
    end: End
    """How the episode ended (terminal, truncated, or aborted by an environment failure)."""
    eos: bool
    """The last turn ended with a stop token (EOS or a tool call's end), not the length limit."""
    rewards: tuple[float, ...]
    """The environment's reward after each turn (an aborting turn has none)."""
    status: RewardStatus
    """OK unless a reward could not be computed, or the environment failed (``INFRA_ERROR``)."""
    tool_calls: int = 0
    tool_errors: int = 0
    tool_results: tuple[str | None, ...] = ()
    """Per environment step (as ``rewards``): what a tool call that ran returned
    (``EnvStep.tool_result``), None for the other steps; empty where no step reported one."""
    routes: torch.Tensor | None = None
    """MoE policies: (len(prompt_ids) + len(response_ids), L, K) experts per position, each
    from the engine call that first routed it (:func:`earliest_routes`); rows past the last
    call (observations after the last turn) are missing and count as not routed."""
    kept: torch.Tensor | None = None
    """With ``behaviour.replay_sampling_set``: (len(response_ids), K) int32, each action
    token's kept set as the engine recorded it (``Completion.kept``), -1 padded; rows of -1
    on observations and where no set was recorded."""
    carried: int = 0
    """A segment after an episode's first: how many of ``response_ids`` lead in as context
    carried over from earlier segments (not actions, not the segment's own tokens)."""
    spent: int = 0
    """Tokens generated for this row that are not among its actions, counted in the budget:
    its share of a branch root's (``sampling.group_scope=branch``, :mod:`rlmap.rollout.branch`)."""
    summaries: tuple[int, ...] = ()
    """The turns that are compaction summaries (``data.context_policy=compact``): each the
    last turn of a segment, sampled after the task's lead, with reward 0 and no environment
    step (the environment never sees it)."""
    segments: tuple[Episode, ...] = ()
    """The rows the episode trains as when its context was cut (``data.context_policy``,
    :mod:`rlmap.rollout.segments`), in order: each a segment with its own context, turns
    (numbered from 0), rewards, routes and kept sets, ended TRUNCATED but the last (the
    episode's end), with its own steps' tool counts. Empty: the episode is its one row."""

    @property
    def rows(self) -> tuple[Episode, ...]:
        """The training rows: the segments, or the episode itself."""
        return self.segments or (self,)

    @property
    def dropped_tokens(self) -> int:
        """Tokens of a closing segment's context left out of the next one's, summed."""
        return sum(len(a.response_ids) - b.carried for a, b in pairwise(self.segments))

    @property
    def turns(self) -> int:
        """Number of policy turns (compaction summaries included)."""
        return len(set(self.turn_ids) - {-1})

    @property
    def summary_tokens(self) -> int:
        """Tokens the policy wrote in its compaction summaries."""
        return sum(t in self.summaries for t in self.turn_ids)

    @property
    def action_tokens(self) -> int:
        """Number of tokens the policy generated."""
        return sum(self.action)

    @property
    def generated_tokens(self) -> int:
        """Tokens the engine generated for this row: its actions and what it was ``spent``."""
        return self.action_tokens + self.spent

    @property
    def outcome(self) -> float:
        """The environment's return: the sum of its rewards."""
        return sum(self.rewards)


def single_turn(
    c: Completion, reward: float = 0.0, status: RewardStatus = RewardStatus.OK
) -> Episode:
    """The one-turn episode of a completion: terminal if it stopped, else truncated."""
    n = len(c.response_ids)
    return Episode(
        prompt_ids=c.prompt_ids,
        response_ids=c.response_ids,
        action=(True,) * n,
        logprobs=c.logprobs,
        versions=(c.version,) * n,
        turn_ids=(0,) * n,
        end=End.TERMINAL if c.stopped else End.TRUNCATED,
        eos=c.stopped,
        rewards=(reward,),
        status=status,
        routes=c.routes,
        kept=c.kept,
    )


@dataclass
class _Running:
    """A growing episode (mutable while it runs; :meth:`finish` freezes it)."""

    env: Environment
    prompt: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    action: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    status: RewardStatus = RewardStatus.OK
    tool_calls: int = 0
    tool_errors: int = 0
    tool_results: list[str | None] = field(default_factory=list)
    turns: int = 0
    routes: torch.Tensor | None = None
    kept: list[torch.Tensor] = field(default_factory=list)
    """Per turn and observation, (n, K) kept sets (empty unless the engine recorded them)."""
    carried: tuple[int, ...] = ()
    """The current segment's context between the prompt and its own tokens (empty in the first)."""
    start: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
    """Where the current segment starts: tokens, turns, steps, tool calls and errors before it."""
    segments: list[Episode] = field(default_factory=list)
    summaries: list[int] = field(default_factory=list)

    @property
    def env_turns(self) -> int:
        """Turns the environment was stepped on (the turn budget's count)."""
        return self.turns - len(self.summaries)

    @property
    def context(self) -> tuple[int, ...]:
        return self.prompt + self.carried + tuple(self.tokens[self.start[0] :])

    def cut(self, build: ContextBuilder, room: int) -> None:
        """Close the current segment, a truncation with a final observation (the episode
        goes on), and open the next from the prompt and ``build``'s context: the hook where
        the next segment's context is made."""
        self.segments.append(self.segment(End.TRUNCATED, eos=True))
        self.carried = build(turn_pairs(self.tokens, self.turn_ids), room)
        steps = len(self.rewards)
        self.start = (len(self.tokens), self.turns, steps, self.tool_calls, self.tool_errors)
        self.routes = None  # positions move: the new segment's calls route its own context

    def segment(self, end: End, eos: bool) -> Episode:
        """The current segment as a row: prompt, carried context, its own tokens."""
        (first, turn, step, calls, errors), n = self.start, len(self.carried)
        own = slice(first, None)
        kept = stacked_kept(self.kept)[own] if self.kept else None
        if kept is not None and n:
            kept = torch.cat([torch.full((n, kept.shape[1]), -1, dtype=torch.int32), kept])
        turns = (t - turn if t >= 0 else -1 for t in self.turn_ids[own])
        return Episode(
            prompt_ids=self.prompt,
            response_ids=self.carried + tuple(self.tokens[own]),
            action=(False,) * n + tuple(self.action[own]),
            logprobs=(0.0,) * n + tuple(self.logprobs[own]),
            versions=(0,) * n + tuple(self.versions[own]),
            turn_ids=(-1,) * n + tuple(turns),
            end=end,
            eos=eos,
            rewards=tuple(self.rewards[step:]),
            status=RewardStatus.INFRA_ERROR if end == End.ABORTED else self.status,
            tool_calls=self.tool_calls - calls,
            tool_errors=self.tool_errors - errors,
            tool_results=tuple(self.tool_results[step:]),
            routes=self.routes,
            kept=kept,
            carried=n,
            summaries=tuple(t - turn for t in self.summaries if t >= turn),
        )

    def add_summary(self, c: Completion) -> None:
        """A compaction summary: a turn of the closing segment with reward 0, no step."""
        self.add_turn(c)
        self.summaries.append(self.turns - 1)
        self.add_step(EnvStep())

    def add_turn(self, c: Completion) -> None:
        n = len(c.response_ids)
        self.tokens += c.response_ids
        self.action += [True] * n
        self.logprobs += c.logprobs
        self.versions += [c.version] * n
        self.turn_ids += [self.turns] * n
        self.turns += 1
        self.routes = earliest_routes(self.routes, c.routes)
        if c.kept is not None:
            self.kept.append(c.kept)

    def add_step(self, s: EnvStep) -> None:
        self.rewards.append(s.reward)
        self.tool_calls += s.tool_call
        self.tool_errors += s.tool_error
        self.tool_results.append(s.tool_result)
        self.status = worst((self.status, s.status))

    def add_observation(self, ids: Sequence[int]) -> None:
        n = len(ids)
        self.tokens += ids
        self.action += [False] * n
        self.logprobs += [0.0] * n
        self.versions += [0] * n
        self.turn_ids += [-1] * n
        if self.kept:  # observations have no kept set
            self.kept.append(torch.full((n, 0), -1, dtype=torch.int32))

    def finish(self, end: End, eos: bool) -> Episode:
        status = RewardStatus.INFRA_ERROR if end == End.ABORTED else self.status
        segments = (*self.segments, self.segment(end, eos)) if self.segments else ()
        return Episode(
            prompt_ids=self.prompt,
            response_ids=tuple(self.tokens),
            action=tuple(self.action),
            logprobs=tuple(self.logprobs),
            versions=tuple(self.versions),
            turn_ids=tuple(self.turn_ids),
            end=end,
            eos=eos,
            rewards=tuple(self.rewards),
            status=status,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            tool_results=tuple(self.tool_results),
            routes=None if segments else self.routes,  # the rows' routes are the segments'
            kept=stacked_kept(self.kept) if self.kept else None,
            summaries=tuple(self.summaries),
            segments=segments,
        )


def make_room(
    running: dict[int, _Running],
    done: dict[int, Episode],
    limit: int,
    max_new_tokens: int,
    next_context: ContextPolicy | None,
) -> list[int]:
    """Episodes whose context leaves no room for another whole turn in ``limit`` positions
    (and, under :class:`Compaction`, a summary) go on in a new segment (``next_context``;
    while the prompt and a turn fit) or end truncated, as by the turn budget (moved from
    ``running`` to ``done``). Returns the episodes that are to write a summary first
    (:func:`compact`)."""
    compaction = next_context if isinstance(next_context, Compaction) else None
    reserve = max_new_tokens if compaction is None else compaction.reserve(max_new_tokens)
    summarize: list[int] = []
    for i, r in list(running.items()):
        if not r.turns or len(r.context) + reserve <= limit:
            continue
        room = limit - max_new_tokens - len(r.prompt)  # for the carried context
        if next_context is None or room < 0 or r.start[0] >= len(r.tokens):
            done[i] = running.pop(i).finish(End.TRUNCATED, eos=True)
        elif isinstance(next_context, Compaction):
            summarize.append(i)
        else:
            r.cut(next_context, room)
    return summarize


def compact(
    engine: RolloutEngine,
    running: dict[int, _Running],
    done: dict[int, Episode],
    which: Sequence[int],
    how: Compaction,
    window: tuple[int, int],
    sampling: Mapping[str, Any],
) -> None:
    """The episodes ``which`` write their summaries (one ``generate`` per summary budget:
    ``how.max_tokens``, or the room their context has left), which close their segments:
    each goes on from the prompt, the lead, the summary and its newest observation. An
    episode ends truncated instead — without a summary when there is no room for one, or
    when even a one-token summary would leave the next segment no room for a turn and the
    next summary; after it when its summary did not stop within its budget (as a turn cut
    at the length limit does) or leaves no such room. ``window``: the context's positions
    and a turn's tokens; ``sampling``: ``generate``'s other arguments."""
    limit, max_new_tokens = window
    newest = {i: newest_observation(running[i].tokens, running[i].action) for i in which}
    budgets: dict[int, list[int]] = {}
    for i in which:
        r = running[i]
        budget = min(how.max_tokens, limit - len(r.context) - len(how.lead))
        room = limit - how.reserve(max_new_tokens) - len(r.prompt)  # for the carried context
        if budget < 1 or len(how.lead) + 1 + len(newest[i]) > room:
            done[i] = running.pop(i).finish(End.TRUNCATED, eos=True)
            continue
        r.add_observation(how.lead)
        budgets.setdefault(budget, []).append(i)
    for budget, ids in budgets.items():
        calls = engine.generate(
            [running[i].context for i in ids], n=1, max_new_tokens=budget, **sampling
        )
        for i, (c,) in zip(ids, calls, strict=True):
            r = running[i]
            r.add_summary(c)
            carried = (*how.lead, *c.response_ids, *newest[i])
            room = limit - how.reserve(max_new_tokens) - len(r.prompt)
            if not c.stopped or len(carried) > room:
                done[i] = running.pop(i).finish(End.TRUNCATED, eos=c.stopped)
            else:
                r.cut(given(carried), room)


def stacked_kept(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """(Σ n, K) int32: (n, K_j) kept-set rows one after another, padded with -1 to the widest."""
    width = max(x.shape[1] for x in parts)
    out = torch.full((sum(len(x) for x in parts), width), -1, dtype=torch.int32)
    start = 0
    for x in parts:
        out[start : start + len(x), : x.shape[1]] = x
        start += len(x)
    return out


def earliest_routes(known: torch.Tensor | None, call: torch.Tensor | None) -> torch.Tensor | None:
    """Each position's routes from the first call that routed it: the episode's so far, the
    new call's for what it adds (observations, the new turn) and for positions nothing had
    routed yet (a previous turn's last token). Under partial rollout a later call may run on
    newer weights; a token keeps the routes it was processed with when it was new."""
    if known is None or call is None:
        return call
    out = call.clone()
    n = min(len(known), len(out))
    routed = (known[:n] != NO_ROUTE).all(-1, keepdim=True).all(-2, keepdim=True)
    out[:n] = torch.where(routed, known[:n], out[:n])
    return out


def run_episodes(
    engine: RolloutEngine,
    envs: Sequence[Environment],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    before_turn: Callable[[], None] | None = None,
    max_turns: int | None = None,
    kept_sets: int = 0,
    next_context: ContextPolicy | None = None,
) -> list[Episode]:
    """Run one episode in each environment, all running ones batched into each ``generate``.

    Each round samples one turn of every running episode (``max_new_tokens`` per turn),
    then steps its environment. An episode ends *terminal* when the environment says
    ``terminated``, *truncated* when it says ``truncated`` or when the turn hit the
    length limit (the policy was cut off, whatever the environment made of the cut
    turn), and *aborted* (status ``infra_error``) when ``reset`` or ``step`` raised.
    Observations after a truncating step are kept: they are part of the final state
    the critic bootstraps from. The environments of one call share their stop tokens.
    ``max_turns`` caps the turns whatever the environment does: an episode still running
    after that many ends truncated (a guard against an environment that never ends). So
    does one whose context leaves no room for another whole turn in the engine's context
    (``engine.max_len``, where it has one): after the first turn (whose prompt the run's
    set-up checks), no turn is sampled past the model's length — unless ``next_context``
    (``data.context_policy``, :mod:`rlmap.rollout.segments`) builds a new segment's context,
    or has the policy write it (:class:`~rlmap.rollout.segments.Compaction`, :func:`compact`):
    the episode then goes on from the prompt and that context (``Episode.segments``).
    ``before_turn`` runs before each round (partial rollout: new weights may arrive, and
    the next turns' tokens carry their version). ``kept_sets`` > 0 asks the engine for each
    action token's kept set of at most that many ids (``Episode.kept``; top-p replay).
    """
    stops = tuple(dict.fromkeys(t for env in envs for t in env.stop_token_ids))
    sampling: dict[str, Any] = {"temperature": temperature, "top_p": top_p}
    sampling |= {"stop_token_ids": stops, "stop_strings": stop_strings_of(envs)}
    sampling |= {"kept_sets": kept_sets} if kept_sets else {}  # engines without need not know
    running, done = reset_all(envs)
    limit = getattr(engine, "max_len", None)
    while running:
        summarize: list[int] = []
        if limit is not None:
            summarize = make_room(running, done, limit, max_new_tokens, next_context)
            if not running:
                break
        if before_turn is not None:
            before_turn()
        if summarize and limit is not None and isinstance(next_context, Compaction):
            window = (limit, max_new_tokens)  # the summaries sample on new weights too
            compact(engine, running, done, summarize, next_context, window, sampling)
            if not running:
                break
        contexts = [r.context for r in running.values()]
        batch = engine.generate(contexts, n=1, max_new_tokens=max_new_tokens, **sampling)
        take_turns(running, done, batch, max_turns)
    return [done[i] for i in range(len(envs))]


def reset_all(envs: Sequence[Environment]) -> tuple[dict[int, _Running], dict[int, Episode]]:
    """Every environment reset, by its index: its episode running, or done (aborted) when
    ``reset`` raised."""
    done: dict[int, Episode] = {}
    running: dict[int, _Running] = {}
    for i, env in enumerate(envs):
        try:
            running[i] = _Running(env, tuple(env.reset()))
        except Exception as exc:  # an environment failure is infrastructure, never terminal
            aborted(exc)
            done[i] = _Running(env, ()).finish(End.ABORTED, eos=False)
    return running, done


def take_turns(
    running: dict[int, _Running],
    done: dict[int, Episode],
    batch: list[list[Completion]],
    max_turns: int | None,
) -> None:
    """One round's turns (``batch``, one completion per running episode, in order) added to
    their episodes, then every environment stepped on its turn; the episodes that end move
    from ``running`` to ``done`` (:func:`run_episodes` says how each ends)."""
    items = list(running.items())
    for (_, r), (c,) in zip(items, batch, strict=True):
        r.add_turn(c)
    results = step_all([r.env for _, r in items], [c.response_ids for (c,) in batch])
    for (i, r), (c,), s in zip(items, batch, results, strict=True):
        if s is None:  # a failed step, as a failed reset: aborted, excluded and counted
            done[i] = running.pop(i).finish(End.ABORTED, eos=c.stopped)
            continue
        r.add_step(s)
        if c.stopped and not (s.terminated or s.truncated):
            r.add_observation(s.observation)
            if max_turns is None or r.env_turns < max_turns:
                continue
            done[i] = running.pop(i).finish(End.TRUNCATED, eos=True)  # the cap
            continue
        if s.truncated and c.stopped:
            r.add_observation(s.observation)
        end = End.TERMINAL if c.stopped and s.terminated else End.TRUNCATED
        done[i] = running.pop(i).finish(end, eos=c.stopped)
