"""A training run end to end: run directory, the loop, evaluation, records, resume.

The loop itself is :func:`rlmap.system.sync.sync_step`; this module only wraps it
with what a run leaves on disk (DESIGN.md, "Run directory")::

    config.yaml  metrics.jsonl  ledger.json  checkpoints/step_N/  summary.json  plots/
    samples/step_N.jsonl

One step with what the run keeps of it (its evaluation, its charges to the ledger by who
spent the time, its checkpoint) is :mod:`rlmap.experiments.train_step`; ``summary.json``
reports the resulting ``compute_share``.

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
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from rlmap import reduction
from rlmap.assembly.models import model_path, reward_model_path
from rlmap.assembly.parts import Parts, build
from rlmap.core.device import describe
from rlmap.core.errors import ConfigError, InputError
from rlmap.core.metrics import upgrade_row
from rlmap.experiments.checkpoint_load import load_trainer_state, restore_optimizers, restore_rng
from rlmap.experiments.compare_runs import FAILED_FILE
from rlmap.experiments.fingerprint import (
    checkpoint_fingerprint,
    data_fingerprint,
    tokenizer_fingerprint,
)
from rlmap.experiments.ledger import Ledger
from rlmap.experiments.plots import write_plots
from rlmap.experiments.progress import ProgressView
from rlmap.experiments.records import StepRecords
from rlmap.experiments.resume import ResumePoint, go_ahead, resume_point_of
from rlmap.experiments.train_step import (
    evaluate_at,
    judge_spent,
    named_optimizers,
    one_step,
    stepper,
)
from rlmap.learner.critic import CRITIC_DIR
from rlmap.learner.distributed import SINGLE, World, barrier, load_optimizer_state, on_main
from rlmap.recipes import composition, load_config
from rlmap.recipes.config import RecipeConfig
from rlmap.runs.rundir import (
    MetricsLog,
    create_run_dir,
    write_json_atomic,
    write_text_atomic,
)
from rlmap.runs.samples import drop_samples_after
from rlmap.system.learner_step import publish
from rlmap.system.loop_state import LoopState


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
                state, ledger = one_step(parts, state, ledger, log, view, run_dir, loop)
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
    before = evaluate_at(parts, run_dir, 0) if world.main else {}
    return state, ledger.add(**judge_spent(before)), before


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


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed every random stream the run draws from (rollout sampling uses torch's); each
    learner rank draws its own rollouts (rank 0's streams are the single process's)."""
    seed = seed + RANK_SEED_STRIDE * rank
    random.seed(seed)
    torch.manual_seed(seed)


RANK_SEED_STRIDE = 1_000_003
"""Seed offset between learner ranks."""


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
    optimizers, schedulers = named_optimizers(parts)
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
