"""Stops itself with SIGSTOP: a stopped process lives for ever unless SIGKILLed.

class: signals
tests: trivial
stopped_by: timeout
"""

# ruff: noqa
import os
import signal

os.kill(os.getpid(), signal.SIGSTOP)


def solve():
    return 42
