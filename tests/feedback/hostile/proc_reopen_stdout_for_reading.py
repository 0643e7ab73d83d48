"""Reopens its stdout pipe for reading, to read what the harness writes.

class: proc
"""

# ruff: noqa
import os
import threading


def steal():
    try:
        with open("/proc/self/fd/1", "rb", 0) as pipe:
            while pipe.read(65536):
                pass
    except OSError:
        pass


threading.Thread(target=steal, daemon=True).start()


def solve():
    return 0
