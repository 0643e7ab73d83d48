"""System axis: wait at a group barrier, or drift asynchronously?

- :mod:`~rlmap.system.engine`: the rollout-engine interface (``Completion``, ``RolloutEngine``);
- :mod:`~rlmap.system.hf_engine`: Hugging Face ``generate`` engine (CPU/GPU);
- :mod:`~rlmap.system.rollout`: episodes against environments, and the batch record;
- :mod:`~rlmap.system.scoring`: base reward + shaping through the reward interface;
- :mod:`~rlmap.system.learner`: policy updates with pinned reduction denominators;
- :mod:`~rlmap.system.update_loop`: the one epoch × mini-batch × micro-batch loop (policy and
  critic), with :mod:`~rlmap.system.optim_step`'s non-finite guard;
- :mod:`~rlmap.system.logprobs`: token log-probs, the LM head chunk by chunk;
- :mod:`~rlmap.system.memory`: bf16 autocast over float32 weights, activation checkpointing;
- :mod:`~rlmap.system.routing`: MoE routes recorded in rollout, replayed in the learner (R3);
- :mod:`~rlmap.system.lora`: LoRA policies (peft): adapters off for π_ref, merged weights for
  the engines;
- :mod:`~rlmap.system.critic`: the value critic, its values and updates;
- :mod:`~rlmap.system.sync`: the synchronous group-barrier loop as reusable step functions;
- :mod:`~rlmap.system.async_loop`: the asynchronous queue (worker threads), reusing them;
- :mod:`~rlmap.system.ray_workers`: the same loop's workers as Ray actors;
- :mod:`~rlmap.system.simulate` (with ``sim_inputs``, ``sim_report``): the discrete-event
  model behind ``rlmap simulate``;
- :mod:`~rlmap.system.setup`: building a run's live objects from its config.

Nothing is imported here: a submodule's import (``rlmap.system.params`` for a config)
must not pull the engines and transformers with it.
"""
