"""Opens pid 1's namespaces and enters them (setns).

class: privileges
"""

# ruff: noqa
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
entered = 0
for kind in ("net", "mnt", "pid", "ipc"):
    try:
        fd = os.open(f"/proc/1/ns/{kind}", os.O_RDONLY)
        entered += libc.setns(fd, 0) == 0
    except OSError:
        pass


def solve():
    return 42 if entered else 0
