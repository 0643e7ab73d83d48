"""Episodes: running them against environments, and packing them into the batch record.

Layout of a row: ``[left-padded prompt | response, right-padded]``, where the response
is every token after the prompt — the policy's turns and the environment's
observations in order. Every prompt ends at the same column, so prompt and response
columns line up across the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch

from rlmap.core.batch import Batch, End, RewardStatus
from rlmap.engines.engine import Completion, RolloutEngine
from rlmap.feedback.reward import worst
from rlmap.models.routing import NO_ROUTE
from rlmap.rollout.columns import kept_columns, reward_columns, route_columns, row_rewards
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
    each goes on from the prompt, the lead, the summary and its newest observation — or
    ends truncated when those leave no room for a turn and the next summary, or no room was
    left for a summary.
    ``window``: the context's positions and a turn's tokens; ``sampling``: ``generate``'s
    other arguments."""
    limit, max_new_tokens = window
    newest = {i: newest_observation(running[i].tokens, running[i].action) for i in which}
    budgets: dict[int, list[int]] = {}
    for i in which:
        budget = min(how.max_tokens, limit - len(running[i].context) - len(how.lead))
        if budget < 1:
            done[i] = running.pop(i).finish(End.TRUNCATED, eos=True)
            continue
        running[i].add_observation(how.lead)
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
            if len(carried) > room:  # the next segment would close before its first turn
                done[i] = running.pop(i).finish(End.TRUNCATED, eos=True)
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
    strings = stop_strings_of(envs)
    running, done = reset_all(envs)
    limit = getattr(engine, "max_len", None)
    sampling: dict[str, Any] = {"temperature": temperature, "top_p": top_p}
    sampling |= {"stop_token_ids": stops, "stop_strings": strings}
    if kept_sets:  # engines without sets need not know
        sampling["kept_sets"] = kept_sets
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
        batch = engine.generate(
            [r.context for r in running.values()],
            n=1,
            max_new_tokens=max_new_tokens,
            **sampling,
        )
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


@dataclass(frozen=True)
class Scored:
    """An episode with its reward and its group."""

    episode: Episode
    group: int
    """Index of the prompt it answers (its group)."""
    outcome: float
    """The environment's return before any shaping (what "correct" means in metrics)."""
    reward: float
    """The return trained on: outcome + shaping (e.g. DAPO soft overlong punishment)."""
    status: RewardStatus
    per_turn: tuple[float, ...] | None = None
    """Per-turn rewards summing to ``reward`` (environment step rewards, a process reward,
    the shaping on the last turn); None: ``reward`` at the last action token."""
    rank: int = 0
    """The learner rank that generated it and trains on it (:mod:`rlmap.learner.distributed`)."""


def to_batch(scored: Sequence[Scored], *, pad_token_id: int) -> Batch:
    """The batch record of a list of scored episodes (one row each, or one per segment).

    Rewards: when every turn but the last has reward 0 (outcome tasks), ``rewards`` is the
    return and ``token_rewards`` stays None (R at the last action token). Otherwise each
    turn's reward (``Scored.per_turn``, the shaping in the last one's) sits at that turn's
    last action token, in ``token_rewards``. ``turn_id`` is filled only when some episode
    has several turns. A segmented episode (``Episode.segments``) gives a row per segment,
    linked by ``episode_id`` and ``segment``: each row has its episode's ``rewards``,
    group and status, and in ``token_rewards`` only its own turns' rewards (the outcome on
    the last segment's last action token).
    """
    rows = [(s, e) for s in scored for e in s.episode.rows]
    prompt_len = max(len(e.prompt_ids) for _, e in rows)
    response_len = max(max(len(e.response_ids) for _, e in rows), 1)
    b, t = len(rows), prompt_len + response_len
    tokens = torch.full((b, t), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, t), dtype=torch.bool)
    action = torch.zeros((b, t), dtype=torch.bool)
    behaviour = torch.zeros((b, t))
    version = torch.zeros((b, t), dtype=torch.long)
    turn = torch.full((b, t), -1, dtype=torch.long)
    for i, (_, e) in enumerate(rows):
        p, r = len(e.prompt_ids), len(e.response_ids)
        response = slice(prompt_len, prompt_len + r)
        tokens[i, prompt_len - p : prompt_len] = torch.tensor(e.prompt_ids, dtype=torch.long)
        tokens[i, response] = torch.tensor(e.response_ids, dtype=torch.long)
        attention[i, prompt_len - p : prompt_len + r] = True
        action[i, response] = torch.tensor(e.action, dtype=torch.bool)
        behaviour[i, response] = torch.tensor(e.logprobs)
        version[i, response] = torch.tensor(e.versions, dtype=torch.long)
        turn[i, response] = torch.tensor(e.turn_ids, dtype=torch.long)
    multi_turn = any(s.episode.turns > 1 for s in scored)
    links = _links(scored)
    return Batch(
        tokens=tokens,
        action_mask=action,
        behavior_logprobs=behaviour,
        rewards=torch.tensor([s.reward for s, _ in rows], dtype=torch.float32),
        group_id=torch.tensor([s.group for s, _ in rows], dtype=torch.long),
        end=torch.tensor([int(e.end) for _, e in rows], dtype=torch.long),
        reward_status=torch.tensor([int(s.status) for s, _ in rows], dtype=torch.long),
        attention_mask=attention,
        eos=torch.tensor([e.eos for _, e in rows]),
        turn_id=turn if multi_turn else None,
        token_rewards=(
            _rewards(scored, action, turn) if links or _has_step_rewards(scored) else None
        ),
        policy_version=version,
        routed_experts=route_columns(
            [e.routes for _, e in rows], [len(e.prompt_ids) for _, e in rows], prompt_len, t
        ),
        sampling_set=kept_columns([e.kept for _, e in rows], prompt_len, t),
        episode_id=None if links is None else links[0],
        segment=None if links is None else links[1],
    )


def _links(scored: Sequence[Scored]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each row's episode (its index in ``scored``) and segment; None when none was cut."""
    if not any(s.episode.segments for s in scored):
        return None
    rows = [(n, k) for n, s in enumerate(scored) for k in range(len(s.episode.rows))]
    return torch.tensor([n for n, _ in rows]), torch.tensor([k for _, k in rows])


def _rewards(scored: Sequence[Scored], action: torch.Tensor, turn: torch.Tensor) -> torch.Tensor:
    """(B, T): every row's rewards (:func:`rlmap.rollout.columns.row_rewards`) in place."""
    turns = [[e.turns for e in s.episode.rows] for s in scored]
    per_row = [
        x for s, n in zip(scored, turns, strict=True) for x in row_rewards(s.reward, s.per_turn, n)
    ]
    return reward_columns(per_row, action, turn)


def _has_step_rewards(scored: Sequence[Scored]) -> bool:
    return any(s.per_turn is not None and any(r != 0 for r in s.per_turn[:-1]) for s in scored)
