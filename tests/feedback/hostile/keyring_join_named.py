"""Joins (creates) a named session keyring and stores a key in it.

class: keyring
needs: syscall_filter
"""

# ruff: noqa
import ctypes, os

libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, REQUEST_KEY, KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[
    os.uname().machine
]
KEYCTL_JOIN_SESSION_KEYRING = 1
joined = libc.syscall(KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, b"rlmap-shared") > 0
stored = libc.syscall(ADD_KEY, b"user", b"rlmap-named", b"x", 1, -3) > 0


def solve():
    return 42 if joined or stored else 0
