"""A forked child floods stderr while solve() waits.

class: output
stopped_by: output_limit
needs: uid
"""

# ruff: noqa
import os
import time

if os.fork() == 0:
    while True:
        os.write(2, b"y" * 65536)


def solve():
    time.sleep(5)
    return 0
