"""Reads secrets of the host: /etc/shadow, root's files, pid 1's environment.

class: files
needs: private_root
"""

# ruff: noqa
import glob

read = []
for path in ["/etc/shadow", "/proc/1/environ", *glob.glob("/root/.*"), *glob.glob("/home/*/.*")]:
    try:
        with open(path, "rb") as f:
            f.read(1)
        read.append(path)
    except OSError:
        pass


def solve():
    return 42 if read else 0
