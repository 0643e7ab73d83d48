"""Burns CPU in threads while the tests run.

class: timing
"""

# ruff: noqa
import threading


def burn():
    while True:
        pass


for _ in range(3):
    threading.Thread(target=burn, daemon=True).start()


def solve():
    return 0
