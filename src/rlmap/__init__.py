"""rlmap: reinforcement-learning post-training of language models as one choice per axis.

The six axes are packages: ``feedback``, ``sampling``, ``estimators`` (credit),
``correction`` (behaviour), ``reduction`` and ``system``. ``recipes`` wires them
into named, fully written-out compositions. See DESIGN.md and docs/formulas.md.
"""

__version__ = "0.1.0"
