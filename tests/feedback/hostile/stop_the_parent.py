"""SIGSTOPs its parent, so that nobody ever reports.

class: signals
tests: trivial
"""

# ruff: noqa
import os
import signal

os.kill(os.getppid(), signal.SIGSTOP)


def solve():
    return 42
