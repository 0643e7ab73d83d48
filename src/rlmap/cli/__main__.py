"""``python -m rlmap.cli``: the ``rlmap`` command (:func:`rlmap.cli.main`)."""

from __future__ import annotations

import sys

from rlmap.cli import main

sys.exit(main())
