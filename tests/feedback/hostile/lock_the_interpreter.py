"""Takes an exclusive flock on the interpreter's binary, a host file, and sleeps.

class: file_locks
tests: trivial
stopped_by: timeout
"""

# ruff: noqa
import fcntl
import sys
import time

binary = open(sys.executable, "rb")
fcntl.flock(binary, fcntl.LOCK_EX)
time.sleep(1000)
