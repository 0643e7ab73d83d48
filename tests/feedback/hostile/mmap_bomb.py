"""Maps 100 GB of anonymous memory.

class: memory
"""

# ruff: noqa
import mmap

m = mmap.mmap(-1, 10**11)


def solve():
    return 42
