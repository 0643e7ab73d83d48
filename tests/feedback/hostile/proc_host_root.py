"""Reaches the host's files through /proc/<pid>/root and /proc/<pid>/cwd.

class: proc
"""

# ruff: noqa
import glob

found = []
for path in glob.glob("/proc/*/root/etc/shadow") + glob.glob("/proc/*/cwd/*"):
    try:
        open(path, "rb").read(1)
        found.append(path)
    except OSError:
        pass


def solve():
    return 42 if any("shadow" in p for p in found) else 0
