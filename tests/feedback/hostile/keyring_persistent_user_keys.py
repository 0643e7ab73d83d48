"""Adds keys to its uid's user keyrings, which outlive every process of the uid.

class: keyring
needs: syscall_filter
"""

# ruff: noqa
import ctypes, os

libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, REQUEST_KEY, KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[
    os.uname().machine
]
USER, USER_SESSION = -4, -5
added = sum(
    libc.syscall(ADD_KEY, b"user", b"rlmap-left-behind", b"x" * 1000, 1000, ring) > 0
    for ring in (USER, USER_SESSION)
)


def solve():
    return 42 if added else 0
