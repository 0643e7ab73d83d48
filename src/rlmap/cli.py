"""The ``rlmap`` command. Thin: it parses arguments and calls the library.

Bad input never ends in a traceback: every error reaches the user as one line,
``rlmap: error: <what is at fault>: <why>`` on stderr, and a non-zero exit (2 for bad
input or usage, 1 for a failure of the machine, such as a full disk, or a bug).
``--debug`` (before or after the command) prints the traceback as well. A command
that writes a file refuses one that exists unless given ``--force``; a run directory
is never overwritten (``--resume`` continues it).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from rlmap.core.errors import ConfigError, InputError, TrainingError

if TYPE_CHECKING:
    from rlmap.learner.distributed import World
    from rlmap.recipes.config import RecipeConfig


def _cmd_recipes(args: argparse.Namespace) -> None:
    from rlmap.recipes import composition, preset, registry

    width = max(len(n) for n in registry.names())
    for name in registry.names():
        print(f"{name:<{width}}  {composition(preset(name))}")


def _cmd_explain(args: argparse.Namespace) -> None:
    from rlmap.recipes import explain
    from rlmap.recipes.translate import explain_as

    print(explain(args.name) if args.as_ is None else explain_as(args.name, args.as_))


def _cmd_translate(args: argparse.Namespace) -> None:
    """The rlmap config for another framework's file, the report on top as comments; written
    to --out (else printed) only once the whole translation has loaded."""
    from pathlib import Path

    from rlmap.recipes.translate import translate

    result = translate(
        args.file, args.source, to_embedded=args.embedded, world_size=args.world_size
    )
    text = result.to_yaml()
    if args.out is None:
        print(text, end="")
        return
    Path(args.out).write_text(text, encoding="utf-8")
    print(result.report())
    hint = "" if args.embedded else "; on the embedded default: add --embedded"
    print(f"wrote {args.out}: rlmap train --config {args.out}{hint}")


def _cmd_papers(args: argparse.Namespace) -> None:
    from rlmap.recipes.catalog import paper_index_markdown

    print(paper_index_markdown(), end="")


def _cmd_tasks(args: argparse.Namespace) -> None:
    from rlmap.tasks.catalog import describe, listing

    print(listing() if args.name is None else describe(args.name), end="")


def _cmd_config(args: argparse.Namespace) -> None:
    from rlmap.recipes import build_config, composition
    from rlmap.recipes.config import read_yaml

    file_data = read_yaml(args.config) if args.config else None
    cfg = build_config(args.recipe, file_data, args.overrides)
    print(f"# {cfg.recipe}: {composition(cfg)}")
    print(cfg.to_yaml(), end="")


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # rlmap's own progress bar says what matters


def _train_seeds(cfg: RecipeConfig, args: argparse.Namespace) -> int:
    """``--seeds N``: the config over seeds seed, seed+1, … into sibling directories."""
    from pathlib import Path

    from rlmap.experiments.rundir import create_run_dir
    from rlmap.experiments.train import run_seeds

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


def _cmd_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rlmap.experiments.compare import load_runs, write_report
    from rlmap.experiments.rundir import create_run_dir, removed_on_failure

    runs = load_runs([Path(p) for p in args.runs])  # before the report directory exists
    existed = args.out is not None and Path(args.out).exists()
    out = create_run_dir(
        root=Path("reports"),
        out=Path(args.out) if args.out else None,
        kind="report directory",
        force=args.force,
        hint="choose another --out, or --force to write into it",
    )
    with removed_on_failure(out, existed=existed):
        text = write_report(runs, out)
    print(text)
    print(f"report: {out / 'report.md'}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int | None:
    import os
    from pathlib import Path

    from rlmap.assembly.checks import check_inputs
    from rlmap.experiments.rundir import check_new_dir
    from rlmap.experiments.train import resume_config
    from rlmap.learner import launch
    from rlmap.recipes import build_config
    from rlmap.recipes.config import embedded_task_note, read_yaml

    _quiet_transformers()
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
    world = _learner_world(cfg)
    if world is None:  # several learners and no launcher: this process starts the ranks
        return launch.launch(cfg.system.learners, args.argv)
    with launch.joined(world):
        return _train_rank(args, cfg, world)


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

    from rlmap.experiments.rundir import create_run_dir
    from rlmap.experiments.train import run_training
    from rlmap.learner import distributed

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


def _learner_world(cfg: RecipeConfig) -> World | None:
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


def _cmd_eval(args: argparse.Namespace) -> None:
    from pathlib import Path

    from rlmap.rollout.evaluate import evaluate_checkpoint

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
    device = _device(args)
    _quiet_transformers()
    metrics = evaluate_checkpoint(
        Path(args.checkpoint), samples=args.samples, overrides=args.overrides, device=device
    )
    for key, value in metrics.items():
        print(f"{key:<16} {value:.4f}")


def _cmd_advise(args: argparse.Namespace) -> None:
    from pathlib import Path

    from rlmap.experiments.rundir import check_new_file
    from rlmap.recipes import advise, advise_prompts
    from rlmap.recipes.selection import FLAG_FIELDS, TaskProfile

    if args.emit_config is not None:
        check_new_file(Path(args.emit_config), force=args.force)  # before asking anything
    flags = {name: getattr(args, name) for name in FLAG_FIELDS}
    if sys.stdin.isatty() and all(value is None for value in flags.values()):
        profile = advise_prompts.ask_profile()
    else:
        profile = TaskProfile.from_flags(flags)
    result = advise.advise(profile)
    print(advise.render(result), end="")
    if args.emit_config is not None:
        advise.write_config(result, Path(args.emit_config), force=args.force)
        print(f"config written to {args.emit_config}: rlmap train --config {args.emit_config}")


def _cmd_diagnose(args: argparse.Namespace) -> None:
    from pathlib import Path

    from rlmap.diagnostics.report import diagnose, render_json, render_text

    report = diagnose(Path(args.run_dir))
    print(render_json(report) if args.json else render_text(report), end="\n" if args.json else "")


def _cmd_samples(args: argparse.Namespace) -> None:
    import json
    from pathlib import Path

    from rlmap.experiments.samples import read_samples, render, select

    if args.n < 1:
        raise InputError(f"--n: must be >= 1, got {args.n}")
    run_dir = Path(args.run_dir)
    step, rows = read_samples(run_dir, args.step)
    shown = select(rows, args.klass, args.n)
    if args.json:
        print("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in shown), end="")
    else:
        print(render(run_dir, step, rows, shown, args.klass), end="")


def _cmd_simulate(args: argparse.Namespace) -> None:
    from rlmap.simulator.report import command, simulate_args

    print(command(simulate_args(vars(args))), end="")


def _cmd_reward_pairs(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rlmap.assembly.embedded import warm_start_spec
    from rlmap.experiments.rundir import check_new_file
    from rlmap.learned.preferences import PreferenceSpec, embedded_pairs
    from rlmap.learned.reward_model import heldout_path, write_pairs
    from rlmap.recipes import build_config

    _at_least(1, n=args.n, heldout=args.heldout)
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


def _cmd_reward_train(args: argparse.Namespace) -> int:
    import math
    from pathlib import Path

    from rlmap.assembly.models import check_model_dir, model_path
    from rlmap.experiments.progress import ProgressView
    from rlmap.experiments.rundir import check_new_dir, create_run_dir
    from rlmap.learned.reward_model import (
        RewardModelSpec,
        load_pairs,
        save_reward_model,
        train_reward_model,
    )
    from rlmap.recipes import build_config

    _quiet_transformers()
    _at_least(1, steps=args.steps, batch_size=args.batch_size)
    device = _device(args)
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


def _cmd_judge_model(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rlmap.assembly.embedded import warm_start_spec
    from rlmap.assembly.models import check_model_dir, model_path
    from rlmap.experiments.progress import ProgressView
    from rlmap.experiments.rundir import check_new_dir, create_run_dir
    from rlmap.learned.judge_model import JudgeModelSpec, save_judge, train_judge
    from rlmap.recipes import build_config
    from rlmap.tasks.arithmetic import make_splits

    _quiet_transformers()
    _at_least(1, steps=args.steps)
    device = _device(args)
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


def _at_least(low: int, **values: int | None) -> None:
    """ConfigError naming the flag (``--batch-size``) of the first given value below ``low``."""
    for name, value in values.items():
        if value is not None and value < low:
            raise ConfigError(f"--{name.replace('_', '-')}: must be >= {low}, got {value}")


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line, like every other rlmap error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"rlmap: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rlmap", description="RL post-training of language models, one choice per axis."
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_commands(sub)
    _add_map_commands(sub)
    _add_reward_model_commands(sub)
    return parser


DEBUG_HELP = "on an error, print the traceback as well as the one-line message"


def _command(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand's parser; it takes ``--debug`` too (so it may follow the command)."""
    p: argparse.ArgumentParser = sub.add_parser(name, **kwargs)
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return p


