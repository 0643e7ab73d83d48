"""Links to / and reads the host's files through the link.

class: files
needs: private_root
"""

# ruff: noqa
import os

escaped = 0
try:
    os.symlink("/", "up")
    for path in ("up/etc/shadow", "up/etc/passwd"):
        try:
            open(path).read(1)
            escaped += 1
        except OSError:
            pass
    for path in ("up/tmp", "up/home", "up/work"):
        try:
            os.listdir(path)
            escaped += 1
        except OSError:
            pass
except OSError:
    pass


def solve():
    return 42 if escaped else 0
