"""Recurses without end, the recursion limit raised.

class: exits
"""

# ruff: noqa
import sys

sys.setrecursionlimit(10**8)


def f(n):
    return f(n + 1) + 1


f(0)


def solve():
    return 42
