"""Overflows the C stack (repr of a deeply nested list).

class: exits
"""

# ruff: noqa
import sys

sys.setrecursionlimit(10**8)
nested = []
for _ in range(10**6):
    nested = [nested]
repr(nested)


def solve():
    return 42
