"""Sleeps for ever before defining anything.

class: timing
stopped_by: timeout
"""

# ruff: noqa
import time

time.sleep(10**6)


def solve():
    return 42
