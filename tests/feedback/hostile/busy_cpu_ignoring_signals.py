"""Ignores every signal it can and spins.

class: signals
"""

# ruff: noqa
import signal

for s in (signal.SIGTERM, signal.SIGXCPU, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
x = 0
while True:
    x += 1
