"""Token log-probabilities and entropies from a training-engine forward pass.

``logprobs[:, t] = log π(tokens[:, t] | tokens[:, <t])`` on the learner's side,
aligned with the batch record's columns (column 0 has no context and gets 0).
Logits are divided by the sampling temperature so that π_θ and μ describe the
same distribution; top-p is *not* applied here — with ``top_p < 1`` the gap shows
up in κ, which is what κ is for.

Left padding: position ids are counted over real tokens only, as Hugging Face
``generate`` counts them, so that the learner and the rollout engine see the
same positions (otherwise κ ≠ 1 for a reason that is not numerics).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rlmap.core.batch import Batch
from rlmap.system.routing import replaying


def attention_of(batch: Batch) -> Tensor:
    """(B, T) bool: the batch's attention mask, or all True when it has none."""
    if batch.attention_mask is not None:
        return batch.attention_mask
    return torch.ones_like(batch.action_mask)


def position_ids(attention_BT: Tensor) -> Tensor:
    """(B, T) positions counted over real tokens; padding gets 0 (it is masked anyway)."""
    return (attention_BT.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(
    model: nn.Module,
    tokens_BT: Tensor,
    attention_BT: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """(log π of each token (B, T), its entropy (B, T) or None), column 0 set to 0.

    log π(x) = z_x − logsumexp(z) with z = logits / temperature: one gather and one
    logsumexp, no full-vocabulary log-softmax copy. Entropy is a detached
    diagnostic: H = logsumexp(z) − Σ softmax(z)·z.
    """
    logits = model(
        input_ids=tokens_BT, attention_mask=attention_BT, position_ids=position_ids(attention_BT)
    ).logits[:, :-1]  # (B, T-1, V) predicts tokens 1..T-1
    z = logits.float() / temperature if temperature != 1.0 else logits.float()
    lse = torch.logsumexp(z, dim=-1)  # (B, T-1)
    chosen = z.gather(-1, tokens_BT[:, 1:].unsqueeze(-1)).squeeze(-1)
    pad = tokens_BT.new_zeros((tokens_BT.shape[0], 1), dtype=z.dtype)
    logprobs = torch.cat([pad, chosen - lse], dim=1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            h = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
            entropy = torch.cat([pad, h], dim=1)
    return logprobs, entropy


@torch.no_grad()
def batched_logprobs(
    model: nn.Module,
    tokens_BT: Tensor,
    attention_BT: Tensor,
    *,
    temperature: float,
    micro_batch_size: int,
    routes_BTLK: Tensor | None = None,
) -> Tensor:
    """(B, T) detached log-probs in micro-batches (π_old recomputation, π_ref); with
    ``routes_BTLK`` a mixture-of-experts model replays the rollout's routing (R3)."""
    was_training = model.training
    model.eval()
    parts = []
    try:
        for i in range(0, tokens_BT.shape[0], micro_batch_size):
            rows = slice(i, i + micro_batch_size)
            routes = None if routes_BTLK is None else routes_BTLK[rows]
            with replaying(model, routes, replay=True):
                parts.append(token_logprobs(model, tokens_BT[rows], attention_BT[rows],
                                            temperature=temperature)[0])  # fmt: skip
    finally:
        model.train(was_training)
    return torch.cat(parts) if parts else tokens_BT.new_zeros(tokens_BT.shape, dtype=torch.float32)
