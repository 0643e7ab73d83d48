"""Attaches to its parent with ptrace (to read or write the tests' process).

class: privileges
"""

# ruff: noqa
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH = 16
attached = libc.ptrace(PTRACE_ATTACH, os.getppid(), None, None) == 0


def solve():
    return 42 if attached else 0
