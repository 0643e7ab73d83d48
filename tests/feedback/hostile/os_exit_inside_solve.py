"""solve() calls os._exit(0) while the tests run.

class: exits
stopped_by: exited_early
"""

# ruff: noqa
import os


def solve():
    os._exit(0)
