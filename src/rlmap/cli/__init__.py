"""The ``rlmap`` command. Thin: it parses arguments and calls the library through the
commands' bodies, one module of this package by subject (:mod:`.recipes`, :mod:`.train`,
:mod:`.map`, :mod:`.models`; the parser: :mod:`.parser`); ``python -m rlmap.cli`` runs it.

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

from rlmap.cli.models import cmd_judge_model, cmd_reward_train
from rlmap.cli.parser import build_parser
from rlmap.cli.train import cmd_eval, cmd_train
from rlmap.core.errors import ConfigError, InputError, TrainingError


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


LOADS_MODELS = (cmd_train, cmd_eval, cmd_reward_train, cmd_judge_model)
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
