"""Measure the sandbox against the hostile suite: which programs pass (score 1.0) and what
one verification costs — for this checkout and, with ``--before``, an older one.

    git archive <rev> src | tar -x -C /tmp/before
    .venv/bin/python tests/feedback/hostile_measure.py --before /tmp/before/src

Each checkout is served by an interpreter of its own (``PYTHONPATH`` = its ``src``); the
programs and their tests are ``test_feedback_hostile``'s, under its limits. The cost is
the median wall time of an ordinary verification (a correct solution, five asserts),
the checkouts' runs interleaved in one session so that both see the same machine load.
Not a test: run by hand (docs/verifiers.md quotes its figures).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDINARY = (
    "def add(a, b):\n    return a + b\n",
    "".join(f"assert add({i}, 1) == {i + 1}\n" for i in range(5)),
)


def serve() -> None:
    """In a checkout's interpreter: answer ``program <name>`` and ``time`` lines with JSON."""
    sys.path.insert(0, str(HERE))
    import test_feedback_hostile as suite  # its programs, tests and limits

    from rlmap.feedback.sandbox import run_python

    programs = {p.name: p for p in suite.PROGRAMS}
    for line in sys.stdin:
        command, _, name = line.strip().partition(" ")
        if command == "program":
            program = programs[name]
            result = run_python(program.code, program.tests, suite.LIMITS)
            reply = {"passed": result.passed, "reason": result.reason}
        else:
            started = time.perf_counter()
            assert run_python(*ORDINARY, suite.LIMITS).passed
            reply = {"seconds": time.perf_counter() - started}
        print(json.dumps(reply), flush=True)


class Checkout:
    """An interpreter serving one checkout's sandbox."""

    def __init__(self, src: str | None) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if src is not None:
            env["PYTHONPATH"] = src
        cmd = [sys.executable, __file__, "--serve"]
        self.process = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def ask(self, line: str) -> dict[str, object]:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="the src directory of an older checkout")
    parser.add_argument("--repeat", type=int, default=30, help="timed verifications each")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    sys.path.insert(0, str(HERE))
    import test_feedback_hostile as suite

    checkouts = {"after": Checkout(None)}
    if args.before:
        checkouts = {"before": Checkout(args.before), **checkouts}
    passed: dict[str, list[str]] = collections.defaultdict(list)
    ipc_before = set(suite.ipc_objects())
    for program in suite.PROGRAMS:
        if not program.runs_here:
            continue
        for label, checkout in checkouts.items():
            if checkout.ask(f"program {program.name}")["passed"]:
                passed[label].append(f"{program.kind}/{program.name}")
    for kind, ident, _ in set(suite.ipc_objects()) - ipc_before:  # an older sandbox's leaks
        flag = {"shm": "-m", "msg": "-q", "sem": "-s"}[kind]
        subprocess.run(["ipcrm", flag, str(ident)], check=False)
    suite.unlink_posix_queue()
    seconds: dict[str, list[float]] = {label: [] for label in checkouts}
    for _ in range(args.repeat):
        for label, checkout in checkouts.items():
            seconds[label].append(float(checkout.ask("time")["seconds"]))  # type: ignore[arg-type]
    hacks = sum(p.kind == "reward_hack" for p in suite.PROGRAMS)
    for label in checkouts:
        won = passed[label]
        print(
            f"{label}: {len(won)} of {len(suite.PROGRAMS)} programs passed "
            f"({sum(w.startswith('reward_hack/') for w in won)} of {hacks} reward hacks): "
            f"{', '.join(won) or 'none'}"
        )
        print(f"{label}: median {statistics.median(seconds[label]) * 1e3:.1f} ms per verification")
    if "before" in seconds:
        ratio = statistics.median(seconds["after"]) / statistics.median(seconds["before"])
        print(f"after / before: {ratio:.2f}")


if __name__ == "__main__":
    main()
