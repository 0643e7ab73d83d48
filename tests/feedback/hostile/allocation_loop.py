"""Allocates 10 MB blocks until it cannot.

class: memory
stopped_by: memory_limit
"""

# ruff: noqa
keep = []
while True:
    keep.append(bytearray(10**7))