def _add_run_commands(sub: Any) -> None:
    """Recipes, configs, training and evaluation."""
    from rlmap.recipes.translate import FRAMEWORKS

    p = _command(sub, "recipes", help="list the presets, each with its full composition")
    p.set_defaults(func=_cmd_recipes)
    p = _command(sub, "explain", help="a preset axis by axis, or one component's card")
    p.add_argument(
        "name",
        help="preset (see `rlmap recipes`), component (m2po, dppo_kl, "
        "prompt_mean …) or field=component (behaviour.objective=dro)",
    )
    p.add_argument(
        "--as",
        dest="as_",
        default=None,
        choices=FRAMEWORKS,
        help="the preset as that framework's settings, differences named",
    )
    p.set_defaults(func=_cmd_explain)
    p = _command(sub, "translate", help="another framework's config as an rlmap config")
    p.add_argument("file", help="verl/SkyRL YAML, TRL YAML/JSON, prime-rl TOML, OpenRLHF command")
    p.add_argument("--from", dest="source", required=True, choices=("auto", *FRAMEWORKS))
    p.add_argument("--out", default=None, help="write the config here (default: print it)")
    p.add_argument(
        "--embedded",
        action="store_true",
        help="the closest preset's embedded model and sizes (trains here)",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="training processes (TRL's batch sizes are per device)",
    )
    p.set_defaults(func=_cmd_translate)
    p = _command(sub, "train", help="train a policy; prints the run directory")
    p.add_argument("--recipe", default=None, help="preset to start from (default: grpo)")
    p.add_argument("--config", default=None, help="YAML config file (names its recipe)")
    p.add_argument("--out", default=None, help="run directory to create (default: runs/<time>)")
    p.add_argument("--resume", default=None, help="continue the run in this directory")
    p.add_argument("--seed", type=int, default=None, help="seed of the run")
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="train N runs, seeds seed..seed+N-1, into --out/seed<S> (for compare)",
    )
    p.add_argument(
        "--preflight",
        action="store_true",
        help="build and check every part, one forward + backward; print a go / "
        "no-go table and write nothing (exit 1 on no-go)",
    )
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    p.set_defaults(func=_cmd_train)
    p = _command(sub, "eval", help="held-out pass@1, pass@k, length and diversity of a checkpoint")
    p.add_argument("checkpoint", help="a checkpoint directory (Hugging Face format)")
    p.add_argument("--samples", type=int, default=None, help="samples per prompt (k of pass@k)")
    _device_flag(p)
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides of the data config")
    p.set_defaults(func=_cmd_eval)
    p = _command(sub, "tasks", help="the tasks data.task names: built in, and reasoning-gym's")
    p.add_argument(
        "name", nargs="?", default=None, help="a reasoning-gym task: its settings and an example"
    )
    p.set_defaults(func=_cmd_tasks)
    p = _command(sub, "papers", help="the paper index: each preset's paper and quoted values")
    p.set_defaults(func=_cmd_papers)
    p = _command(sub, "config", help="print the resolved, validated config of a run")
    p.add_argument("--recipe", default=None, help="preset to start from (default: grpo)")
    p.add_argument("--config", default=None, help="YAML file with a config")
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    p.set_defaults(func=_cmd_config)


