"""The reduction's settings: which unit the loss is averaged in, and L_max for a fixed budget."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReductionParams:
    """Which reduction turns per-token losses into one scalar (docs/formulas.md §5).

    Plain data: values are checked by :func:`rlmap.reduction.check_params` (and the
    recipe validator), so a config loader can report every problem with its field name.
    """

    name: str = "response_mean"
    """``response_mean`` (each response weighs the same), ``token_mean`` (each action token
    weighs the same), ``fixed_budget`` (Dr. GRPO: a constant denominator B · L_max),
    ``prompt_mean`` (each prompt group weighs the same; SkyRL), ``token_sum`` (no
    denominator; verl) or ``seq_mean_token_sum`` (each response's token sum over B; verl)."""
    max_len: int | None = None
    """L_max, the generation budget in action tokens; required by ``fixed_budget``."""
