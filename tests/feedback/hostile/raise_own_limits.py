"""Raises its own resource limits.

class: privileges
"""

# ruff: noqa
import resource

for r in (resource.RLIMIT_CPU, resource.RLIMIT_NPROC, resource.RLIMIT_AS):
    resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def solve():
    return 42
