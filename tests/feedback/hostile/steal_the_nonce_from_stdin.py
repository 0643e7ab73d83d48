"""Reads stdin, where the payload came from, echoes it and leaves.

class: harness
tests: trivial
stopped_by: exited_early
"""

# ruff: noqa
import os
import sys

data = sys.stdin.read()
os.write(1, data.encode())
os._exit(0)
