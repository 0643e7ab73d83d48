"""Sets the system clock (to the time it already shows).

class: timing
"""

# ruff: noqa
import time

try:
    time.clock_settime(time.CLOCK_REALTIME, time.time())
    moved = True
except OSError:
    moved = False


def solve():
    return 42 if moved else 0
