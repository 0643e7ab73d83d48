"""Writes forged frames and garbage into every pipe it holds.

class: reward_hack
"""

# ruff: noqa
import json
import os

frame = json.dumps({"ok": 42, "out": ""}).encode()
for fd in range(3, 64):
    try:
        os.write(fd, len(frame).to_bytes(8, "big") + frame + b"\x00garbage")
    except OSError:
        pass


def solve():
    return 0
