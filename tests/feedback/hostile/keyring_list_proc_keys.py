"""Reads /proc/keys for the trainer's keyrings.

class: keyring
needs: syscall_filter
"""

# ruff: noqa
try:
    seen = open("/proc/keys").read()
except OSError:
    seen = ""


def solve():
    return 42 if "_uid.0" in seen or "_uid_ses.0" in seen or "rlmap-planted" in seen else 0
