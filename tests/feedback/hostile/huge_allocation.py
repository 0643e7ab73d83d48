"""Allocates 100 GB at once.

class: memory
stopped_by: memory_limit
"""

# ruff: noqa
x = bytearray(10**11)


def solve():
    return 42
