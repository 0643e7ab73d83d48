"""solve() calls sys.exit(0) while the tests run.

class: exits
stopped_by: exited_early
"""

# ruff: noqa
import sys


def solve():
    sys.exit(0)
