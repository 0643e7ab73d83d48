"""The torch-free discrete-event model behind ``rlmap simulate``: sync, async
and partial rollout on a profile (inputs), and its report."""
