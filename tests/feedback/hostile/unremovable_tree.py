"""Builds a tree of directories it then makes unreadable and unwritable.

class: files
"""

# ruff: noqa
import os

for i in range(20):
    os.makedirs(f"a{i}/b/c/d", exist_ok=True)
    open(f"a{i}/b/c/d/f", "w").close()
    for d in (f"a{i}/b/c/d", f"a{i}/b/c", f"a{i}/b", f"a{i}"):
        os.chmod(d, 0)


def solve():
    return 0
