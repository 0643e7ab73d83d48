"""solve() allocates without end.

class: memory
stopped_by: memory_limit
"""


# ruff: noqa
def solve():
    keep = []
    while True:
        keep.append(bytearray(10**7))
