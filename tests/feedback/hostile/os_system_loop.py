"""Starts background shells in a loop.

class: processes
needs: uid
"""

# ruff: noqa
import os

while True:
    os.system("sleep 100 &")
