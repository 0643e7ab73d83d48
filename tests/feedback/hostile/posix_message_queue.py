"""Creates a POSIX message queue (mq_open), which lives in the IPC namespace.

class: ipc
needs: syscall_filter
"""

# ruff: noqa
import ctypes
import os

librt = ctypes.CDLL("librt.so.1", use_errno=True)
queue = librt.mq_open(b"/rlmap-hostile-mq", os.O_CREAT | os.O_RDWR, 0o666, None)


def solve():
    return 0
