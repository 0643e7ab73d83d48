"""Asks the kernel to find or make a key (request_key, with an upcall).

class: keyring
needs: syscall_filter
"""

# ruff: noqa
import ctypes, os

libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, REQUEST_KEY, KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[
    os.uname().machine
]
found = libc.syscall(REQUEST_KEY, b"user", b"rlmap-planted", b"callout", -3)


def solve():
    return 42 if found > 0 else 0
