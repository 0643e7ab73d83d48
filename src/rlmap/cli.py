"""The ``rlmap`` command. Thin: it parses arguments and calls the library."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlmap.core.errors import ConfigError


def _cmd_recipes(args: argparse.Namespace) -> None:
    from rlmap.recipes import composition, preset, registry

    width = max(len(n) for n in registry.names())
    for name in registry.names():
        print(f"{name:<{width}}  {composition(preset(name))}")


def _cmd_explain(args: argparse.Namespace) -> None:
    from rlmap.recipes import explain

    print(explain(args.name))


def _cmd_papers(args: argparse.Namespace) -> None:
    from rlmap.recipes.catalog import paper_index_markdown

    print(paper_index_markdown(), end="")


def _cmd_config(args: argparse.Namespace) -> None:
    from rlmap.recipes import build_config, composition
    from rlmap.recipes.config import read_yaml

    file_data = read_yaml(args.config) if args.config else None
    cfg = build_config(args.recipe, file_data, args.overrides)
    print(f"# {cfg.recipe}: {composition(cfg)}")
    print(cfg.to_yaml(), end="")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlmap", description="RL post-training of language models, one choice per axis."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("recipes", help="list the presets, each with its full composition")
    p.set_defaults(func=_cmd_recipes)
    p = sub.add_parser("explain", help="a preset axis by axis: components, values, paper")
    p.add_argument("name", help="preset name (see `rlmap recipes`)")
    p.set_defaults(func=_cmd_explain)
    p = sub.add_parser("papers", help="the paper index: each preset's paper and quoted values")
    p.set_defaults(func=_cmd_papers)
    p = sub.add_parser("config", help="print the resolved, validated config of a run")
    p.add_argument("--recipe", default=None, help="preset to start from (default: grpo)")
    p.add_argument("--config", default=None, help="YAML file with a config")
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    p.set_defaults(func=_cmd_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ConfigError as exc:
        print(f"rlmap: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
