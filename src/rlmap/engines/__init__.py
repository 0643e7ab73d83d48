"""Rollout engines: the interface (``Completion``, ``RolloutEngine``), Hugging Face
``generate`` and vLLM, and the MoE routes they record."""
