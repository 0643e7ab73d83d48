"""One step of a training run, and what the run keeps of it: the loop's step (synchronous
barrier or asynchronous queue), the held-out evaluation, the ledger's charges, peak memory
and the checkpoint.

Each step's timing metrics are charged to the ledger by who spent them: sampling
(``system/learner_wait_s``), the actor (``system/old_logprobs_s`` + ``system/policy_update_s``),
the critic (``system/critic_values_s`` + ``system/critic_update_s``) and the reference
(``system/reference_s``). The run around the steps is :mod:`rlmap.experiments.train`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from rlmap.assembly.parts import Parts
from rlmap.core.errors import TrainingError
from rlmap.engines.engine import forget_cache
from rlmap.experiments.checkpoint import capture_rng, save_checkpoint
from rlmap.experiments.ledger import Ledger, measure_peak_memory, peak_memory_mb, reset_peak_memory
from rlmap.experiments.progress import ProgressView
from rlmap.experiments.records import StepRecords
from rlmap.feedback.judge import judge_samples
from rlmap.learner.critic import CRITIC_DIR
from rlmap.learner.distributed import (
    World,
    all_max,
    barrier,
    full_state_dict,
    gather,
    optimizer_state,
)
from rlmap.models.lora import MERGED_DIR, merged_copy
from rlmap.rollout.evaluate import evaluate
from rlmap.rollout.segments import run_context_policy
from rlmap.runs.rundir import write_json_atomic
from rlmap.runs.samples import write_samples
from rlmap.system.async_loop import async_runner
from rlmap.system.loop_state import LoopState
from rlmap.system.sync import sync_step

Step = Callable[[Parts, LoopState], tuple[LoopState, dict[str, float]]]

EVAL_SEED = 12345


@dataclass(frozen=True)
class Loop:
    """The loop's step, and (asynchronous loop) what a checkpoint keeps of its queue."""

    step: Step
    snapshot: Callable[[], dict[str, Any]] | None = None


@contextmanager
def stepper(
    parts: Parts,
    state: LoopState,
    report: dict[str, int],
    start: Path,
    reward_path: Path | None,
    restored: dict[str, Any] | None = None,
) -> Iterator[Loop]:
    """The loop's step: the synchronous barrier, or the asynchronous queue's learner step
    (its workers — threads, or Ray actors with ``system.backend=ray`` — live as long as
    the block, going on from ``restored``, a checkpoint's snapshot; their balance lands in
    ``report``)."""
    if parts.cfg.system.mode == "sync":
        yield Loop(lambda p, s: sync_step(p, s))  # looked up per call: tests replace sync_step
        return
    if parts.cfg.system.backend == "inprocess":
        with async_runner(parts, state, report, restored=restored) as runner:
            yield Loop(lambda p, s: runner.step(s), runner.snapshot)
        return
    from rlmap.system.ray_workers import RayPool

    pool = RayPool(start, reward_path)
    try:
        with async_runner(parts, state, report, pool, restored) as runner:
            yield Loop(lambda p, s: runner.step(s), runner.snapshot)
    finally:
        pool.shutdown()


