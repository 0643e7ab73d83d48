"""solve() never returns.

class: timing
stopped_by: timeout
"""

# ruff: noqa
import time


def solve():
    time.sleep(10**6)
    return 42
