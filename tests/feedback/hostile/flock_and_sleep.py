"""Takes a lock on a file and sleeps for ever.

class: file_locks
tests: trivial
stopped_by: timeout
"""

# ruff: noqa
import fcntl
import time

lock = open("lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)
time.sleep(1000)
