"""Listens on a port and waits for a connection.

class: network
tests: trivial
stopped_by: timeout
needs: network
"""

# ruff: noqa
import socket

server = socket.socket()
server.bind(("0.0.0.0", 0))
server.listen()
server.accept()
