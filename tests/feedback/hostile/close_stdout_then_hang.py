"""Closes stdout and stderr, then sleeps.

class: exits
"""

# ruff: noqa
import os
import time

os.close(1)
os.close(2)
time.sleep(10**6)
