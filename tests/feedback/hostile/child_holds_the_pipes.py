"""Exits, leaving a child that holds every pipe it inherited.

class: processes
tests: trivial
needs: uid
"""

# ruff: noqa
import os
import time

if os.fork():
    os._exit(0)
time.sleep(1000)
