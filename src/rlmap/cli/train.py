"""``rlmap train`` (one run, a sweep over seeds, ``--preflight``, ``--resume``, data-parallel
learner ranks) and ``rlmap eval``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from rlmap.cli.common import quiet_transformers, resolve_device
from rlmap.core.errors import ConfigError

if TYPE_CHECKING:
    from rlmap.learner.distributed import World
    from rlmap.recipes.config import RecipeConfig


def cmd_train(args: argparse.Namespace) -> int | None:
    import os
    from pathlib import Path

    from rlmap.assembly.checks import check_inputs
    from rlmap.experiments.train import resume_config
    from rlmap.learner import launch
    from rlmap.recipes import build_config
    from rlmap.recipes.build import embedded_task_note
    from rlmap.runs.rundir import check_new_dir, read_yaml

    quiet_transformers()
    rank, _ = launch.launched_rank(os.environ)  # a half-set launcher: refused first
    if args.resume is not None:
        if args.preflight:
            raise ConfigError("--preflight: not with --resume (preflight a config, not a run)")
        given = [
            flag
            for flag, value in (
                ("--seeds", args.seeds),
                ("--config", args.config),
                ("--recipe", args.recipe),
                ("--out", args.out),
                ("--seed", args.seed),
            )
            if value is not None
        ]
        if given:
            raise ConfigError(
                f"{given[0]}: does not apply with --resume (the run directory holds its "
                "config; resume each seed's directory on its own)"
            )
        cfg = resume_config(Path(args.resume), args.overrides)
    else:
        if args.recipe is not None and args.config is not None:
            raise ConfigError("--recipe and --config: give one (a config file names its recipe)")
        if args.seeds is not None and args.seeds < 1:
            raise ConfigError(f"--seeds: must be >= 1, got {args.seeds}")
        if args.out is not None and rank == 0:  # rank 0 creates it
            check_new_dir(Path(args.out))  # fail before loading anything
        overrides = list(args.overrides) + ([f"seed={args.seed}"] if args.seed is not None else [])
        file_data = read_yaml(args.config) if args.config else None
        cfg = build_config(args.recipe, file_data, overrides)
        if args.preflight:
            return _preflight(cfg, args)
        check_inputs(cfg)
        note = embedded_task_note(cfg)
        if note is not None and rank == 0:
            print(f"rlmap: {note}", file=sys.stderr)
        if args.seeds is not None:
            return _train_seeds(cfg, args)
    world = learner_world(cfg)
    if world is None:  # several learners and no launcher: this process starts the ranks
        return launch.launch(cfg.system.learners, args.argv)
    with launch.joined(world):
        return _train_rank(args, cfg, world)


def _train_seeds(cfg: RecipeConfig, args: argparse.Namespace) -> int:
    """``--seeds N``: the config over seeds seed, seed+1, … into sibling directories."""
    from pathlib import Path

    from rlmap.experiments.train import run_seeds
    from rlmap.runs.rundir import create_run_dir

    if cfg.system.learners > 1:
        raise ConfigError("--seeds: not with system.learners > 1 yet; train each seed on its own")

    root = create_run_dir(out=Path(args.out) if args.out else None)
    print(f"sweep directory: {root}", flush=True)
    seeds = [cfg.seed + k for k in range(args.seeds)]
    results = run_seeds(cfg, root, seeds)
    for seed, summary in results.items():
        if summary is None:
            print(f"seed {seed}: FAILED (see {root / f'seed{seed}' / 'FAILED'})")
        else:
            b, a = summary["before"]["eval/pass@1"], summary["after"]["eval/pass@1"]
            tokens, seconds = summary["generated_tokens"], summary["wall_clock_s"]
            print(
                f"seed {seed}: held-out pass@1 {b:.3f} -> {a:.3f}, {tokens} tokens, {seconds:.0f} s"
            )
    print(root)
    failed = [s for s, v in results.items() if v is None]
    if failed:
        print(f"rlmap: {len(failed)} of {len(seeds)} runs failed: seeds {failed}", file=sys.stderr)
        return 1
    return 0


def _preflight(cfg: RecipeConfig, args: argparse.Namespace) -> int:
    """``--preflight``: the go / no-go table (:mod:`rlmap.experiments.preflight`); 0 on go,
    1 on no-go; no run directory."""
    from rlmap.experiments.preflight import preflight, table, went

    if args.seeds is not None:
        raise ConfigError("--preflight: not with --seeds (check the config once)")
    rows = preflight(cfg)
    print(table(rows))
    return 0 if went(rows) else 1


def _train_rank(args: argparse.Namespace, cfg: RecipeConfig, world: World) -> int:
    """One learner rank's training (the only one, in one process); rank 0 reports."""
    from pathlib import Path

    from rlmap.experiments.train import run_training
    from rlmap.learner import distributed
    from rlmap.runs.rundir import create_run_dir

    existed = True
    if args.resume is not None:
        run_dir = Path(args.resume)
    else:
        existed = args.out is not None and Path(args.out).exists()
        run_dir = distributed.on_main(
            world, lambda: create_run_dir(out=Path(args.out) if args.out else None).resolve()
        )
    if world.main:
        print(f"run directory: {run_dir}", flush=True)
    try:
        summary = run_training(cfg, run_dir, resume=args.resume is not None, world=world)
    except BaseException:
        if world.main and not existed and not any(run_dir.iterdir()):
            run_dir.rmdir()  # failed before writing anything (a full disk): leave no trace
        raise
    if not world.main:
        return 0
    before, after = summary["before"], summary["after"]
    print(
        f"held-out pass@1 {before['eval/pass@1']:.3f} -> {after['eval/pass@1']:.3f}, "
        f"pass@{int(after['eval/k'])} {before['eval/pass@k']:.3f} -> {after['eval/pass@k']:.3f}, "
        f"{summary['generated_tokens']} tokens, {summary['wall_clock_s']:.0f} s"
    )
    share = summary["compute_share"]
    print(
        f"learner compute: actor {share['actor']:.0%}, critic {share['critic']:.0%}, "
        f"reference {share['reference']:.0%}; sampling {share['rollout_of_total']:.0%} "
        "of sampling + learner"
    )
    print(run_dir)
    return 0


