"""sys.exit(0) before the tests.

class: exits
tests: trivial
stopped_by: exited_early
"""

# ruff: noqa
import sys

sys.exit(0)
