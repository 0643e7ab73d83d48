"""``rlmap``'s argument parser: one small function per command, in the order ``rlmap --help``
lists them; each names the body it calls (:mod:`rlmap.cli`'s modules by subject).
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from rlmap.cli.map import cmd_advise, cmd_compare, cmd_diagnose, cmd_samples, cmd_simulate
from rlmap.cli.models import cmd_judge_model, cmd_reward_pairs, cmd_reward_train
from rlmap.cli.recipes import (
    cmd_config,
    cmd_explain,
    cmd_papers,
    cmd_recipes,
    cmd_tasks,
    cmd_translate,
)
from rlmap.cli.train import cmd_eval, cmd_train


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
    for add in (
        _add_recipes,
        _add_explain,
        _add_translate,
        _add_train,
        _add_eval,
        _add_tasks,
        _add_papers,
        _add_config,
    ):
        add(sub)


def _add_map_commands(sub: Any) -> None:
    """The map: advise, diagnose, compare, simulate."""
    for add in (_add_compare, _add_advise, _add_diagnose, _add_samples, _add_simulate):
        add(sub)


def _add_reward_model_commands(sub: Any) -> None:
    """Learned reward models (preference pairs, training), and the embedded judge."""
    _add_reward_model(sub)
    _add_judge_model(sub)


def _add_recipes(sub: Any) -> None:
    p = _command(sub, "recipes", help="list the presets, each with its full composition")
    p.set_defaults(func=cmd_recipes)


def _add_explain(sub: Any) -> None:
    from rlmap.recipes.translate import FRAMEWORKS

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
    p.set_defaults(func=cmd_explain)


def _add_translate(sub: Any) -> None:
    from rlmap.recipes.translate import FRAMEWORKS

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
    p.set_defaults(func=cmd_translate)


def _add_train(sub: Any) -> None:
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
    p.set_defaults(func=cmd_train)


def _add_eval(sub: Any) -> None:
    p = _command(sub, "eval", help="held-out pass@1, pass@k, length and diversity of a checkpoint")
    p.add_argument("checkpoint", help="a checkpoint directory (Hugging Face format)")
    p.add_argument("--samples", type=int, default=None, help="samples per prompt (k of pass@k)")
    _device_flag(p)
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides of the data config")
    p.set_defaults(func=cmd_eval)


def _add_tasks(sub: Any) -> None:
    p = _command(sub, "tasks", help="the tasks data.task names: built in, and reasoning-gym's")
    p.add_argument(
        "name", nargs="?", default=None, help="a reasoning-gym task: its settings and an example"
    )
    p.set_defaults(func=cmd_tasks)


def _add_papers(sub: Any) -> None:
    p = _command(sub, "papers", help="the paper index: each preset's paper and quoted values")
    p.set_defaults(func=cmd_papers)


def _add_config(sub: Any) -> None:
    p = _command(sub, "config", help="print the resolved, validated config of a run")
    p.add_argument("--recipe", default=None, help="preset to start from (default: grpo)")
    p.add_argument("--config", default=None, help="YAML file with a config")
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    p.set_defaults(func=cmd_config)


def _add_compare(sub: Any) -> None:
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
    p.set_defaults(func=cmd_compare)


def _add_advise(sub: Any) -> None:
    p = _command(sub, "advise", help="the six questions and the selection table's answer")
    _advise_task_flags(p)
    _advise_system_flags(p)
    p.add_argument(
        "--emit-config",
        default=None,
        metavar="FILE",
        help="write the baseline's config for `rlmap train --config FILE`",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing --emit-config file")
    p.set_defaults(func=cmd_advise)


def _advise_task_flags(p: argparse.ArgumentParser) -> None:
    """The questions about the task: turns, verifier, samples, length, critic, rewards."""
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


def _advise_system_flags(p: argparse.ArgumentParser) -> None:
    """The questions about the system: MoE routing, separate rollout, barrier, context."""
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


def _add_diagnose(sub: Any) -> None:
    p = _command(sub, "diagnose", help="check a run for the map's failure symptoms")
    p.add_argument("run_dir", help="a run directory (reads metrics.jsonl, ledger.json)")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(func=cmd_diagnose)


def _add_samples(sub: Any) -> None:
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
    p.set_defaults(func=cmd_samples)


def _add_simulate(sub: Any) -> None:
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
    p.set_defaults(func=cmd_simulate)


def _add_reward_model(sub: Any) -> None:
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
    q.set_defaults(func=cmd_reward_train)
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
    q.set_defaults(func=cmd_reward_pairs)


def _add_judge_model(sub: Any) -> None:
    help_ = "fine-tune the embedded task's judge, for an OpenAI-compatible server"
    q = _command(sub, "judge-model", help=help_)
    q.add_argument(
        "--base", default=None, help="causal LM to start from (default: the embedded warm start)"
    )
    q.add_argument("--out", default=None, help="output directory (default: judges/<time>)")
    q.add_argument("--steps", type=int, default=1500, help="optimiser steps")
    q.add_argument("--seed", type=int, default=0)
    _device_flag(q)
    q.set_defaults(func=cmd_judge_model)


def _device_flag(p: argparse.ArgumentParser) -> None:
    help_ = "where the model runs: auto (a GPU when there is one), cpu, cuda, cuda:N"
    p.add_argument("--device", default="auto", help=help_)
