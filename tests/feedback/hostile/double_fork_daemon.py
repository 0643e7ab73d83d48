"""Leaves a daemon behind: double fork, new session, sleep.

class: processes
needs: uid
"""

# ruff: noqa
import os
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)


def solve():
    return 0
