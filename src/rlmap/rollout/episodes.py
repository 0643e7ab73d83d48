"""Episodes: running them against environments, and packing them into the batch record.

Layout of a row: ``[left-padded prompt | response, right-padded]``, where the response
is every token after the prompt — the policy's turns and the environment's
observations in order. Every prompt ends at the same column, so prompt and response
columns line up across the batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from rlmap.core.batch import Batch, End, RewardStatus
from rlmap.core.errors import first_line
from rlmap.engines.engine import Completion, RolloutEngine, StopStrings
from rlmap.feedback.reward import worst
from rlmap.models.routing import NO_ROUTE
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

    @property
    def turns(self) -> int:
        """Number of policy turns."""
        return len(set(self.turn_ids) - {-1})

    @property
    def action_tokens(self) -> int:
        """Number of tokens the policy generated."""
        return sum(self.action)

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

    @property
    def context(self) -> tuple[int, ...]:
        return self.prompt + tuple(self.tokens)

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
            routes=self.routes,
            kept=stacked_kept(self.kept) if self.kept else None,
        )


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
    set-up checks), no turn is sampled past the model's length.
    ``before_turn`` runs before each round (partial rollout: new weights may arrive, and
    the next turns' tokens carry their version). ``kept_sets`` > 0 asks the engine for each
    action token's kept set of at most that many ids (``Episode.kept``; top-p replay).
    """
    stops = tuple(dict.fromkeys(t for env in envs for t in env.stop_token_ids))
    strings = stop_strings_of(envs)
    done: dict[int, Episode] = {}
    running: dict[int, _Running] = {}
    for i, env in enumerate(envs):
        try:
            running[i] = _Running(env, tuple(env.reset()))
        except Exception as exc:  # an environment failure is infrastructure, never terminal
            aborted(exc)
            done[i] = _Running(env, ()).finish(End.ABORTED, eos=False)
    limit = getattr(engine, "max_len", None)
    asked = {"kept_sets": kept_sets} if kept_sets else {}  # engines without sets need not know
    while running:
        if limit is not None:  # no room for another whole turn: truncated, as by the budget
            for i in [
                i for i, r in running.items() if r.turns and len(r.context) + max_new_tokens > limit
            ]:
                done[i] = running.pop(i).finish(End.TRUNCATED, eos=True)
            if not running:
                break
        if before_turn is not None:
            before_turn()
        batch = engine.generate(
            [r.context for r in running.values()],
            n=1,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            stop_token_ids=stops,
            stop_strings=strings,
            **asked,
        )
        items = list(running.items())
        for (_, r), (c,) in zip(items, batch, strict=True):
            r.add_turn(c)
        results = step_all([r.env for _, r in items], [c.response_ids for (c,) in batch])
        for (i, r), (c,), s in zip(items, batch, results, strict=True):
            if s is None:  # as above: aborted, excluded from training and counted
                done[i] = running.pop(i).finish(End.ABORTED, eos=c.stopped)
                continue
            r.add_step(s)
            if c.stopped and not (s.terminated or s.truncated):
                r.add_observation(s.observation)
                if max_turns is None or r.turns < max_turns:
                    continue
                done[i] = running.pop(i).finish(End.TRUNCATED, eos=True)  # the cap
                continue
            if s.truncated and c.stopped:
                r.add_observation(s.observation)
            end = End.TERMINAL if c.stopped and s.terminated else End.TRUNCATED
            done[i] = running.pop(i).finish(end, eos=c.stopped)
    return [done[i] for i in range(len(envs))]


def stop_strings_of(envs: Sequence[Environment]) -> StopStrings | None:
    """The stop strings of all ``envs`` (an environment's optional ``stop_strings``), read
    with the first one's decoder (one call's environments share the tokenizer)."""
    own = [s for s in (getattr(env, "stop_strings", None) for env in envs) if s is not None]
    if not own:
        return None
    return StopStrings(tuple(dict.fromkeys(x for s in own for x in s.strings)), own[0].decode)


def aborted(exc: Exception) -> None:
    """Say why an episode is aborted: a RuntimeWarning, which Python shows once per reason
    (the run goes on; ``*/aborted_frac`` counts them)."""
    why = f"{type(exc).__name__}: {first_line(exc)}"
    warnings.warn(
        f"an episode was aborted as an infrastructure failure: {why}", RuntimeWarning, stacklevel=2
    )


STEP_THREADS = 32
"""Environments stepped at once: their steps may wait on tools or services (latency)."""


