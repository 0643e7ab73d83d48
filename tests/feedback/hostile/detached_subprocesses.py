"""Starts sleepers in sessions of their own.

class: processes
needs: uid
"""

# ruff: noqa
import subprocess

for _ in range(4):
    subprocess.Popen(["sleep", "1000"], start_new_session=True)


def solve():
    return 0
