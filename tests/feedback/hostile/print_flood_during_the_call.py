"""solve() prints without end.

class: output
stopped_by: output_limit
"""


# ruff: noqa
def solve():
    while True:
        print("x" * 10000)
