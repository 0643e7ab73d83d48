"""The synchronous group-barrier loop: collect a full batch behind the barrier, then learn.

One step::

    prompts → G rollouts each → rewards (verifier + shaping) → group filter
    (dynamic sampling: more rounds until the batch is full) → π_old / π_ref
    → critic values → advantages and critic targets → critic steps
    → policy steps → new weights to the rollout engine

Its parts are step functions the asynchronous loop reuses: a round of rollouts
(:mod:`rlmap.system.rounds`), the learner's half (:mod:`rlmap.system.learner_step`), the
loop's state and the rules that move it — the adaptive KL coefficient, the critic's
warm-up — (:mod:`rlmap.system.loop_state`) and the step's metrics
(:mod:`rlmap.system.step_metrics`). Here: the rounds behind the barrier until the group
filter is satisfied (:func:`collect`, with prompt rebalancing and the curriculum), and the
step (:func:`sync_step`).

Every function here is free of file I/O; recording, evaluation and checkpoints
are the caller's (:mod:`rlmap.experiments.train`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import torch

from rlmap import sampling
from rlmap.assembly.parts import Parts
from rlmap.core.batch import RewardStatus
from rlmap.core.device import elapsed, take_peak
from rlmap.engines.engine import forget_cache
from rlmap.rollout.packing import Scored, to_batch
from rlmap.sampling.curriculum import Climb, pass_rate
from rlmap.sampling.curriculum import climb as climb_curriculum
from rlmap.sampling.filters import sampling_counters
from rlmap.sampling.rebalance import Visits, kept, visited
from rlmap.sampling.refill import first_groups, sample_more
from rlmap.system.learner_step import learn
from rlmap.system.loop_state import LoopState, adapt_kl, warmup_progress
from rlmap.system.rounds import next_prompts, shared_round
from rlmap.system.step_metrics import rollout_metrics, step_times, valid
from rlmap.tasks.arithmetic import Example


def collect(p: Parts, state: LoopState) -> tuple[list[Scored], LoopState, dict[str, float]]:
    """Rollout rounds until the group filter has kept ``prompts_per_step`` groups (or the cap).

    The filter sees the verifier's outcome, not the shaped reward: DAPO keeps groups
    whose *correctness* varies. Filtered and rejected trajectories still count.
    """
    s = p.cfg.sampling
    keep_fn = sampling.registry.get(s.filter).fn
    generated: list[Scored] = []
    keep = torch.zeros(0, dtype=torch.bool)
    rounds, cursor, drawn = 0, state.cursor, 0
    climb = current_climb(p, state)
    pool = p.train if climb is None or p.levels is None else p.levels.pool(climb.level)
    visits, skipped, revisits = state.visits, 0, 0
    prompts: dict[int, str] = {}
    while sample_more(_groups(generated, keep), s.prompts_per_step, rounds, s.max_rounds):
        draw = draw_prompts(p, pool, cursor, visits, s.prompts_per_step)
        examples, cursor, visits = draw.examples, draw.cursor, draw.visits
        skipped, revisits = skipped + draw.skipped, revisits + draw.revisits
        first = state.cursor + drawn  # group ids, unique within the step only (the cursor
        generated += shared_round(p, examples, first_group=first)  # without rebalancing)
        prompts |= {first + k: e.prompt for k, e in enumerate(examples)}
        drawn, rounds = drawn + len(examples), rounds + 1
        keep = keep_fn(
            torch.tensor([x.outcome for x in generated]),
            torch.tensor([x.group for x in generated]),
            torch.tensor([valid(x) for x in generated]),
        )
    group_id = torch.tensor([x.group for x in generated])
    keep = first_groups(group_id, keep, s.prompts_per_step)
    kept = [x for x, k in zip(generated, keep.tolist(), strict=True) if k]
    tokens = [x.episode.generated_tokens for x in generated]
    trusted = [x.status == RewardStatus.OK for x in generated]
    stats = sampling_counters(tokens, trusted, len(kept), rounds)
    stats["system/group_idle_frac"] = barrier_idle(tokens)
    if s.rebalance:
        visits = visited(visits, _group_outcomes(generated, prompts), rare=s.rebalance_rare)
        stale = sum(n >= s.rebalance_after for _, n in visits.uniform)
        stats |= {
            "sampling/skipped": float(skipped),
            "sampling/revisits": float(revisits),
            "sampling/stale_prompts": float(stale),
        }
    state = replace(state, cursor=cursor, visits=visits)
    state, levels = climbed(p, state, climb, generated)
    return kept, state, stats | levels | rollout_metrics(generated, p)


@dataclass(frozen=True)
class Draw:
    """One round's prompts and what drawing them did to the data order and rebalancing."""

    examples: list[Example]
    cursor: int
    visits: Visits
    skipped: int = 0
    revisits: int = 0


