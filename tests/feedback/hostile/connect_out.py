"""Connects out: a public DNS server, the loopback, a name lookup.

class: network
needs: network
"""

# ruff: noqa
import socket

connected = 0
for family, address in (
    (socket.AF_INET, ("1.1.1.1", 53)),
    (socket.AF_INET, ("127.0.0.1", 22)),
    (socket.AF_INET6, ("::1", 22)),
):
    try:
        socket.create_connection(address, timeout=0.5).close()
        connected += 1
    except OSError:
        pass
try:
    socket.getaddrinfo("pypi.org", 443)
    connected += 1
except OSError:
    pass


def solve():
    return 42 if connected else 0
