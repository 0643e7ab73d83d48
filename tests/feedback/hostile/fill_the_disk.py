"""Writes small files until the disk is full.

class: files
needs: private_root
"""

# ruff: noqa
i = 0
try:
    while True:
        with open(f"fill{i}", "wb") as f:
            f.write(b"0" * 65536)
        i += 1
except OSError:
    pass


def solve():
    return 0
