"""Writes to sysctl and sysrq files in /proc (the values they already hold).

class: proc
"""

# ruff: noqa
written = 0
for path in ("/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger"):
    try:
        current = open(path).read() if path.endswith("hostname") else "0"
        with open(path, "w") as f:
            f.write(current)
        written += 1
    except OSError:
        pass


def solve():
    return 42 if written else 0
