"""System axis: wait at a group barrier, or drift asynchronously? The scheduling alone.

- :mod:`~rlmap.system.sync`: the synchronous group-barrier loop;
- :mod:`~rlmap.system.async_loop`: the asynchronous queue (worker threads);
- :mod:`~rlmap.system.ray_workers`: the same loop's workers as Ray actors;
- the step functions both loops share: :mod:`~rlmap.system.rounds` (a round of rollouts,
  scored), :mod:`~rlmap.system.learner_step` (the learner's half of a step),
  :mod:`~rlmap.system.loop_state` (the state between steps and the rules that move it) and
  :mod:`~rlmap.system.step_metrics` (what a step logs);
- the asynchronous loop's parts: :mod:`~rlmap.system.board` (the published weights),
  :mod:`~rlmap.system.admission` (the staleness bound), :mod:`~rlmap.system.snapshots` (the
  queue in a checkpoint) and :mod:`~rlmap.system.round_seeds` (repeatable rounds).

The axis's settings (``SystemParams``) are :mod:`rlmap.recipes.system_params`, beside the
other sections of a recipe's config: a config sits below the loops that run it and must not
import them (the layers in ``pyproject.toml``). What the loops schedule lives in packages named
after it: :mod:`rlmap.engines` (rollout engines), :mod:`rlmap.rollout` (episodes, scoring,
evaluation), :mod:`rlmap.learner` (policy and critic updates, log-probs, LoRA, data-parallel
ranks), :mod:`rlmap.assembly` (a run's parts built from its config, where Ray actors are
placed) and :mod:`rlmap.simulator` (``rlmap simulate``).

Nothing is imported here: a submodule's import must not pull the engines and transformers
with the rest.
"""
