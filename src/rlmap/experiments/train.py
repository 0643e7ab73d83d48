"""A training run end to end: run directory, the loop, evaluation, records, resume.

The loop itself is :func:`rlmap.system.sync.sync_step`; this module only wraps it
with what a run leaves on disk (DESIGN.md, "Run directory")::

    config.yaml  metrics.jsonl  ledger.json  checkpoints/step_N/  summary.json  plots/
    samples/step_N.jsonl

Each step's timing metrics are charged to the ledger by who spent them: sampling
(``system/learner_wait_s``), the actor (``system/old_logprobs_s`` + ``system/policy_update_s``),
the critic (``system/critic_values_s`` + ``system/critic_update_s``) and the reference
(``system/reference_s``); ``summary.json`` reports the resulting ``compute_share``.

Resume: the newest intact checkpoint restores weights, optimiser, scheduler,
RNG and loop state; ``metrics.jsonl`` is cut back to that step, so a run killed
at any point and resumed logs exactly what an uninterrupted run logs (on CPU,
same seed; timing metrics aside). A damaged newer checkpoint is skipped and kept
aside; a run killed before its first checkpoint starts over from step 0; a config
edited since the checkpoint is refused unless only ``optim.steps`` or
``run.progress`` changed. Every resume leaves a line in ``resumes.jsonl``.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from rlmap import reduction
from rlmap.assembly.models import model_path, reward_model_path
from rlmap.assembly.parts import Parts, build
from rlmap.core.device import describe
from rlmap.core.errors import ConfigError, InputError, TrainingError
from rlmap.core.metrics import upgrade_row
from rlmap.engines.engine import forget_cache
from rlmap.experiments.checkpoint import (
    capture_rng,
    load_trainer_state,
    restore_optimizers,
    restore_rng,
    save_checkpoint,
)
from rlmap.experiments.compare import FAILED_FILE
from rlmap.experiments.fingerprint import (
    checkpoint_fingerprint,
    data_fingerprint,
    tokenizer_fingerprint,
)
from rlmap.experiments.ledger import Ledger, measure_peak_memory, peak_memory_mb, reset_peak_memory
from rlmap.experiments.plots import write_plots
from rlmap.experiments.progress import ProgressView
from rlmap.experiments.records import StepRecords
from rlmap.experiments.resume import ResumePoint, go_ahead, resume_point_of
from rlmap.experiments.rundir import (
    MetricsLog,
    create_run_dir,
    write_json_atomic,
    write_text_atomic,
)
from rlmap.experiments.samples import drop_samples_after, write_samples
from rlmap.feedback.judge import judge_samples
from rlmap.learner.critic import CRITIC_DIR
from rlmap.learner.distributed import (
    SINGLE,
    World,
    all_max,
    barrier,
    full_state_dict,
    gather,
    load_optimizer_state,
    on_main,
    optimizer_state,
)
from rlmap.models.lora import MERGED_DIR, merged_copy
from rlmap.recipes import composition, load_config
from rlmap.recipes.config import RecipeConfig
from rlmap.rollout.evaluate import evaluate
from rlmap.system.async_loop import async_runner
from rlmap.system.sync import LoopState, publish, sync_step

Step = Callable[[Parts, LoopState], tuple[LoopState, dict[str, float]]]

EVAL_SEED = 12345


def run_training(
    cfg: RecipeConfig, run_dir: Path, *, resume: bool = False, world: World = SINGLE
) -> dict[str, Any]:
    """Train into ``run_dir`` (fresh, or continued from its newest checkpoint).

    With several learner ranks (``world``) every rank runs this; rank 0 alone decides the
    resume point, builds the warm start, evaluates and writes the run directory, and
    returns the summary (the other ranks return an empty dict).
    """
    main = world.main
    point = on_main(world, lambda: _resume_point(cfg, run_dir, world) if resume else None)
    ckpt = point.ckpt if point is not None else None
    saved = point.saved if point is not None else None
    if ckpt is not None and saved is None:  # several ranks: each reads the state itself
        saved = load_trainer_state(ckpt)
    view = ProgressView(enabled=cfg.run.progress and main)
    start = on_main(world, lambda: model_path(cfg, progress=view.warm_start))
    reward_path = on_main(
        world, lambda: reward_model_path(cfg, progress=view.phase("reward model"))
    )
    parts = build(cfg, start, resume_from=ckpt, reward_path=reward_path, world=world)
    with ExitStack() as closing:
        state, ledger, before = _begin(cfg, parts, start, run_dir, world, point, saved)
        log = StepRecords.of(cfg, run_dir) if main else None
        if log is not None:
            closing.push(log)  # training raised: the trackers' runs end as failed
            if saved is None:  # a fresh start: the step-0 evaluation
                log.write(0, before | ledger.metrics())
        balance: dict[str, int] = {}
        queue = saved["extra"].get("async") if saved is not None else None
        steps = stepper(parts, state, balance, start, reward_path, queue)
        with view.training(cfg.optim.steps, state.step), steps as loop:
            while state.step < cfg.optim.steps:
                state, ledger = _one_step(parts, state, ledger, log, view, run_dir, loop)
        barrier(world)
        if log is None:
            return {}
        records = MetricsLog.read(run_dir / "metrics.jsonl")
        summary = _finish(run_dir, before, records, ledger, cfg, balance)
        log.finish(summary)
        return summary


def _begin(
    cfg: RecipeConfig,
    parts: Parts,
    start: Path,
    run_dir: Path,
    world: World,
    point: ResumePoint | None,
    saved: dict[str, Any] | None,
) -> tuple[LoopState, Ledger, dict[str, float]]:
    """The loop's state, ledger and held-out figures before training: restored from the
    resume point's checkpoint (the records after it dropped), or fresh (the run directory
    and its config written, the policy evaluated at step 0). ``saved``: the checkpoint's
    trainer state, None for a fresh start."""
    state, ledger = LoopState(), _initial_ledger(cfg, parts, start)
    if point is not None and point.ckpt is not None and saved is not None:
        state, ledger, before = _restore(parts, point.ckpt, saved)  # may refuse: nothing changed
        if world.main:
            go_ahead(run_dir, point)
            MetricsLog.truncate_after(run_dir / "metrics.jsonl", state.step)  # drop the redone
            drop_samples_after(run_dir, state.step)
        return state, ledger, before
    if world.main:
        if point is not None:
            go_ahead(run_dir, point)  # nothing to resume from: set aside, say so, start over
        run_dir.mkdir(parents=True, exist_ok=True)
        MetricsLog.truncate_after(run_dir / "metrics.jsonl", -1)  # a resume that starts over
        drop_samples_after(run_dir, -1)
        write_text_atomic(run_dir / "config.yaml", f"# {composition(cfg)}\n{cfg.to_yaml()}")
    seed_everything(cfg.seed, world.rank)
    before = _evaluate(parts, run_dir, 0) if world.main else {}
    return state, ledger.add(**_judge_spent(before)), before


def _resume_point(cfg: RecipeConfig, run_dir: Path, world: World) -> ResumePoint:
    """Rank 0's resume decision; with several ranks without its trainer state, which is
    sent to every rank (each reads the state itself: a broadcast would pickle a copy of
    the whole optimiser state for every rank)."""
    point = resume_point_of(cfg, run_dir)
    return dataclasses.replace(point, saved=None) if world.parallel else point


def run_seeds(cfg: RecipeConfig, root: Path, seeds: list[int]) -> dict[int, dict[str, Any] | None]:
    """Train ``cfg`` once per seed into ``root/seed<S>``; a run that raises is kept, not hidden.

    A failed run's directory keeps whatever it wrote, plus a ``FAILED`` file with the
    error (``rlmap compare`` lists it); the other seeds still run. Returns each seed's
    summary, None for a failed one. Ctrl-C stops the sweep.
    """
    out: dict[int, dict[str, Any] | None] = {}
    for seed in seeds:
        run_dir = create_run_dir(out=root / f"seed{seed}")
        try:
            out[seed] = run_training(cfg.model_copy(update={"seed": seed}), run_dir)
        except Exception as exc:  # kept and reported: a sweep must not hide its failures
            write_text_atomic(run_dir / FAILED_FILE, f"{type(exc).__name__}: {exc}\n")
            out[seed] = None
    return out


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


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed every random stream the run draws from (rollout sampling uses torch's); each
    learner rank draws its own rollouts (rank 0's streams are the single process's)."""
    seed = seed + RANK_SEED_STRIDE * rank
    random.seed(seed)
    torch.manual_seed(seed)


