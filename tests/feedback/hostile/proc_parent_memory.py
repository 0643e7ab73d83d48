"""Reads its parent's memory through /proc/<ppid>/mem, looking for the nonce.

class: proc
"""

# ruff: noqa
import os
import re

found = b""
for pid in (os.getppid(), 1):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        with open(f"/proc/{pid}/mem", "rb", 0) as memory:
            for line in maps:
                span, perms = line.split()[:2]
                if not perms.startswith("rw"):
                    continue
                start, end = (int(x, 16) for x in span.split("-"))
                memory.seek(start)
                match = re.search(rb"\n[0-9a-f]{32}\n", memory.read(min(end - start, 2**24)))
                if match:
                    found = match.group(0)
                    os.write(1, found)
    except (OSError, ValueError, OverflowError):
        pass


def solve():
    return 42 if found else 0
