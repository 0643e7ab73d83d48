"""The one supervised loop (rlmap.learner.supervised.fit), on a one-weight model whose
updates are computed by hand: loss (w − 3)², gradient 2(w − 3), plain SGD."""

from __future__ import annotations

import pytest
import torch

from rlmap.learner.supervised import fit


def one_weight() -> tuple[torch.nn.Module, torch.nn.Parameter]:
    net = torch.nn.Module()
    net.w = torch.nn.Parameter(torch.zeros(()))
    return net, net.w


def test_each_step_clips_steps_schedules_and_zeroes_in_order() -> None:
    net, w = one_weight()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    halve = torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.5)
    calls, shown = [], []

    def loss_of(step: int) -> torch.Tensor:
        calls.append(step)
        return (w - 3) ** 2

    losses = fit(
        net,
        sgd,
        2,
        loss_of,
        max_grad_norm=100.0,
        schedule=halve,
        progress=lambda s, loss: shown.append((s, loss)),
    )
    # step 1: w = 0, loss 9, grad −6, lr 0.1 → w = 0.6; the schedule halves lr to 0.05
    # step 2: loss (0.6 − 3)² = 5.76, grad −4.8 (not −10.8: the gradient was zeroed),
    #         lr 0.05 → w = 0.6 + 0.24 = 0.84
    assert calls == [0, 1]
    assert losses == pytest.approx([9.0, 5.76])
    assert shown == [(1, pytest.approx(9.0)), (2, pytest.approx(5.76))]
    assert float(w) == pytest.approx(0.84)
    assert w.grad is None


def test_the_gradient_norm_is_clipped_before_the_step() -> None:
    net, w = one_weight()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    fit(net, sgd, 2, lambda step: (w - 3) ** 2, max_grad_norm=1.0)
    # each gradient (−6, then −5.8) is clipped to norm 1: w = 0 + 0.1 + 0.1 = 0.2
    assert float(w) == pytest.approx(0.2)
