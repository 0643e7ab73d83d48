"""Forks for ever, ignoring each failure.

class: processes
needs: uid
"""

# ruff: noqa
import os

while True:
    try:
        os.fork()
    except OSError:
        pass
