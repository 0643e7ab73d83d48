"""Creates an 8 MiB SysV shared-memory segment, fills it and leaves it behind.

class: ipc
needs: syscall_filter
"""

# ruff: noqa
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT = 0o1000
KEY = 0x524C4D00  # "RLM"
libc.shmat.restype = ctypes.c_void_p
size = 8 * 2**20
shmid = libc.shmget(KEY + 1, size, IPC_CREAT | 0o666)
if shmid >= 0:
    address = libc.shmat(shmid, None, 0)
    if address not in (None, 2**64 - 1):
        ctypes.memset(address, 1, size)


def solve():
    return 0
