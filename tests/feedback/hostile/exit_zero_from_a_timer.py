"""A timer thread calls os._exit(0) while the tests wait.

class: timing
stopped_by: exited_early
"""

# ruff: noqa
import os
import threading
import time

threading.Timer(0.05, os._exit, (0,)).start()


def solve():
    time.sleep(1)
    return 42
