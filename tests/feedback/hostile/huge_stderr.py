"""Writes to stderr without end.

class: output
stopped_by: output_limit
"""

# ruff: noqa
import sys

while True:
    sys.stderr.write("y" * 10000)
