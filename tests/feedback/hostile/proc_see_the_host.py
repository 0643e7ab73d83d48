"""Looks for the host's processes (the test runner) in /proc.

class: proc
needs: pid_namespace
"""

# ruff: noqa
import glob

seen = ""
for path in glob.glob("/proc/*/cmdline"):
    try:
        seen += open(path, "rb").read().decode(errors="replace")
    except OSError:
        pass


def solve():
    return 42 if "pytest" in seen else 0
