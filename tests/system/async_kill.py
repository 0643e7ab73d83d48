"""``rlmap train`` that SIGKILLs itself at a chosen point (the asynchronous resume tests).

    python async_kill.py POINT STEP -- train arguments...

POINT: ``mid-step`` (inside learner step STEP, after it took its trajectories),
``mid-checkpoint`` (step STEP's checkpoint fully written, not yet in place), ``queued``
(right after step STEP's checkpoint is in place, while the queue holds trajectories).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    point, at, args = sys.argv[1], int(sys.argv[2]), sys.argv[4:]
    from rlmap import cli
    from rlmap.experiments import checkpoint, train_step
    from rlmap.system import async_loop

    if point == "mid-step":
        learn = async_loop.learn

        def dying_learn(p: Any, batch: Any, state: Any) -> Any:
            if state.step + 1 == at:
                die()
            return learn(p, batch, state)

        async_loop.learn = dying_learn
    elif point == "mid-checkpoint":
        fsync = checkpoint._fsync_tree

        def dying_fsync(path: Any) -> None:
            fsync(path)
            if path.name.startswith(f".tmp-step_{at}-"):
                die()

        checkpoint._fsync_tree = dying_fsync
    elif point == "queued":
        write = train_step._checkpoint

        def dying_checkpoint(
            parts: Any, state: Any, ledger: Any, run_dir: Any, snapshot: Any = None
        ) -> None:
            if state.step == at:  # wait until the workers have queued work, then save and die
                runner = snapshot.__self__
                while runner.queue.qsize() == 0:
                    time.sleep(0.01)
            write(parts, state, ledger, run_dir, snapshot)
            if state.step == at:
                die()

        train_step._checkpoint = dying_checkpoint
    else:
        raise SystemExit(f"unknown point {point!r}")
    return cli.main(["train", *args])


if __name__ == "__main__":
    sys.exit(main())
