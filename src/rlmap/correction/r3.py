"""Routing replay (R3) for mixture-of-experts routers: the pure tensor part (docs/formulas.md §4).

The rollout engine records its top-k expert choice per token and layer; in the
training forward, each router's softmax is restricted to those experts. The logits
still come from the training router, so the router keeps learning while the two
engines use the same experts. Shapes: N tokens (flattened, any leading dims allowed),
E experts, K experts chosen per token.

Paper: Ma et al. 2025, "Stabilizing MoE reinforcement learning by aligning training
and inference routers" (Rollout Routing Replay).
Differs: a router that takes softmax over *all* experts and then selects top-k
without renormalising (e.g. ``norm_topk_prob=False``) must gather softmax(logits) at
the recorded ids instead; softmax over the replayed logits gives the renormalised
top-k weights.
"""

from __future__ import annotations

import torch
from torch import Tensor


def router_mask(expert_ids_NK: Tensor, num_experts: int) -> Tensor:
    """(N, E) bool: True at the experts recorded for each token."""
    mask = torch.zeros(
        (*expert_ids_NK.shape[:-1], num_experts), dtype=torch.bool, device=expert_ids_NK.device
    )
    return mask.scatter(-1, expert_ids_NK.long(), True)


def replay_router_logits(logits_NE: Tensor, expert_ids_NK: Tensor) -> Tensor:
    """(N, E) logits with −inf outside the recorded experts; gradient flows to the kept ones.

    softmax of the result is zero outside the recorded experts and equals the
    training router's softmax renormalised over them.
    """
    keep_NE = router_mask(expert_ids_NK, logits_NE.shape[-1])
    return logits_NE.masked_fill(~keep_NE, float("-inf"))