def learner_world(cfg: RecipeConfig) -> World | None:
    """This process's learner rank: one process; a rank of a launched world (rlmap's own
    launcher or ``torchrun``: ``WORLD_SIZE`` set, which must be ``system.learners``); or
    None when ``system.learners > 1`` and no launcher has started this process. The rank's
    device is resolved first (each rank of a node on a GPU of its own when the learner is on
    CUDA), so that a node short of GPUs is refused before any rank starts."""
    import os

    from rlmap.learner import distributed, launch

    n = cfg.system.learners
    _, size = launch.launched_rank(os.environ)
    if size > 1 and size != n:
        raise ConfigError(
            f"system.learners: {n}, but the launcher started {size} ranks "
            "(WORLD_SIZE); make them equal"
        )
    if n == 1:
        return distributed.SINGLE
    on_node = n if size == 1 else None  # rlmap's launcher: all n here; torchrun: it says
    device = launch.node_device(cfg.system.device, os.environ, on_node)
    if size == 1:
        return None
    return launch.world_of_env(cfg.system.learner_sharding, device, cfg.system.train_dtype)


def cmd_eval(args: argparse.Namespace) -> None:
    from pathlib import Path

    from rlmap.experiments.evaluation import evaluate_checkpoint

    # eval samples with the HF engine whatever the run used (the metric is the same); an
    # override asking for vLLM would be accepted and change nothing, so it is refused
    asked = {
        key.strip(): value.strip() for key, _, value in (o.partition("=") for o in args.overrides)
    }
    if asked.get("system.engine") == "vllm":
        raise ConfigError(
            "system.engine: rlmap eval samples with the HF engine; "
            "system.engine=vllm is not supported here (leave it out)"
        )
    device = resolve_device(args)
    quiet_transformers()
    metrics = evaluate_checkpoint(
        Path(args.checkpoint), samples=args.samples, overrides=args.overrides, device=device
    )
    for key, value in metrics.items():
        print(f"{key:<16} {value:.4f}")
