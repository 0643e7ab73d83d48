"""Checks whether it holds any capability.

class: privileges
"""

# ruff: noqa
status = open("/proc/self/status").read()
effective = int(
    next(line for line in status.splitlines() if line.startswith("CapEff")).split()[1], 16
)


def solve():
    return 42 if effective else 0
