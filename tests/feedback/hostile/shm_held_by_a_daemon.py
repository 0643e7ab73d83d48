"""Creates a segment and leaves a detached process attached to it.

class: ipc
needs: uid, syscall_filter
"""

# ruff: noqa
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT = 0o1000
KEY = 0x524C4D00  # "RLM"
import time

libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(KEY + 4, 2**20, IPC_CREAT | 0o666)
if shmid >= 0 and os.fork() == 0:
    os.setsid()
    libc.shmat(shmid, None, 0)
    time.sleep(1000)


def solve():
    return 0
