"""Spins at module level.

class: timing
stopped_by: cpu_limit
"""

# ruff: noqa
while True:
    pass
