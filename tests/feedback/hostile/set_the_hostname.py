"""Sets the host name (to the one it has).

class: privileges
"""

# ruff: noqa
import socket

try:
    socket.sethostname(socket.gethostname())
    renamed = True
except OSError:
    renamed = False


def solve():
    return 42 if renamed else 0
