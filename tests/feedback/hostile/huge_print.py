"""Prints without end.

class: output
stopped_by: output_limit
"""

# ruff: noqa
while True:
    print("x" * 10000)
