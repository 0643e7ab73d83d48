"""The map's commands: ``compare``, ``advise``, ``diagnose``, ``samples``, ``simulate``."""

from __future__ import annotations

import argparse
import sys

from rlmap.core.errors import InputError


def cmd_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rlmap.experiments.compare import write_report
    from rlmap.experiments.compare_runs import load_runs
    from rlmap.runs.rundir import create_run_dir, removed_on_failure

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


def cmd_advise(args: argparse.Namespace) -> None:
    from pathlib import Path

    from rlmap.advise import advice as advise
    from rlmap.advise import prompts as advise_prompts
    from rlmap.recipes.selection import FLAG_FIELDS, TaskProfile
    from rlmap.runs.rundir import check_new_file

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


def cmd_diagnose(args: argparse.Namespace) -> None:
    from pathlib import Path

    from rlmap.diagnostics.report import diagnose, render_json, render_text

    report = diagnose(Path(args.run_dir))
    print(render_json(report) if args.json else render_text(report), end="\n" if args.json else "")


def cmd_samples(args: argparse.Namespace) -> None:
    import json
    from pathlib import Path

    from rlmap.runs.samples import read_samples, render, select

    if args.n < 1:
        raise InputError(f"--n: must be >= 1, got {args.n}")
    run_dir = Path(args.run_dir)
    step, rows = read_samples(run_dir, args.step)
    shown = select(rows, args.klass, args.n)
    if args.json:
        print("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in shown), end="")
    else:
        print(render(run_dir, step, rows, shown, args.klass), end="")


def cmd_simulate(args: argparse.Namespace) -> None:
    from rlmap.simulator.report import command, simulate_args

    print(command(simulate_args(vars(args))), end="")
