"""Creates a million files.

class: files
"""

# ruff: noqa
for i in range(10**6):
    open(f"f{i}", "w").close()


def solve():
    return 42
