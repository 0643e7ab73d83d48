"""What the engines and the learner both do to a model: LoRA adapters (merged for
the engines, off for the reference) and MoE routes (recorded in rollout, replayed in the
learner)."""
