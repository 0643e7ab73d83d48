"""Reward shaping added to the outcome reward: DAPO's soft overlong punishment."""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths_B: Tensor, max_len: int, cache: int) -> Tensor:
    """R_len(y), the soft overlong punishment of DAPO (Yu et al. 2025, eq. 13).

    With L_max = ``max_len`` and L_c = ``cache`` (the punishment interval)::

        R_len = 0                           if |y| ≤ L_max − L_c
              = ((L_max − L_c) − |y|) / L_c  if L_max − L_c < |y| ≤ L_max
              = −1                          if |y| > L_max

    It is added to the outcome reward R_i. Shapes: ``lengths_B`` (B,) response
    lengths |y| in tokens → (B,) float32 in [−1, 0], non-increasing in |y|.
    ``cache = 0`` gives the hard punishment (0 up to L_max, −1 beyond).

    Differs from verl's implementation: no extra penalty factor (scale the result
    instead), and lengths beyond L_max get −1 as in the paper.
    """
    if max_len < 1 or not 0 <= cache <= max_len:
        raise ValueError(
            f"overlong_penalty: need 0 <= cache <= max_len, max_len >= 1; "
            f"got max_len={max_len}, cache={cache}"
        )
    length = lengths_B.to(torch.float32)  # (B,)
    free = max_len - cache  # L_max − L_c, the length up to which nothing is taken
    soft = (free - length) / max(cache, 1)  # (B,); used only inside (free, L_max]
    penalty = torch.where(length <= max_len, soft, torch.full_like(length, -1.0))
    return torch.where(length <= free, torch.zeros_like(length), penalty)