def _add_map_commands(sub: Any) -> None:
    """The map: advise, diagnose, compare, simulate."""
    p = _command(
        sub,
        "compare",
        help="runs side by side on equal budgets; flags unfair "
        "differences; writes a report with plots",
    )
    p.add_argument("runs", nargs="+", help="run directories, or directories of runs (a sweep)")
    p.add_argument("--out", default=None, help="report directory (default: reports/<time>)")
    p.add_argument(
        "--force",
        action="store_true",
        help="write into an --out that holds files (replacing the report)",
    )
    p.set_defaults(func=_cmd_compare)
    p = _command(sub, "advise", help="the six questions and the selection table's answer")
    p.add_argument(
        "--multi-turn",
        action="store_true",
        default=None,
        help="episodes have several turns (tool calls, an environment)",
    )
    p.add_argument(
        "--verifier",
        choices=["exact", "math", "code", "reward-model", "none"],
        default=None,
        help="what checks a response (default: exact)",
    )
    p.add_argument(
        "--cheap-samples",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="many samples per prompt are cheap (default: yes)",
    )
    p.add_argument(
        "--response-length",
        type=int,
        default=None,
        metavar="N",
        help="typical response length in tokens",
    )
    p.add_argument(
        "--critic-unstable",
        action="store_true",
        default=None,
        help="a value critic has been clearly unstable",
    )
    p.add_argument(
        "--rare-correct",
        action="store_true",
        default=None,
        help="correct samples are extremely rare",
    )
    p.add_argument(
        "--moe",
        "--moe-routing-mismatch",
        dest="moe_routing_mismatch",
        action="store_true",
        default=None,
        help="MoE whose routing differs between training and rollout",
    )
    p.add_argument(
        "--separate-rollout",
        action="store_true",
        default=None,
        help="rollout and learner are separate processes",
    )
    p.add_argument(
        "--barrier",
        choices=["mild", "severe"],
        default=None,
        help="how much the group barrier costs (default: mild)",
    )
    p.add_argument(
        "--long-context",
        action="store_true",
        default=None,
        help="contexts exceed the model's window",
    )
    p.add_argument(
        "--emit-config",
        default=None,
        metavar="FILE",
        help="write the baseline's config for `rlmap train --config FILE`",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing --emit-config file")
    p.set_defaults(func=_cmd_advise)
    p = _command(sub, "diagnose", help="check a run for the map's failure symptoms")
    p.add_argument("run_dir", help="a run directory (reads metrics.jsonl, ledger.json)")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(func=_cmd_diagnose)
    p = _command(sub, "samples", help="read what the policy wrote: held-out samples by class")
    p.add_argument("run_dir", help="a run directory (reads samples/step_N.jsonl)")
    p.add_argument("--step", type=int, default=None, help="an evaluated step (default: newest)")
    p.add_argument(
        "--class",
        dest="klass",
        default=None,
        metavar="C",
        help="only this class (wrong_answer, truncated, ..., correct, or all); "
        "default: every failure, grouped by class",
    )
    p.add_argument("--n", type=int, default=10, help="at most this many samples (default 10)")
    p.add_argument("--json", action="store_true", help="the samples as JSON lines")
    p.set_defaults(func=_cmd_samples)
    p = _command(sub, "simulate", help="discrete-event model of sync, async and partial rollout")
    p.add_argument(
        "--mode",
        default=None,
        help="sync | async | partial (default: a --from-run run's, else sync)",
    )
    p.add_argument("--workers", type=int, default=None, help="rollout workers W (default: 8)")
    p.add_argument("--batch", type=int, default=None, help="trajectories per step B (default: 64)")
    p.add_argument(
        "--learner-step-s",
        default=None,
        metavar="S",
        help="learner step seconds, or a --duration spec (default: 1)",
    )
    p.add_argument(
        "--duration",
        default=None,
        metavar="DIST",
        help="lognormal:mu,sigma | pareto:alpha,scale | exponential:mean | "
        "fixed:v | empirical:v1,v2,... (default: lognormal:0,1)",
    )
    p.add_argument(
        "--eta",
        type=int,
        default=None,
        help="async: max staleness η (default: the --from-run run's, else 1)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        metavar="L",
        help="partial: longest segment per iteration, s (default: none)",
    )
    p.add_argument("--steps", type=int, default=200, help="learner steps (default: 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws (default: 0)")
    p.add_argument(
        "--from-run",
        default=None,
        metavar="DIR",
        help="durations (and learner step) from a run's metrics.jsonl",
    )
    p.add_argument("--json", action="store_true", help="the result as JSON")
    p.add_argument(
        "--sweep-workers",
        default=None,
        metavar="W1,W2,...",
        help="sync, async and partial at each worker count: a table",
    )
    p.add_argument("--plot", default=None, metavar="DIR", help="with --sweep-workers: PNGs here")
    p.add_argument("--force", action="store_true", help="replace PNGs that exist in --plot")
    p.set_defaults(func=_cmd_simulate)


def _add_reward_model_commands(sub: Any) -> None:
    """Learned reward models (preference pairs, training), and the embedded judge."""
    p = _command(sub, "reward-model", help="learned reward models: preference pairs, training")
    rm = p.add_subparsers(dest="reward_command", required=True, metavar="{train,pairs}")
    q = _command(rm, "train", help="train a reward model (Bradley-Terry) from preference pairs")
    q.add_argument("--pairs", required=True, help="JSONL: prompt, chosen, rejected per line")
    q.add_argument("--eval-pairs", default=None, help="held-out pairs for pairwise accuracy")
    q.add_argument(
        "--base", default=None, help="trunk checkpoint (default: the embedded warm start)"
    )
    q.add_argument("--out", default=None, help="output directory (default: reward_models/<time>)")
    q.add_argument("--steps", type=int, default=None, help="optimiser steps (default 1000)")
    q.add_argument("--batch-size", type=int, default=None, help="pairs per step (default 64)")
    q.add_argument("--lr", type=float, default=None, help="AdamW learning rate")
    q.add_argument("--seed", type=int, default=0)
    _device_flag(q)
    q.set_defaults(func=_cmd_reward_train)
    q = _command(rm, "pairs", help="write the embedded task's preference pairs as JSONL")
    q.add_argument("--out", required=True, help="pairs file (held-out pairs go beside it)")
    q.add_argument(
        "--force",
        action="store_true",
        help="overwrite existing pairs files (--out and its .heldout one)",
    )
    q.add_argument("--n", type=int, default=4000, help="training pairs")
    q.add_argument("--heldout", type=int, default=512, help="noise-free held-out pairs")
    q.add_argument("--noise", type=float, default=0.1, help="probability of a flipped label")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("overrides", nargs="*", help="dotted overrides of the data config")
    q.set_defaults(func=_cmd_reward_pairs)
    help_ = "fine-tune the embedded task's judge, for an OpenAI-compatible server"
    q = _command(sub, "judge-model", help=help_)
    q.add_argument(
        "--base", default=None, help="causal LM to start from (default: the embedded warm start)"
    )
    q.add_argument("--out", default=None, help="output directory (default: judges/<time>)")
    q.add_argument("--steps", type=int, default=1500, help="optimiser steps")
    q.add_argument("--seed", type=int, default=0)
    _device_flag(q)
    q.set_defaults(func=_cmd_judge_model)


def _device_flag(p: argparse.ArgumentParser) -> None:
    help_ = "where the model runs: auto (a GPU when there is one), cpu, cuda, cuda:N"
    p.add_argument("--device", default="auto", help=help_)


def _device(args: argparse.Namespace) -> Any:
    """``--device`` resolved (:func:`rlmap.core.device.resolve`), or a one-line error."""
    from rlmap.core.device import resolve

    return resolve(args.device, field="--device")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Arguments, with ``key=value`` overrides allowed after options too.

    argparse stops filling a ``nargs="*"`` positional at the first option, so
    ``rlmap train a=1 --out DIR b=2`` would reject ``b=2``; such leftovers join the
    command's overrides. Anything else left over is an error, as usual.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a launcher runs again
    overrides = [e for e in extra if "=" in e and not e.startswith("-")]
    if extra and (overrides != extra or not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    return args


LOADS_MODELS = (_cmd_train, _cmd_eval, _cmd_reward_train, _cmd_judge_model)
"""The commands that load a model through transformers (the others read files and configs)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status. Errors are one line on stderr."""
    try:
        args = parse(argv)
    except SystemExit as exc:  # --help (0), or a usage error already printed as one line
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    if args.func in LOADS_MODELS:  # before anything imports transformers' models
        from rlmap.core.hf import companion_problem

        if (problem := companion_problem()) is not None:
            return _fail(args, problem, 2)
    try:
        status = args.func(args)
    except (ConfigError, InputError) as exc:  # bad input
        return _fail(args, str(exc), 2, exc)
    except TrainingError as exc:  # the run itself failed (it diverged): not the input's fault
        return _fail(args, str(exc), 1, exc)
    except OSError as exc:  # the machine, not the input: a full or read-only disk, ...
        why = exc.strerror or str(exc)
        where = f"{exc.filename}: {why}" if exc.filename is not None else why
        return _fail(args, where, 1, exc)
    except Exception as exc:  # a bug: still one line, and --debug has the traceback
        what = f"{type(exc).__name__}: {exc}"
        return _fail(args, f"internal error ({what}); rerun with --debug for the traceback", 1, exc)
    return int(status or 0)


def _fail(
    args: argparse.Namespace, message: str, status: int, exc: BaseException | None = None
) -> int:
    """Print ``rlmap: error: message`` as exactly one line (after the traceback with --debug);
    a learner rank other than 0 that only echoes rank 0's error prints nothing."""
    if getattr(exc, "echo", False):
        return status
    if getattr(args, "debug", False):
        traceback.print_exc()
    line = "; ".join(part.strip() for part in message.splitlines() if part.strip())
    print(f"rlmap: error: {line or 'failed'}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
