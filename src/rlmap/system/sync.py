"""The synchronous group-barrier loop, as step functions the asynchronous loop reuses.

One step::

    prompts → G rollouts each → rewards (verifier + shaping) → group filter
    (dynamic sampling: more rounds until the batch is full) → π_old / π_ref
    → critic values → advantages and critic targets → critic steps
    → policy steps → new weights to the rollout engine

vLLM on the learner's GPU sleeps from π_old to the new weights (:func:`learn`).

Critic warm-up: during the first ``critic.warmup_steps`` steps only the critic learns
(the step is logged as usual, with ``critic/pretraining = 1``). With
``critic.pretrain_mc`` (VAPO's value pre-training) its targets are Monte-Carlo
returns (λ_critic = 1 whatever the recipe's λ), and the warm-up ends early once the
critic's explained variance — measured on each step's fresh rollouts, before that
step's critic update — has not beaten its best for ``WARMUP_PATIENCE`` consecutive
steps. The policy's first update comes in the step after the warm-up.

Every function here is free of file I/O; recording, evaluation and checkpoints
are the caller's (:mod:`rlmap.experiments.train`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rlmap import estimators, sampling
from rlmap.assembly.parts import Parts
from rlmap.assembly.settings import critic_settings
from rlmap.core.batch import Batch, RewardStatus, trains
from rlmap.core.device import elapsed, mfu, take_peak, update_flops_per_token
from rlmap.core.ops import masked_mean
from rlmap.correction import adaptive_beta, kl_in_reward
from rlmap.engines.engine import RolloutEngine, forget_cache
from rlmap.estimators import Credit, CreditParams
from rlmap.experiments.samples import Judged, class_fractions, error_class
from rlmap.feedback.judge import judge_metrics
from rlmap.learned.reward_model import score_batch
from rlmap.learner.critic import compute_values, update_critic
from rlmap.learner.distributed import gather
from rlmap.learner.logprobs import attention_of
from rlmap.learner.memory import autocast_to
from rlmap.learner.policy import UpdateSettings, prepare_batch, update_policy
from rlmap.rollout.episodes import Episode, Scored, episode_metrics, run_episodes, to_batch
from rlmap.rollout.evaluate import final_answer
from rlmap.rollout.scoring import score_episodes, trajectories
from rlmap.sampling.curriculum import Climb, pass_rate
from rlmap.sampling.curriculum import climb as climb_curriculum
from rlmap.sampling.filters import sampling_counters
from rlmap.sampling.rebalance import Visits, kept, visited
from rlmap.sampling.refill import first_groups, sample_more
from rlmap.tasks.arithmetic import Example


@dataclass(frozen=True)
class LoopState:
    """Where the loop is: what a checkpoint must restore besides weights and RNG."""

    step: int = 0
    """Completed steps (= the rollout engine's weight version)."""
    cursor: int = 0
    """Training prompts consumed so far (the data order is a function of it)."""
    critic_warmup_done: bool = False
    """The critic's warm-up ended early (value pre-training stopped improving)."""
    critic_best_ev: float = -math.inf
    """Best explained variance seen during value pre-training."""
    critic_ev_stale: int = 0
    """Consecutive pre-training steps whose explained variance did not beat the best."""
    kl_beta: float | None = None
    """β of the KL term as the adaptive controller left it (``kl.target`` set); None: the
    configured ``kl.beta`` (fixed, or not adapted yet)."""
    climb: Climb | None = None
    """The curriculum's level and window (``sampling.curriculum``); None: not started, or
    no curriculum."""
    visits: Visits = field(default_factory=Visits)
    """What prompt rebalancing remembers (``sampling.rebalance``); empty without it."""

    @classmethod
    def saved(cls, fields: dict[str, Any]) -> LoopState:
        """The state a checkpoint holds (:func:`dataclasses.asdict` of one)."""
        climb = fields.get("climb")
        climb = None if climb is None else Climb(int(climb["level"]), tuple(climb["recent"]))
        v = fields.get("visits") or {}
        visits = Visits(
            tuple((str(t), int(n)) for t, n in v.get("uniform", ())), tuple(v.get("revisit", ()))
        )
        return cls(**(fields | {"climb": climb, "visits": visits}))


def kl_beta(p: Parts, state: LoopState) -> float:
    """The KL coefficient of this step: the adaptive controller's, else ``kl.beta``."""
    return p.cfg.kl.beta if state.kl_beta is None else state.kl_beta


def adapt_kl(p: Parts, state: LoopState, metrics: dict[str, float], samples: int) -> LoopState:
    """Ziegler et al.'s controller after a step that measured ``kl/mean`` on ``samples``
    trajectories (:func:`rlmap.correction.adaptive_beta`); unchanged without ``kl.target``,
    on a step that measured no KL (an empty batch) and on a critic-only warm-up step (the
    KL in the reward is measured there too, but the policy is not trained)."""
    k = p.cfg.kl
    if k.target is None or k.placement == "none" or "kl/mean" not in metrics:
        return state
    if metrics.get("critic/pretraining") == 1.0:  # the policy did not move: KL ≈ 0 says nothing
        return state
    beta = adaptive_beta(kl_beta(p, state), metrics["kl/mean"], k.target, samples, k.horizon)
    return replace(state, kl_beta=beta)


WARMUP_PATIENCE = 3
"""Value pre-training stops after this many consecutive steps without a better EV."""


def critic_warming_up(p: Parts, state: LoopState) -> bool:
    """This step trains only the critic (its warm-up or value pre-training)."""
    c = p.cfg.critic
    return p.critic is not None and not state.critic_warmup_done and state.step < c.warmup_steps


def warmup_progress(state: LoopState, ev: float) -> LoopState:
    """The pre-training bookkeeping after a step whose (pre-update) explained variance is ``ev``.

    Strictly greater than the best counts as improvement; NaN (all returns equal) does not.
    """
    if not math.isnan(ev) and ev > state.critic_best_ev:
        return replace(state, critic_best_ev=ev, critic_ev_stale=0)
    stale = state.critic_ev_stale + 1
    return replace(state, critic_ev_stale=stale, critic_warmup_done=stale >= WARMUP_PATIENCE)


def next_prompts(train: list[Example], cursor: int, n: int, seed: int) -> list[Example]:
    """Prompts ``cursor .. cursor + n`` of the seeded epoch-by-epoch shuffle of ``train``."""
    out: list[Example] = []
    while len(out) < n:
        epoch, offset = divmod(cursor + len(out), len(train))
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed + epoch))
        take = order[offset : offset + n - len(out)].tolist()
        out += [train[i] for i in take]
    return out


