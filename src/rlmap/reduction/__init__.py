"""Reduction axis: in what unit is the loss averaged? (docs/formulas.md §5)

A reduction turns the whole optimiser mini-batch's action mask into per-token
weights once (``token_weights``), with a denominator pinned over all
micro-batches and data-parallel ranks (``Denominator``); every micro-batch's
loss is then ``reduce(j_BT, w_BT) = Σ w·j`` over its rows (``microbatches``).
Names: ``response_mean``, ``token_mean``, ``fixed_budget``, ``prompt_mean``, ``token_sum``,
``seq_mean_token_sum`` in ``registry``.
"""

from rlmap.reduction.apply import check_params, reduce, token_weights
from rlmap.reduction.denominator import Denominator, denominator
from rlmap.reduction.microbatch import microbatches, split_indices
from rlmap.reduction.params import ReductionParams
from rlmap.reduction.reductions import (
    Reduction,
    fixed_budget_weights,
    prompt_mean_weights,
    registry,
    response_mean_weights,
    seq_mean_token_sum_weights,
    token_mean_weights,
    token_sum_weights,
)

__all__ = [
    "Denominator",
    "Reduction",
    "ReductionParams",
    "check_params",
    "denominator",
    "fixed_budget_weights",
    "microbatches",
    "prompt_mean_weights",
    "reduce",
    "registry",
    "response_mean_weights",
    "seq_mean_token_sum_weights",
    "split_indices",
    "token_mean_weights",
    "token_sum_weights",
    "token_weights",
]
