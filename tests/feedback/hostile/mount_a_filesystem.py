"""Mounts a tmpfs and remounts its root read-write.

class: privileges
"""

# ruff: noqa
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("m", exist_ok=True)
mounted = libc.mount(b"none", b"m", b"tmpfs", 0, None) == 0
mounted |= libc.mount(None, b"/", None, 32, None) == 0  # MS_REMOUNT


def solve():
    return 42 if mounted else 0
