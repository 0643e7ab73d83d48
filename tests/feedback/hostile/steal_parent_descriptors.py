"""Takes its parent's file descriptors with pidfd_getfd.

class: privileges
"""

# ruff: noqa
import os

stolen = 0
try:
    pidfd = os.pidfd_open(os.getppid())
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for fd in range(64):
        stolen += libc.syscall(438, pidfd, fd, 0) >= 0
except (OSError, AttributeError):
    pass


def solve():
    return 42 if stolen else 0
