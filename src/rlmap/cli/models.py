"""The learned models' commands: ``reward-model pairs``, ``reward-model train`` and
``judge-model``.
"""

from __future__ import annotations

import argparse

from rlmap.cli.common import at_least, quiet_transformers, resolve_device
from rlmap.core.errors import ConfigError


def cmd_reward_pairs(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rlmap.assembly.embedded import warm_start_spec
    from rlmap.learned.preferences import PreferenceSpec, embedded_pairs
    from rlmap.learned.reward_model import heldout_path, write_pairs
    from rlmap.recipes import build_config
    from rlmap.runs.rundir import check_new_file

    at_least(1, n=args.n, heldout=args.heldout)
    if not 0.0 <= args.noise <= 1.0:
        raise ConfigError(f"--noise: a probability in [0, 1], got {args.noise}")
    out = Path(args.out)
    side = heldout_path(out)
    for path in (out, side):  # both checked before either is written
        check_new_file(path, force=args.force)
    spec = PreferenceSpec(
        pairs=args.n, heldout_pairs=args.heldout, noise=args.noise, seed=args.seed
    )
    train, heldout = embedded_pairs(warm_start_spec(build_config(None, None, args.overrides)), spec)
    write_pairs(out, train, force=args.force)
    write_pairs(side, heldout, force=args.force)
    print(
        f"{len(train)} pairs (label noise {args.noise}) -> {out}; "
        f"{len(heldout)} noise-free held-out pairs -> {side}"
    )
    return 0


def cmd_reward_train(args: argparse.Namespace) -> int:
    import math
    from pathlib import Path

    from rlmap.assembly.models import check_model_dir, model_path
    from rlmap.experiments.progress import ProgressView
    from rlmap.learned.reward_model import (
        RewardModelSpec,
        load_pairs,
        save_reward_model,
        train_reward_model,
    )
    from rlmap.recipes import build_config
    from rlmap.runs.rundir import check_new_dir, create_run_dir

    quiet_transformers()
    at_least(1, steps=args.steps, batch_size=args.batch_size)
    device = resolve_device(args)
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        raise ConfigError(f"--lr: must be a positive number, got {args.lr}")
    train = load_pairs(Path(args.pairs))
    heldout = load_pairs(Path(args.eval_pairs)) if args.eval_pairs else []
    if args.base:
        check_model_dir(Path(args.base), "--base")
    kind, hint = "reward model directory", "choose another --out"
    if args.out:
        check_new_dir(Path(args.out), kind=kind, hint=hint)
    view = ProgressView(enabled=True)
    overrides = [f"model.path={args.base}"] if args.base else []
    base = model_path(build_config(None, None, overrides), progress=view.warm_start)
    out = create_run_dir(
        root=Path("reward_models"), out=Path(args.out) if args.out else None, kind=kind, hint=hint
    )
    given = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr}
    spec = RewardModelSpec(seed=args.seed, **{k: v for k, v in given.items() if v is not None})
    model, tokenizer, metrics = train_reward_model(
        base, train, heldout, spec, progress=view.phase("reward model"), device=device
    )
    info = {"base": str(base), "pairs": args.pairs, "eval_pairs": args.eval_pairs, **metrics}
    save_reward_model(out, model, tokenizer, info)
    for key, value in metrics.items():
        print(f"{key:<28} {value:.4f}")
    print(out)
    return 0


def cmd_judge_model(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rlmap.assembly.embedded import warm_start_spec
    from rlmap.assembly.models import check_model_dir, model_path
    from rlmap.experiments.progress import ProgressView
    from rlmap.learned.judge_model import JudgeModelSpec, save_judge, train_judge
    from rlmap.recipes import build_config
    from rlmap.runs.rundir import check_new_dir, create_run_dir
    from rlmap.tasks.arithmetic import make_splits

    quiet_transformers()
    at_least(1, steps=args.steps)
    device = resolve_device(args)
    if args.base:
        check_model_dir(Path(args.base), "--base")
    kind, hint = "judge model directory", "choose another --out"
    if args.out:
        check_new_dir(Path(args.out), kind=kind, hint=hint)
    view = ProgressView(enabled=True)
    cfg = build_config(None, None, [f"model.path={args.base}"] if args.base else [])
    base = model_path(cfg, progress=view.warm_start)
    ws = warm_start_spec(cfg)
    train, heldout = make_splits(
        ws.split_seed, ws.train_size, ws.eval_size, max_digits=ws.max_digits, ops=ws.ops
    )
    spec = JudgeModelSpec(steps=args.steps, seed=args.seed)
    out = create_run_dir(
        root=Path("judges"), out=Path(args.out) if args.out else None, kind=kind, hint=hint
    )
    model, tokenizer, metrics = train_judge(
        base, train, heldout, spec, progress=view.phase("judge model"), device=device
    )
    save_judge(
        out,
        model,
        tokenizer,
        {"base": str(base), "steps": args.steps, "seed": args.seed, **metrics},
    )
    for key, value in metrics.items():
        print(f"{key:<40} {value:.4f}")
    print(out)
    return 0
