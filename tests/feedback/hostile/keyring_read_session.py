"""Searches the session keyring it inherited for a planted key, reads and revokes it, adds its own.

class: keyring
needs: syscall_filter
"""

# ruff: noqa
import ctypes, os

libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, REQUEST_KEY, KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[
    os.uname().machine
]
KEYCTL_REVOKE, KEYCTL_SEARCH, KEYCTL_READ = 3, 10, 11
SESSION = -3
stolen = 0
key = libc.syscall(KEYCTL, KEYCTL_SEARCH, SESSION, b"user", b"rlmap-planted", 0)
if key > 0:
    buffer = ctypes.create_string_buffer(256)
    stolen += libc.syscall(KEYCTL, KEYCTL_READ, key, buffer, 256) > 0
    stolen += libc.syscall(KEYCTL, KEYCTL_REVOKE, key) == 0
stolen += libc.syscall(ADD_KEY, b"user", b"rlmap-sandbox-was-here", b"x", 1, SESSION) > 0


def solve():
    return 42 if stolen else 0
