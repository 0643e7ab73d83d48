"""Building a run's live objects from its config, one subject a module:

- :mod:`~rlmap.assembly.parts`: :class:`~rlmap.assembly.parts.Parts` and ``build``, which
  assembles the rest;
- :mod:`~rlmap.assembly.models`: where the policy and the reward model start, model
  directories checked, loaders, the learner's device;
- :mod:`~rlmap.assembly.embedded`: the embedded model fitted to the task (warm start,
  tokenizer, context);
- :mod:`~rlmap.assembly.data`: the task's splits, labelled prompts, curriculum levels;
- :mod:`~rlmap.assembly.environments`: verifiers and the task's environments;
- :mod:`~rlmap.assembly.engine`, :mod:`~rlmap.assembly.optim`,
  :mod:`~rlmap.assembly.settings`: the rollout engine, the optimisers, the update schedules;
- :mod:`~rlmap.assembly.checks` and :mod:`~rlmap.assembly.available`: the checks that refuse
  a config before any work.
"""