def one_step(
    parts: Parts,
    state: LoopState,
    ledger: Ledger,
    log: StepRecords | None,
    view: ProgressView,
    run_dir: Path,
    loop: Loop,
) -> tuple[LoopState, Ledger]:
    cfg, started = parts.cfg, time.perf_counter()
    reset_peak_memory(parts.device)
    try:
        new_state, metrics = loop.step(parts, state)
        rollout = metrics.get("system/rollout_peak_memory_mb")  # sync, on a GPU
        # read before the evaluation: the learner's phases (with the rollout in async)
        peaks = peak_memory(
            parts.world, parts.device, None if rollout is None else round(rollout * 2**20)
        )
        last = new_state.step == cfg.optim.steps
        if parts.world.main and (last or new_state.step % cfg.run.eval_every == 0):
            metrics |= evaluate_at(parts, run_dir, new_state.step)
    except TrainingError as exc:  # the run directory keeps every step before this one
        raise TrainingError(f"step {state.step + 1}: {exc}") from None
    state = new_state
    metrics["system/peak_memory_mb"] = peak_memory_mb(*peaks[:2])
    if peaks[2] is not None:  # the largest over the ranks
        metrics["system/rollout_peak_memory_mb"] = peaks[2] / 2**20
    ledger = ledger.add(
        generated_tokens=int(metrics["sampling/generated_tokens"]),
        prompts=round(metrics["sampling/generated"] / cfg.sampling.group_size),  # G a prompt
        rollouts=int(metrics["sampling/generated"]),
        learner_steps=int(metrics.get("optim/policy_steps", 0)),
        critic_steps=int(metrics.get("optim/critic_steps", 0)),
        filtered_rollouts=filtered_rollouts(metrics),
        rejected_rollouts=int(metrics["sampling/rejected"]),
        infra_error_rollouts=_rollouts(metrics, "errors/infra_error_frac"),
        timeout_rollouts=_rollouts(metrics, "errors/timeout_frac"),
        empty_steps=int(metrics.get("system/empty_step", 0)),
        skipped_prompts=int(metrics.get("sampling/skipped", 0)),
        **judge_spent(metrics),
        comparison_pairs=int(metrics.get("judge/pairs", 0)),
        wall_clock_s=time.perf_counter() - started,
        rollout_s=_seconds(metrics, "system/learner_wait_s"),  # sync: the rollout itself
        actor_s=_seconds(metrics, "system/old_logprobs_s", "system/policy_update_s"),
        critic_s=_seconds(metrics, "system/critic_values_s", "system/critic_update_s"),
        reference_s=_seconds(metrics, "system/reference_s"),
    ).with_peak_memory(*peaks)
    if log is not None:
        log.write(state.step, metrics | ledger.metrics())
    view.step(state.step, metrics, ledger)
    if last or state.step % cfg.run.checkpoint_every == 0:
        _checkpoint(parts, state, ledger, run_dir, loop.snapshot)
    return state, ledger


def peak_memory(
    world: World, device: torch.device, rollout: int | None = None
) -> tuple[int, int | None, int | None]:
    """(host KiB, learner GPU bytes, rollout GPU bytes): :func:`measure_peak_memory` on the
    learner's ``device`` and the rollout's peak ``rollout``, each the largest over the
    learner ranks (None: not measured)."""
    cpu, gpu = measure_peak_memory(device)
    if not world.parallel:
        return cpu, gpu, rollout
    top_cpu, top_gpu, top_rollout = all_max(
        world, [cpu, -1 if gpu is None else gpu, -1 if rollout is None else rollout]
    )
    return int(top_cpu), _measured(top_gpu), _measured(top_rollout)


def _measured(value: float) -> int | None:
    """A gathered peak: -1 stands for not measured."""
    return None if value < 0 else int(value)