RANK_SEED_STRIDE = 1_000_003
"""Seed offset between learner ranks."""


def _one_step(
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
            metrics |= _evaluate(parts, run_dir, new_state.step)
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
        **_judge_spent(metrics),
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
    optimizers, schedulers = _optimizers(parts)
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


def _judge_spent(metrics: dict[str, float]) -> dict[str, int]:
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


def _optimizers(parts: Parts) -> tuple[dict[str, Any], dict[str, Any]]:
    """(optimisers, schedulers) by name, as checkpoints store them: policy, and critic if any."""
    optimizers: dict[str, Any] = {"policy": parts.optimizer}
    schedulers: dict[str, Any] = {"policy": parts.scheduler}
    if parts.critic is not None:
        optimizers[CRITIC_DIR] = parts.critic_optimizer
        schedulers[CRITIC_DIR] = parts.critic_scheduler
    return optimizers, schedulers


def _evaluate(parts: Parts, run_dir: Path, step: int) -> dict[str, float]:
    """Held-out scores, and ``samples/step_<step>.jsonl`` (``run.samples`` of the held-out
    generations, :mod:`rlmap.experiments.samples`); an engine with a cache (vLLM's prefix
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


def _initial_ledger(cfg: RecipeConfig, parts: Parts, start: Path) -> Ledger:
    r = cfg.reduction
    summary = reduction.registry.get(r.name).summary
    denominator = summary if r.max_len is None else f"{summary}; L_max={r.max_len}"
    return Ledger(
        epochs_per_batch=cfg.optim.epochs_per_batch,
        effective_batch=cfg.sampling.prompts_per_step
        * cfg.sampling.group_size
        // cfg.optim.minibatches_per_epoch,
        reduction=r.name,
        denominator=denominator,
        engine=cfg.system.engine,
        engine_sleep=getattr(parts.engine, "sleep_level", 0),
        precision=_precision(cfg),
        **describe(parts.device),
        base_model=cfg.model.path,
        base_fingerprint=checkpoint_fingerprint(start),
        tokenizer_fingerprint=tokenizer_fingerprint(parts.tokenizer),
        data_fingerprint=data_fingerprint(parts.train, parts.heldout, cfg.data.task_args),
        verifier=cfg.feedback.verifier,
        eval_verifier=cfg.feedback.eval_verifier or cfg.feedback.verifier,
        task=cfg.data.task,
    )


def _precision(cfg: RecipeConfig) -> str:
    """The ledger's precision: a bfloat16 learner is autocast over float32 weights, which
    runs written before it was (bfloat16 weights) are not."""
    system = cfg.system
    train = system.train_dtype + (" autocast" if system.train_dtype != "float32" else "")
    return f"train {train} / rollout {system.rollout_dtype}"


def _restore(
    parts: Parts, ckpt: Path, state: dict[str, Any]
) -> tuple[LoopState, Ledger, dict[str, float]]:
    optimizers, schedulers = _optimizers(parts)
    world = parts.world
    if world.parallel:  # the optimiser through its (sharded) learner; each rank's own RNG
        load_optimizer_state(parts.trained, parts.optimizer, state["optimizers"]["policy"], world)
        if parts.critic_learner is not None and parts.critic_optimizer is not None:
            load_optimizer_state(
                parts.critic_learner, parts.critic_optimizer, state["optimizers"][CRITIC_DIR], world
            )
        restore_optimizers(state, optimizers={}, schedulers=schedulers, only=("schedulers",))
        restore_rng({"rng": state["extra"]["rank_rng"][world.rank]}, parts.device)
    else:
        try:
            restore_optimizers(state, optimizers=optimizers, schedulers=schedulers)
        except ValueError as exc:  # checked before anything was loaded
            raise InputError(f"{ckpt}: {exc}; resume with the recipe that wrote it") from None
        restore_rng(state, parts.device)
    loop = LoopState.saved(state["extra"]["loop"])
    publish(parts, loop.step)
    if not world.main:
        return loop, Ledger.from_dict(state["extra"]["ledger"]), {}
    first = MetricsLog.read(ckpt.parent.parent / "metrics.jsonl")[0]
    before = {k: v for k, v in first.items() if k.startswith("eval/")}
    return loop, Ledger.from_dict(state["extra"]["ledger"]), before


def _finish(
    run_dir: Path,
    before: dict[str, Any],
    records: list[dict[str, Any]],
    ledger: Ledger,
    cfg: RecipeConfig,
    balance: dict[str, int] | None = None,
) -> dict[str, Any]:
    after = records[-1]
    summary = {
        "before": {k: before.get(k) for k in ("eval/pass@1", "eval/pass@k", "eval/k")},
        "after": {k: after.get(k) for k in ("eval/pass@1", "eval/pass@k", "eval/k")},
        "generated_tokens": ledger.generated_tokens,
        "wall_clock_s": ledger.wall_clock_s,
        "learner_steps": ledger.learner_steps,
        "compute_share": ledger.compute_share(),
        "device": {
            "device": ledger.device,
            "device_name": ledger.device_name,
            "cuda": ledger.cuda,
            "fp32_matmul": ledger.fp32_matmul,
            "deterministic_kernels": ledger.deterministic_kernels,
        },
    }
    if balance:  # the asynchronous loop's trajectories: finished = consumed + dropped + queued
        summary["trajectories"] = balance
        ledger = dataclasses.replace(
            ledger,
            aborted_rollouts=balance["aborted"],
            queued_at_end=balance["queued_at_end"],
            restarted_rollouts=balance["restarted"],
        )
    if cfg.critic.enabled:
        summary["critic_steps"] = ledger.critic_steps
        summary["critic_explained_variance_before_policy"] = ev_before_policy(records)
    write_json_atomic(run_dir / "ledger.json", ledger.to_dict())
    write_json_atomic(run_dir / "summary.json", summary)
    write_plots([upgrade_row(r) for r in records], run_dir / "plots")  # a resume across a rename
    return summary


def ev_before_policy(records: list[dict[str, Any]]) -> float | None:
    """The critic's explained variance as the policy's first update found it.

    That is ``critic/explained_variance`` of the last warm-up step (``critic/pretraining``
    = 1; measured on its fresh rollouts before its critic update). Without a warm-up it
    is the first step's, measured before that step's critic and policy updates. None when
    no step logged one (or it was undefined: all returns equal).
    """
    key = "critic/explained_variance"
    warmup = [r for r in records if r.get("critic/pretraining") == 1 and key in r]
    logged = warmup[-1:] or [r for r in records if key in r][:1]
    return logged[0][key] if logged else None


def resume_config(run_dir: Path, overrides: list[str]) -> RecipeConfig:
    """The saved config of a run to resume; changing it on resume is refused."""
    if overrides:
        raise ConfigError(f"--resume {run_dir}: overrides are not allowed when resuming")
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"--resume {run_dir}: no config.yaml; not a run directory")
    return load_config(run_dir / "config.yaml")
