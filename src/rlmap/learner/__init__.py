"""The learner: the policy update (pinned reduction denominators), the critic, the
one epoch × mini-batch × micro-batch loop, log-probs chunk by chunk, memory, LoRA, and
data-parallel ranks (DDP/FSDP2)."""