def rollout_round(
    p: Parts,
    examples: list[Example],
    first_group: int,
    *,
    engine: RolloutEngine | None = None,
    before_turn: Callable[[], None] | None = None,
) -> list[Scored]:
    """G episodes per prompt, each scored: base reward + shaping (:mod:`rlmap.rollout.scoring`).

    ``engine`` defaults to the run's; an asynchronous worker passes its own, and
    ``before_turn`` (partial rollout: pick up new weights between turns).
    """
    g, group_size = p.cfg.generation, p.cfg.sampling.group_size
    envs = [p.environment(e) for e in examples for _ in range(group_size)]
    b = p.cfg.behaviour
    kept_sets = b.sampling_set_cap if b.replay_sampling_set else 0  # top-p replay
    episodes = run_episodes(
        p.engine if engine is None else engine,
        envs,
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        before_turn=before_turn,
        max_turns=p.cfg.data.turn_budget,
        kept_sets=kept_sets,
    )
    learned, rm_failed = None, False
    if p.reward_model is not None:
        try:
            learned = learned_rewards(p, episodes)
        except Exception:  # the reward model failed: this round's rewards cannot be trusted
            learned, rm_failed = [0.0] * len(episodes), True
    limit = g.max_new_tokens * p.cfg.data.turn_budget  # the episode's length limit, all turns
    references = [examples[k // group_size].answer for k in range(len(episodes))]
    comparing = p.cfg.feedback.source == "comparison"  # the scores are compared, not summed
    rewards = (
        None
        if learned is None or comparing
        else [(*[0.0] * (len(e.rewards) - 1), r) for e, r in zip(episodes, learned, strict=True)]
    )
    groups = [first_group + k // group_size for k in range(len(episodes))]
    seen = trajectories(
        p.tokenizer, episodes, references, limit, rewards, groups, learned if comparing else None
    )
    verdicts = score_episodes(p.base_reward, p.shaping, seen)
    if rm_failed:
        verdicts = [replace(v, status=RewardStatus.INFRA_ERROR) for v in verdicts]
    return [
        Scored(e, first_group + k // group_size, v.outcome, v.reward, v.status, v.per_turn)
        for k, (e, v) in enumerate(zip(episodes, verdicts, strict=True))
    ]


def shared_round(p: Parts, examples: list[Example], first_group: int) -> list[Scored]:
    """:func:`rollout_round` of this rank's contiguous share of ``examples``, then every
    rank's episodes in rank order — the same list on every rank, in the order one process
    would have produced it (one rank: the round itself)."""
    w = p.world
    if not w.parallel:
        return rollout_round(p, examples, first_group)
    bounds = torch.arange(len(examples)).tensor_split(w.size)
    start = int(bounds[w.rank][0]) if len(bounds[w.rank]) else len(examples)
    mine = examples[start : start + len(bounds[w.rank])]
    scored = rollout_round(p, mine, first_group + start) if mine else []
    everyone = gather(w, [replace(x, rank=w.rank) for x in scored])
    return [x for share in everyone for x in share]


def learned_rewards(p: Parts, episodes: list[Episode]) -> list[float]:
    """The reward model's score of each episode's tokens (prompt, turns, observations),
    batched; 0.0 for an episode without tokens (aborted at reset: excluded anyway)."""
    assert p.reward_model is not None
    rows = [list(e.prompt_ids + e.response_ids) for e in episodes if e.prompt_ids]
    if not rows:
        return [0.0] * len(episodes)
    with autocast_to(p.reward_model, p.settings.train_dtype):
        scores = iter(
            score_batch(
                p.reward_model, rows, int(p.tokenizer.pad_token_id), p.cfg.optim.micro_batch_size
            ).tolist()
        )
    return [next(scores) if e.prompt_ids else 0.0 for e in episodes]


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
            torch.tensor([_valid(x) for x in generated]),
        )
    group_id = torch.tensor([x.group for x in generated])
    keep = first_groups(group_id, keep, s.prompts_per_step)
    kept = [x for x, k in zip(generated, keep.tolist(), strict=True) if k]
    tokens = [x.episode.action_tokens for x in generated]
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
        if _valid(x):
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
    outcomes = [x.outcome for x in generated if _valid(x)]
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


def step_times(waited: float, update_s: float, tokens: float) -> dict[str, float]:
    """The ``system/*`` timings both loops log with one meaning (docs/metrics.md): the
    learner's wait for its batch (synchronous: the whole rollout; asynchronous: the queue),
    the rest of the step, the share the learner computed, and the generated tokens per
    second of the whole step."""
    total = max(waited + update_s, 1e-9)
    return {
        "system/learner_wait_s": waited,
        "system/update_s": update_s,
        "system/learner_utilisation": update_s / total,
        "system/tokens_per_s": tokens / total,
    }


def barrier_idle(lengths: list[int]) -> float:
    """Fraction of generation slots idle behind the barrier: 1 − mean / max generated tokens.

    A batched round runs until its longest episode ends; every shorter one's slot waits
    (``system/group_idle_frac``, the synchronous loop's cost that asynchrony avoids). 0 when
    all episodes are equally long."""
    longest = max(lengths, default=0)
    return 1.0 - sum(lengths) / (len(lengths) * longest) if longest else 0.0


def _valid(x: Scored) -> bool:
    """The episode trains (:func:`rlmap.core.batch.trains`, the rule ``Batch.valid`` applies)."""
    return trains(x.status, x.episode.end)


def _groups(generated: list[Scored], keep: torch.Tensor) -> int:
    return len({x.group for x, k in zip(generated, keep.tolist(), strict=True) if k})


def rollout_metrics(scored: list[Scored], p: Parts) -> dict[str, float]:
    """reward/*, length/* (generated tokens), errors/* (each error class's share,
    :func:`rollout_errors`) and, for multi-turn tasks, env/* (turns, tool calls:
    :func:`rlmap.rollout.episodes.episode_metrics`) over every generated episode; with a
    learned reward or a judge, what the task's verifier says of the same rollouts
    (``reward/verifier_mean``), and the judge's ``judge/*`` since the last step (this
    process's requests: with data-parallel learners, rank 0's share)."""
    episodes = [x.episode for x in scored]
    lengths = torch.tensor([e.action_tokens for e in episodes], dtype=torch.float32)
    multi_turn = p.cfg.data.multi_turn
    env = {f"env/{k}": v for k, v in episode_metrics(episodes).items()} if multi_turn else {}
    verifier = {}
    if p.reward_model is not None or p.cfg.feedback.source in ("judge", "comparison"):
        ok = [x.episode.outcome for x in scored if _valid(x)]
        verifier["reward/verifier_mean"] = sum(ok) / len(ok) if ok else math.nan
    return (
        reward_metrics(scored)
        | env
        | verifier
        | judge_metrics(p.base_reward)
        | rollout_errors(scored, p)
        | {
            "length/mean": float(lengths.mean()),
            "length/p95": float(lengths.quantile(0.95)),
            "length/truncated_frac": sum(not e.eos for e in episodes) / len(episodes),
        }
    )


def rollout_errors(scored: list[Scored], p: Parts) -> dict[str, float]:
    """``errors/<class>_frac``: the share of the rollouts failing with each error class
    (:mod:`rlmap.experiments.samples`): whether the reward can be trusted from its status,
    whether the answer was right from the environment's return (the verifier's, even when a
    learned reward model is trained on), as for the held-out samples."""
    pattern = p.cfg.feedback.format_pattern
    classes = [
        error_class(
            Judged(
                x.episode.outcome,
                x.status,
                x.episode.end,
                x.episode.eos,
                x.episode.tool_errors,
                final_answer(p.tokenizer, x.episode),
            ),
            pattern,
        )
        for x in scored
    ]
    return {k.removeprefix("eval/"): v for k, v in class_fractions(classes).items()}


def reward_metrics(scored: list[Scored]) -> dict[str, float]:
    """reward/*: the shaped return's mean and spread and the outcome's mean over the episodes
    whose reward can be trusted (a failed verifier's 0 never enters them); none when no
    episode can be. The share of each failure is ``errors/<class>_frac``
    (:func:`rollout_errors`), its one name."""
    ok = [x for x in scored if _valid(x)]
    rewards = torch.tensor([x.reward for x in ok])
    if not ok:
        return {}
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(ok) > 1 else 0.0,
        "reward/outcome_mean": sum(x.outcome for x in ok) / len(ok),
    }


def learn(
    p: Parts, batch: Batch, state: LoopState, owner: torch.Tensor | None = None
) -> dict[str, float]:
    """:func:`update`, then the new weights to the rollout engine (:func:`publish`).

    An engine that sleeps while the learner steps (vLLM on the learner's GPU,
    ``system.engine_sleep``) sleeps here, and wakes in two halves around the reload, as TRL's
    colocated mode does: its weights' memory, the reload into it, and only then its KV cache
    (with a fresh prefix cache), which would otherwise take the reload's room.
    """
    engine: Any = p.engine
    sleeps = getattr(engine, "sleep_level", 0) > 0
    if sleeps:
        engine.sleep()
    metrics = update(p, batch, state, owner)
    if sleeps:
        engine.wake("weights")
    metrics["system/weight_sync_s"] = publish(p, state.step + 1)
    if sleeps:
        engine.wake("kv_cache")
    return metrics


def update(
    p: Parts, batch: Batch, state: LoopState, owner: torch.Tensor | None = None
) -> dict[str, float]:
    """π_old / π_ref, (KL in the reward), critic values, advantages, critic and policy steps.

    With several learner ranks ``batch`` is the global batch (the same on every rank) and
    ``owner`` the rank that trains each row; the advantages are computed on all of it.
    """
    estimator = estimators.registry.get(p.cfg.credit.estimator)
    beta = kl_beta(p, state)
    settings = replace(p.settings, kl=replace(p.settings.kl, beta=beta))
    # The KL in the reward is k1 = log π_old − log π_ref on the sampled tokens: π_old is the
    # trainer's (decoupled mode), not the engine's μ, or a train/rollout mismatch leaks in.
    kl_reward = p.cfg.kl.placement == "reward" and p.cfg.behaviour.mode == "decoupled"
    needs_pi = estimator.needs_policy_logprobs or kl_reward
    batch, timings = prepare_batch(
        batch,
        p.trained,
        p.reference,
        settings,
        policy_logprobs=needs_pi,
        world=p.world,
        owner=owner,
    )
    metrics: dict[str, float] = dict(timings)
    if p.cfg.kl.placement != "none":
        metrics["kl/beta"] = beta
    ref = batch.ref_logprobs
    if p.cfg.kl.placement == "reward" and ref is not None:
        old = batch.old_logprobs
        bypass = old is None or p.cfg.behaviour.mode == "bypass"  # π_old := μ
        current = batch.behavior_logprobs if bypass or old is None else old
        penalised = kl_in_reward(batch.step_rewards, current, ref, batch.action_mask, beta)
        batch = batch.replace(token_rewards=penalised)
        k1 = (current - ref).float()  # the penalty's KL estimate, per token
        metrics["kl/mean"] = float(masked_mean(k1, batch.action_mask))
    warming = critic_warming_up(p, state)
    if p.critic is not None:
        started = time.perf_counter()
        critic = p.trained_critic
        assert critic is not None
        values, bootstrap = compute_values(
            critic, batch, p.settings.micro_batch_size, p.settings.train_dtype
        )
        batch = batch.replace(values=values, bootstrap_values=bootstrap)
        metrics["system/critic_values_s"] = elapsed(started, p.device)
    if p.cfg.sampling.group_scope == "turn":  # GiGPO's anchor states (docs/formulas.md §2.4)
        batch = batch.replace(turn_group=estimators.turn_groups(batch))
    credit = estimator.fn(batch, _credit_params(p, warming))
    metrics |= {k: float(v) for k, v in credit.diagnostics.items()}
    seed = p.cfg.seed * 1_000_003 + state.step
    if p.critic is not None:
        metrics |= _learn_critic(p, batch, credit, seed, owner)
        metrics["critic/pretraining"] = float(warming)
    if not warming:
        metrics |= _learn_policy(p, batch, credit, state, seed, settings, owner)
    return metrics


def publish(p: Parts, version: int) -> float:
    """The policy's current weights to the rollout engine, labelled ``version``; the seconds
    it took (an HF engine that shares the policy: next to none). An engine with weights of
    its own takes them one tensor at a time (:func:`rlmap.models.lora.rollout_stream`);
    FSDP2 gathers each parameter from the shards as its turn comes, never the whole state
    dict at once — a collective, which every rank runs since every rank's engine takes the
    whole stream."""
    started = time.perf_counter()
    p.engine.update_weights(p.policy, version)
    return elapsed(started, p.device)


def _credit_params(p: Parts, warming: bool) -> CreditParams:
    """The recipe's credit settings; Monte-Carlo critic targets (λ_critic = 1) in pre-training."""
    if warming and p.cfg.critic.pretrain_mc:
        return replace(p.cfg.credit, lam_critic=1.0)
    return p.cfg.credit


def _learn_critic(
    p: Parts, batch: Batch, credit: Credit, seed: int, owner: torch.Tensor | None
) -> dict[str, float]:
    """The critic's optimiser steps toward ``credit.returns`` (V_old = ``batch.values``)."""
    critic = p.trained_critic
    assert critic is not None and p.critic_optimizer is not None
    if credit.returns is None:
        raise ValueError(f"estimator '{p.cfg.credit.estimator}' returned no critic targets")
    started = time.perf_counter()
    metrics = update_critic(
        critic,
        p.critic_optimizer,
        p.critic_scheduler,
        batch,
        credit.returns,
        critic_settings(p.cfg),
        generator=torch.Generator().manual_seed(seed),
        world=p.world,
        owner=owner,
    )
    return metrics | {"system/critic_update_s": elapsed(started, p.device)}


def _learn_policy(
    p: Parts,
    batch: Batch,
    credit: Credit,
    state: LoopState,
    seed: int,
    s: UpdateSettings,
    owner: torch.Tensor | None,
) -> dict[str, float]:
    """The policy's optimiser steps on ``credit.advantages`` (this rank's rows: ``owner``),
    timed with the device's queue drained; ``system/mfu`` where the device's peak is known."""
    started = time.perf_counter()
    metrics = update_policy(
        p.trained,
        p.optimizer,
        p.scheduler,
        batch,
        credit.advantages,
        s,
        learner_version=state.step,
        generator=torch.Generator().manual_seed(seed),
        world=p.world,
        owner=owner,
    )
    seconds = elapsed(started, p.device)
    attention = attention_of(batch)  # the tokens this rank's forward and backward passes saw
    tokens = int((attention if owner is None else attention[owner == p.world.rank]).sum())
    tokens *= s.epochs
    flops = update_flops_per_token(p.policy)
    utilisation = mfu(flops, tokens, seconds, p.device, p.cfg.system.train_dtype)
    return metrics | {
        "optim/policy_steps": float(p.settings.optimizer_steps),
        "system/policy_update_s": seconds,
        "system/update_tokens_per_s": tokens / max(seconds, 1e-9),
        **({} if utilisation is None else {"system/mfu": utilisation}),
    }


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
        owner = torch.tensor([x.rank for x in kept]) if p.world.parallel else None
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
