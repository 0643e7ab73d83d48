"""SIGKILLs its parent process.

class: signals
tests: trivial
"""

# ruff: noqa
import os
import signal

os.kill(os.getppid(), signal.SIGKILL)


def solve():
    return 42
