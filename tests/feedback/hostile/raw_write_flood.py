"""Writes to file descriptor 1 without end.

class: output
stopped_by: output_limit
"""

# ruff: noqa
import os

while True:
    os.write(1, b"z" * 65536)