def draw_prompts(p: Parts, pool: list[Example], cursor: int, visits: Visits, n: int) -> Draw:
    """``n`` prompts: the data order's from ``cursor`` on; with ``sampling.rebalance`` first
    up to n // 2 queued revisits (those in ``pool``: a revisit of another curriculum level's
    prompt is dropped; none when n is 1), then the data order's, each stale one
    kept with probability ``rebalance_keep`` (:mod:`rlmap.sampling.rebalance`); the cursor
    moves past the skipped ones too."""
    s, seed = p.cfg.sampling, p.cfg.seed
    if not s.rebalance:
        return Draw(next_prompts(pool, cursor, n, seed), cursor + n, visits)
    known = {e.prompt: e for e in pool}
    queued = [t for t in visits.revisit if t in known]  # another level's prompts are dropped
    again, rest = queued[: n // 2], queued[n // 2 :]
    out, skipped = [known[t] for t in again], 0
    while len(out) < n:
        for e in next_prompts(pool, cursor, n - len(out), seed):
            if kept(visits, e.prompt, cursor, seed, after=s.rebalance_after, keep=s.rebalance_keep):
                out.append(e)
            else:
                skipped += 1
            cursor += 1
    return Draw(out, cursor, replace(visits, revisit=tuple(rest)), skipped, len(again))


def _group_outcomes(
    generated: list[Scored], prompts: dict[int, str]
) -> list[tuple[str, list[float]]]:
    """(prompt, its valid trajectories' outcomes) of each group, in the order generated."""
    groups: dict[int, list[float]] = {}
    for x in generated:
        groups.setdefault(x.group, [])
        if valid(x):
            groups[x.group].append(x.outcome)
    return [(prompts[g], outcomes) for g, outcomes in groups.items()]


def current_climb(p: Parts, state: LoopState) -> Climb | None:
    """The curriculum's state this step: the loop's, else its start; None without one."""
    s = p.cfg.sampling
    if not s.curriculum:
        return None
    return Climb(s.curriculum_start) if state.climb is None else state.climb


def climbed(
    p: Parts, state: LoopState, climb: Climb | None, generated: list[Scored]
) -> tuple[LoopState, dict[str, float]]:
    """The curriculum after this step's trajectories (every valid one generated at its
    level, the group filter's rejects too: the pass rate is the level's, not the batch's),
    and ``curriculum/*``: the level the step's prompts came from, the window's pass rate
    before any move, the move (-1, 0, 1) and the generator's settings at that level."""
    if climb is None or p.levels is None:
        return state, {}
    s = p.cfg.sampling
    outcomes = [x.outcome for x in generated if valid(x)]
    after = climb_curriculum(
        climb,
        outcomes,
        up=s.curriculum_up,
        down=s.curriculum_down,
        window=s.curriculum_window,
        top=p.levels.top,
    )
    rate = pass_rate((climb.recent + tuple(outcomes))[-s.curriculum_window :])
    metrics = {
        "curriculum/level": float(climb.level),
        "curriculum/move": float(after.level - climb.level),
    }
    if not math.isnan(rate):
        metrics["curriculum/pass_rate"] = rate
    settings = p.levels.settings(climb.level)  # the numbers among them (some are lists)
    metrics |= {
        f"curriculum/{name}": float(settings[name])
        for name in p.levels.fields
        if isinstance(settings[name], int | float)
    }
    return replace(state, climb=after), metrics


def barrier_idle(lengths: list[int]) -> float:
    """Fraction of generation slots idle behind the barrier: 1 − mean / max generated tokens.

    A batched round runs until its longest episode ends; every shorter one's slot waits
    (``system/group_idle_frac``, the synchronous loop's cost that asynchrony avoids). 0 when
    all episodes are equally long."""
    longest = max(lengths, default=0)
    return 1.0 - sum(lengths) / (len(lengths) * longest) if longest else 0.0


def _groups(generated: list[Scored], keep: torch.Tensor) -> int:
    return len({x.group for x, k in zip(generated, keep.tolist(), strict=True) if k})


def sync_step(p: Parts, state: LoopState) -> tuple[LoopState, dict[str, float]]:
    """One synchronous step: collect a full batch behind the group barrier, then learn.

    On a GPU the rollout's peak memory is ``system/rollout_peak_memory_mb`` and a new peak
    starts for the learner's phases (``system/peak_memory_mb``, read by the caller)."""
    start = time.perf_counter()
    kept, state, metrics = collect(p, state)
    metrics["system/empty_step"] = float(not kept)
    rollout_s = elapsed(start, p.device)
    rollout_peak = take_peak(p.device)
    if rollout_peak is not None:
        metrics["system/rollout_peak_memory_mb"] = rollout_peak / 2**20
    if kept:
        batch = to_batch(kept, pad_token_id=int(p.tokenizer.pad_token_id))
        rows = [x.rank for x in kept for _ in x.episode.rows]  # each segment where it ran
        owner = torch.tensor(rows) if p.world.parallel else None
        metrics |= learn(p, batch, state, owner)
        state = adapt_kl(p, state, metrics, batch.size)
    forget_cache(p.engine)  # a resumed run starts the next step with none
    update_s = elapsed(start, p.device) - rollout_s
    tokens = metrics["sampling/generated_tokens"]
    metrics |= step_times(rollout_s, update_s, tokens) | {
        "system/rollout_s": rollout_s,
        "system/rollout_tokens_per_s": tokens / max(rollout_s, 1e-9),
    }
    if metrics.get("critic/pretraining") == 1.0 and p.cfg.critic.pretrain_mc:
        state = warmup_progress(state, metrics.get("critic/explained_variance", math.nan))
    return replace(state, step=state.step + 1), metrics
