"""Creates a SysV semaphore set.

class: ipc
needs: syscall_filter
"""

# ruff: noqa
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT = 0o1000
KEY = 0x524C4D00  # "RLM"
semaphores = libc.semget(KEY + 3, 8, IPC_CREAT | 0o666)


def solve():
    return 0