def _checkpoint(
    parts: Parts,
    state: LoopState,
    ledger: Ledger,
    run_dir: Path,
    snapshot: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """The step's checkpoint, written by rank 0: with several ranks the full weights and
    optimiser state are gathered first (FSDP2) and every rank's RNG state goes with it;
    an asynchronous run's queue, rounds in flight and counters go with it too
    (``snapshot``, :meth:`rlmap.system.async_loop.AsyncRunner.snapshot`)."""
    cfg, world = parts.cfg, parts.world
    optimizers, schedulers = named_optimizers(parts)
    extra: dict[str, Any] = {
        "loop": asdict(state),
        "ledger": ledger.to_dict(),
        "config": cfg.model_dump(mode="json"),
    }
    if snapshot is not None:
        extra["async"] = snapshot()
    model_state = optimizer_states = extra_states = None
    if world.parallel:
        extra["rank_rng"] = gather(world, capture_rng(parts.device))
        model_state = full_state_dict(parts.trained, world, main_only=True)
        optimizer_states = {"policy": optimizer_state(parts.trained, parts.optimizer, world)}
        if parts.critic_learner is not None and parts.critic_optimizer is not None:
            extra_states = {
                CRITIC_DIR: full_state_dict(parts.critic_learner, world, main_only=True, prefix="")
            }
            critic_state = optimizer_state(parts.critic_learner, parts.critic_optimizer, world)
            optimizer_states[CRITIC_DIR] = critic_state
    if world.main:
        extra_models = {} if parts.critic is None else {CRITIC_DIR: parts.critic}
        if cfg.run.save_merged:  # LoRA: the plain model W + (α/r)·BA beside the adapter
            extra_models[MERGED_DIR] = merged_copy(parts.policy)
        save_checkpoint(
            run_dir,
            state.step,
            model=parts.policy,
            tokenizer=parts.tokenizer,
            optimizers=optimizers,
            schedulers=schedulers,
            extra=extra,
            keep=cfg.run.keep_checkpoints,
            extra_models=extra_models,
            model_state=model_state,
            optimizer_states=optimizer_states,
            extra_states=extra_states,
            device=parts.device,
        )
        write_json_atomic(run_dir / "ledger.json", ledger.to_dict())
    barrier(world)  # no rank goes on (or is killed) before the checkpoint is in place


def judge_spent(metrics: dict[str, float]) -> dict[str, int]:
    """The judge's requests and tokens of a step (training rollouts and the evaluation's
    samples), as the ledger counts them."""
    calls = _seconds(metrics, "judge/calls", "eval/judge/calls")
    tokens = _seconds(
        metrics,
        "judge/prompt_tokens",
        "judge/completion_tokens",
        "eval/judge/prompt_tokens",
        "eval/judge/completion_tokens",
    )
    return {"judge_calls": int(calls), "judge_tokens": int(tokens)}


def _rollouts(metrics: dict[str, float], fraction: str) -> int:
    """How many of the step's generated trajectories a ``errors/*`` fraction is."""
    return round(metrics.get(fraction, 0.0) * metrics["sampling/generated"])


def _seconds(metrics: dict[str, float], *names: str) -> float:
    """The sum of these timing (or count) metrics; a part that did not run this step logged
    none (0)."""
    return sum(metrics.get(name, 0.0) for name in names)


def filtered_rollouts(metrics: dict[str, float]) -> int:
    """Rollouts the sampling axis dropped this step: generated − kept − rejected, in counts
    (a fraction times a count would round, and a count below 0 would break the ledger)."""
    generated, kept = int(metrics["sampling/generated"]), int(metrics["sampling/kept"])
    return generated - kept - int(metrics["sampling/rejected"])


def named_optimizers(parts: Parts) -> tuple[dict[str, Any], dict[str, Any]]:
    """(optimisers, schedulers) by name, as checkpoints store them: policy, and critic if any."""
    optimizers: dict[str, Any] = {"policy": parts.optimizer}
    schedulers: dict[str, Any] = {"policy": parts.scheduler}
    if parts.critic is not None:
        optimizers[CRITIC_DIR] = parts.critic_optimizer
        schedulers[CRITIC_DIR] = parts.critic_scheduler
    return optimizers, schedulers


def evaluate_at(parts: Parts, run_dir: Path, step: int) -> dict[str, float]:
    """Held-out scores, and ``samples/step_<step>.jsonl`` (``run.samples`` of the held-out
    generations, :mod:`rlmap.runs.samples`); an engine with a cache (vLLM's prefix
    cache) forgets the held-out prompts after (:func:`rlmap.engines.engine.forget_cache`)."""
    cfg, g = parts.cfg, parts.cfg.generation
    environment = parts.eval_environment or parts.environment
    rows: list[dict[str, Any]] = []
    scores = evaluate(
        parts.engine,
        environment,
        parts.tokenizer,
        parts.heldout,
        samples=g.eval_samples,
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        seed=EVAL_SEED,
        multi_turn=cfg.data.multi_turn,
        rescore=parts.eval_rescore,
        max_turns=cfg.data.turn_budget,
        next_context=run_context_policy(cfg.data, parts.tokenizer),
        keep=cfg.run.samples,
        samples_out=rows,
        format_pattern=cfg.feedback.format_pattern,
        rescore_items=parts.eval_rescore_items,
    )
    forget_cache(parts.engine)
    spent = judge_samples(parts.base_reward, rows)
    if rows:
        write_samples(run_dir, step, rows)
    return scores | spent
