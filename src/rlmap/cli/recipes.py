"""The recipe commands: ``recipes``, ``explain``, ``translate``, ``papers``, ``tasks``,
``config``.
"""

from __future__ import annotations

import argparse


def cmd_recipes(args: argparse.Namespace) -> None:
    from rlmap.recipes import composition, preset, registry

    width = max(len(n) for n in registry.names())
    for name in registry.names():
        print(f"{name:<{width}}  {composition(preset(name))}")


def cmd_explain(args: argparse.Namespace) -> None:
    from rlmap.recipes import explain
    from rlmap.recipes.translate import explain_as

    print(explain(args.name) if args.as_ is None else explain_as(args.name, args.as_))


def cmd_translate(args: argparse.Namespace) -> None:
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


def cmd_papers(args: argparse.Namespace) -> None:
    from rlmap.recipes.catalog import paper_index_markdown

    print(paper_index_markdown(), end="")


def cmd_tasks(args: argparse.Namespace) -> None:
    from rlmap.tasks.catalog import describe, listing

    print(listing() if args.name is None else describe(args.name), end="")


def cmd_config(args: argparse.Namespace) -> None:
    from rlmap.recipes import build_config, composition
    from rlmap.runs.rundir import read_yaml

    file_data = read_yaml(args.config) if args.config else None
    cfg = build_config(args.recipe, file_data, args.overrides)
    print(f"# {cfg.recipe}: {composition(cfg)}")
    print(cfg.to_yaml(), end="")
