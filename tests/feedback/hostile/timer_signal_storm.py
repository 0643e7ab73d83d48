"""Arms an interval timer firing every 100 microseconds.

class: signals
"""

# ruff: noqa
import signal

signal.signal(signal.SIGALRM, lambda *args: None)
signal.setitimer(signal.ITIMER_REAL, 0.0001, 0.0001)


def solve():
    return 0
