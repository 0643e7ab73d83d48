"""Opens raw and packet sockets.

class: network
needs: network
"""

# ruff: noqa
import socket

opened = 0
for args in (
    (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    (socket.AF_PACKET, socket.SOCK_RAW, 0),
):
    try:
        socket.socket(*args).close()
        opened += 1
    except (OSError, AttributeError):
        pass


def solve():
    return 42 if opened else 0
