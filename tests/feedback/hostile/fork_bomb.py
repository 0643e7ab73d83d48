"""Forks until it cannot.

class: processes
needs: uid
"""

# ruff: noqa
import os

while True:
    os.fork()
