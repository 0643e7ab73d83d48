"""Starts threads until it cannot.

class: processes
needs: uid
"""

# ruff: noqa
import threading
import time

while True:
    threading.Thread(target=time.sleep, args=(100,), daemon=True).start()
