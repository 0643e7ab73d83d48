"""Looks for the trainer's environment in /proc/*/environ.

class: proc
needs: uid
"""

# ruff: noqa
import glob
import os

seen = repr(dict(os.environ))
for path in glob.glob("/proc/*/environ"):
    try:
        seen += open(path, "rb").read().decode(errors="replace")
    except OSError:
        pass


def solve():
    return 42 if "hunter2" in seen else 0
