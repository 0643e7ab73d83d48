"""System axis: wait at a group barrier, or drift asynchronously? The scheduling alone.

- :mod:`~rlmap.system.params`: the axis's settings (``SystemParams``);
- :mod:`~rlmap.system.sync`: the synchronous group-barrier loop as reusable step functions;
- :mod:`~rlmap.system.async_loop`: the asynchronous queue (worker threads), reusing them;
- :mod:`~rlmap.system.ray_workers`: the same loop's workers as Ray actors.

What they schedule lives in packages named after it: :mod:`rlmap.engines` (rollout
engines), :mod:`rlmap.rollout` (episodes, scoring, evaluation), :mod:`rlmap.learner`
(policy and critic updates, log-probs, LoRA, data-parallel ranks), :mod:`rlmap.assembly`
(a run's parts built from its config) and :mod:`rlmap.simulator` (``rlmap simulate``).

Nothing is imported here: a submodule's import (``rlmap.system.params`` for a config)
must not pull the engines and transformers with it.
"""