def step_all(envs: Sequence[Environment], actions: Sequence[Sequence[int]]) -> list[EnvStep | None]:
    """Every environment's step on its action, concurrently; None where ``step`` raised.

    Environments are independent and a step may wait (a tool call, a remote service), so
    the round waits for the slowest step, not for the sum of them — as a fleet of
    environment servers would. Results keep the order of ``envs``. When no environment
    waits (``waits`` False: pure Python, :mod:`rlmap.tasks.env`) the steps run one after
    another in this thread: the GIL would serialise them anyway, and a pool's threads
    cost ~4 ms a round of 64 exact-match steps, which take 0.5 ms.
    """

    def one(env: Environment, action: Sequence[int]) -> EnvStep | None:
        try:
            return env.step(action)
        except Exception as exc:  # an environment failure is infrastructure: the caller aborts
            aborted(exc)
            return None

    if len(envs) <= 1 or not any(getattr(e, "waits", True) for e in envs):
        return [one(e, a) for e, a in zip(envs, actions, strict=True)]
    with ThreadPoolExecutor(max_workers=min(STEP_THREADS, len(envs))) as pool:
        return list(pool.map(one, envs, actions))


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Multi-turn statistics of some episodes (the caller prefixes ``env/`` or ``eval/``).

    ``turns``: mean policy turns per episode; ``tool_call_rate``: fraction of episodes
    with at least one tool call; ``tool_calls``: mean calls per episode;
    ``tool_error_frac``: fraction of calls that failed (0 without calls);
    ``turn_budget_frac``: fraction truncated after a completed turn (the turn budget, or
    the context full);
    ``aborted_frac``: fraction aborted by an environment failure.
    """
    n = max(len(episodes), 1)
    calls = sum(e.tool_calls for e in episodes)
    return {
        "turns": sum(e.turns for e in episodes) / n,
        "tool_call_rate": sum(e.tool_calls > 0 for e in episodes) / n,
        "tool_calls": calls / n,
        "tool_error_frac": sum(e.tool_errors for e in episodes) / max(calls, 1),
        "turn_budget_frac": sum(e.end == End.TRUNCATED and e.eos for e in episodes) / n,
        "aborted_frac": sum(e.end == End.ABORTED for e in episodes) / n,
    }


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
    """The batch record of a list of scored episodes (one row each).

    Rewards: when every turn but the last has reward 0 (outcome tasks), ``rewards`` is the
    return and ``token_rewards`` stays None (R at the last action token). Otherwise each
    turn's reward (``Scored.per_turn``, the shaping in the last one's) sits at that turn's
    last action token, in ``token_rewards``. ``turn_id`` is filled only when some episode
    has several turns.
    """
    prompt_len = max(len(s.episode.prompt_ids) for s in scored)
    response_len = max(max(len(s.episode.response_ids) for s in scored), 1)
    b, t = len(scored), prompt_len + response_len
    tokens = torch.full((b, t), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, t), dtype=torch.bool)
    action = torch.zeros((b, t), dtype=torch.bool)
    behaviour = torch.zeros((b, t))
    version = torch.zeros((b, t), dtype=torch.long)
    turn = torch.full((b, t), -1, dtype=torch.long)
    for i, s in enumerate(scored):
        e = s.episode
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
    return Batch(
        tokens=tokens,
        action_mask=action,
        behavior_logprobs=behaviour,
        rewards=torch.tensor([s.reward for s in scored], dtype=torch.float32),
        group_id=torch.tensor([s.group for s in scored], dtype=torch.long),
        end=torch.tensor([int(s.episode.end) for s in scored], dtype=torch.long),
        reward_status=torch.tensor([int(s.status) for s in scored], dtype=torch.long),
        attention_mask=attention,
        eos=torch.tensor([s.episode.eos for s in scored]),
        turn_id=turn if multi_turn else None,
        token_rewards=_turn_rewards(scored, action, turn) if _has_step_rewards(scored) else None,
        policy_version=version,
        routed_experts=_routes(scored, prompt_len, t),
        sampling_set=_kept(scored, prompt_len, t),
    )


def _kept(scored: Sequence[Scored], prompt_len: int, t: int) -> torch.Tensor | None:
    """(B, T, K) int32 kept sets in the batch's columns (-1 where none); None when no episode
    carries them (replay off). K: the widest set of the batch."""
    known = [s.episode.kept for s in scored if s.episode.kept is not None]
    if not known:
        return None
    out = torch.full((len(scored), t, max(k.shape[1] for k in known)), -1, dtype=torch.int32)
    for i, s in enumerate(scored):
        kept = s.episode.kept
        if kept is not None:
            out[i, prompt_len : prompt_len + len(kept), : kept.shape[1]] = kept
    return out


def _routes(scored: Sequence[Scored], prompt_len: int, t: int) -> torch.Tensor | None:
    """(B, T, L, K) routed experts in the batch's columns (-1 where none); None when no
    episode carries routes (a dense policy, or an engine that does not record them)."""
    known = [s.episode.routes for s in scored if s.episode.routes is not None]
    if not known:
        return None
    out = torch.full((len(scored), t, *known[0].shape[1:]), NO_ROUTE, dtype=torch.long)
    for i, s in enumerate(scored):
        routes = s.episode.routes
        if routes is None:
            continue
        start = prompt_len - len(s.episode.prompt_ids)
        n = min(len(routes), t - start)
        out[i, start : start + n] = routes[:n]
    return out


def _has_step_rewards(scored: Sequence[Scored]) -> bool:
    return any(s.per_turn is not None and any(r != 0 for r in s.per_turn[:-1]) for s in scored)


def _turn_rewards(
    scored: Sequence[Scored], action: torch.Tensor, turn: torch.Tensor
) -> torch.Tensor:
    """(B, T): each turn's reward (``Scored.per_turn``) at its last action token."""
    out = torch.zeros(action.shape)
    for i, s in enumerate(scored):
        if s.per_turn is None:  # an outcome: the return at the last action token
            cols = action[i].nonzero()
            if len(cols):
                out[i, cols.max()] = s.reward
            continue
        for k, r in enumerate(s.per_turn):
            cols = ((turn[i] == k) & action[i]).nonzero()
            if len(cols):
                out[i, cols.max()] = r
    return out
