"""``rlmap advise``: which trainer for a task, by the map's selection table.

- :mod:`~rlmap.advise.advice`: the six questions answered in order, one config composed
  (pure but for the check that this machine can run it);
- :mod:`~rlmap.advise.prompts`: the interactive questions.

The table itself is data in :mod:`rlmap.recipes.selection`. This package sits at the top,
beside :mod:`rlmap.experiments`: a proposal is checked against the machine
(:func:`rlmap.assembly.available.refuse_unavailable`) as a run would be.
"""
