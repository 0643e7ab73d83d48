"""Creates a user namespace, to be root in it.

class: privileges
needs: private_root
"""

# ruff: noqa
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER = 0x10000000
inside = libc.unshare(CLONE_NEWUSER) == 0


def solve():
    return 42 if inside else 0
