"""SIGKILLs every process it may (-1), its parent and pid 1.

class: signals
needs: uid
"""

# ruff: noqa
import os
import signal

for target in (-1, os.getppid(), 1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError:
        pass


def solve():
    return 0
