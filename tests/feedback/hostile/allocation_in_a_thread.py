"""Allocates without end in a thread while solve() answers.

class: memory
"""

# ruff: noqa
import threading

keep = []


def grow():
    while True:
        keep.append(bytearray(10**7))


threading.Thread(target=grow, daemon=True).start()


def solve():
    return 0
