"""Calls setuid(0) and chroot.

class: privileges
"""

# ruff: noqa
import os

os.setuid(0)
os.chroot("/")


def solve():
    return 42
