"""Creates a SysV message queue with a message in it.

class: ipc
needs: syscall_filter
"""

# ruff: noqa
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT = 0o1000
KEY = 0x524C4D00  # "RLM"


class Message(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 64)]


queue = libc.msgget(KEY + 2, IPC_CREAT | 0o666)
if queue >= 0:
    libc.msgsnd(queue, ctypes.byref(Message(1, b"left behind")), 64, 0)


def solve():
    return 0
