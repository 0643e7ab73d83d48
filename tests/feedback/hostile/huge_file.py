"""Writes a 1 GB file.

class: files
"""

# ruff: noqa
with open("big", "wb") as f:
    for _ in range(1000):
        f.write(b"0" * 2**20)


def solve():
    return 42
