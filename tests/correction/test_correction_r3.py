"""Routing replay (R3), the pure part: restrict each router's softmax to the recorded experts."""

from __future__ import annotations

import pytest
import torch

from rlmap.correction import replay_router_logits, router_mask


def test_router_mask_hand_case() -> None:
    # E = 4; token 0 used experts {1, 3}, token 1 used {0, 1}
    ids = torch.tensor([[1, 3], [0, 1]])
    assert router_mask(ids, 4).tolist() == [[False, True, False, True], [True, True, False, False]]


def test_replayed_softmax_hand_case() -> None:
    # logits (0, ln 3, 5, ln 1 = 0), recorded {1, 3}: softmax over {3, 1}/4 → (0, 0.75, 0, 0.25)
    logits = torch.tensor([[0.0, torch.log(torch.tensor(3.0)).item(), 5.0, 0.0]])
    probs = replay_router_logits(logits, torch.tensor([[1, 3]])).softmax(-1)
    torch.testing.assert_close(probs, torch.tensor([[0.0, 0.75, 0.0, 0.25]]))


def test_reference_loop_zero_outside_and_renormalised_inside() -> None:
    g = torch.Generator().manual_seed(0)
    n, e, k = 6, 8, 2
    logits = torch.randn(n, e, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)])
    probs = replay_router_logits(logits, ids).softmax(-1)
    for i in range(n):
        chosen = {int(x) for x in ids[i]}
        z = sum(float(torch.exp(logits[i, j])) for j in chosen)
        for j in range(e):
            want = float(torch.exp(logits[i, j])) / z if j in chosen else 0.0
            assert probs[i, j].item() == pytest.approx(want, rel=1e-5, abs=1e-8)


def test_gradient_reaches_the_kept_logits_only() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 6, generator=g, requires_grad=True)
    ids = torch.tensor([[0, 2], [1, 5], [3, 4], [2, 0], [5, 1]])
    probs = replay_router_logits(logits, ids).softmax(-1)
    target = torch.randn(5, 6, generator=g)
    (grad,) = torch.autograd.grad((probs * target).sum(), logits)
    keep = router_mask(ids, 6)
    assert torch.isfinite(grad).all()
    assert torch.all(grad[~keep] == 0)
    assert torch.all(grad[keep] != 0)


def test_leading_dims_are_allowed() -> None:
    logits = torch.zeros(2, 3, 4)  # (layers, tokens, E)
    ids = torch.tensor([[[0], [1], [2]], [[3], [3], [0]]])
    probs = replay_router_logits(logits, ids).softmax(-1)
    assert torch.equal(probs.argmax(-1), ids.squeeze(-1))
    torch.testing.assert_close(probs.amax(-1), torch.ones(2, 3))
