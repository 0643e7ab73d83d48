"""Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code")."""

from __future__ import annotations

import torch
from torch import Tensor


def pass_at_k_tensor(n_P: Tensor, c_P: Tensor, k: int) -> Tensor:
    """pass@k = 1 − C(n−c, k) / C(n, k) per prompt, from n samples of which c are correct.

    Computed as a product, never with binomials (which overflow for large n)::

        C(n−c, k) / C(n, k) = Π_{i=0}^{k−1} (n − c − i) / (n − i)

    each factor in [0, 1] (clamped at 0: once n − c − i hits 0 the product is 0,
    i.e. pass@k = 1 when fewer than k samples are wrong). Chen et al. write the
    same ratio as Π_{i=n−c+1}^{n} (1 − k/i); this form has k factors for every prompt,
    so it vectorises over prompts with different n and c.

    Shapes: ``n_P``, ``c_P`` (P,) integer counts → (P,) float64. Raises ValueError
    if k < 1, k > n for some prompt, or c is outside [0, n].
    """
    n = n_P.to(torch.float64)  # (P,)
    c = c_P.to(torch.float64)  # (P,)
    if k < 1:
        raise ValueError(f"pass@k: k must be >= 1, got {k}")
    if bool((n < k).any()):
        raise ValueError(f"pass@k: k={k} exceeds the samples per prompt n (min {n.min()})")
    if bool(((c < 0) | (c > n)).any()):
        raise ValueError("pass@k: correct counts c must lie in [0, n]")
    i = torch.arange(k, dtype=torch.float64, device=n.device)  # (k,)
    factors = ((n - c).unsqueeze(-1) - i) / (n.unsqueeze(-1) - i)  # (P, k)
    return 1.0 - factors.clamp(min=0.0).prod(-1)


def pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k for one prompt: n samples, c correct (see :func:`pass_at_k_tensor`)."""
    return float(pass_at_k_tensor(torch.tensor([n]), torch.tensor([c]), k)[0])
