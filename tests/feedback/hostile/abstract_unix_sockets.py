"""Connects to every abstract unix socket it can see (host daemons listen there).

class: network
needs: network
"""

# ruff: noqa
import socket

connected = 0
try:
    lines = open("/proc/net/unix").read().splitlines()[1:]
except OSError:
    lines = []
for line in lines:
    path = line.split()[-1] if len(line.split()) > 7 else ""
    if path.startswith("@"):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(0.2)
            s.connect("\0" + path[1:])
            connected += 1
        except OSError:
            pass


def solve():
    return 42 if connected else 0
