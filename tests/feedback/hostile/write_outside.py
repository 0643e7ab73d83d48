"""Writes files outside its working directory: /, /tmp, the parent directory.

class: files
needs: private_root
"""

# ruff: noqa
written = 0
for path in ("/escaped.txt", "/tmp/rlmap-hostile-escaped", "../escaped.txt", "/usr/escaped"):
    try:
        with open(path, "w") as f:
            f.write("pwned")
        written += 1
    except OSError:
        pass


def solve():
    return 42 if written else 0
