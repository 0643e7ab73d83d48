"""The HF engine's sampling chain: temperature and top-p as ``generate`` adds them,
:class:`OwnDraw` (the draw that keeps log μ and the kept set), the text stop criterion,
the guard against non-finite scores, and the ``GenerationConfig`` that turns every other
processor off. Why the chain is built by hand: :mod:`rlmap.engines.hf`'s docstring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    StoppingCriteria,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from rlmap.core.errors import TrainingError
from rlmap.engines.engine import StopStrings


def sampling_warpers(temperature: float, top_p: float) -> list[LogitsProcessor]:
    """Temperature and top-p as ``generate`` itself would add them: each only where it
    changes something (a top-p of 1 would sort (B, V) every step for nothing), none when
    greedy (temperature 0)."""
    if temperature == 0:
        return []
    warpers: list[LogitsProcessor] = []
    if temperature != 1:
        warpers.append(TemperatureLogitsWarper(float(temperature)))
    if top_p < 1:
        warpers.append(TopPLogitsWarper(float(top_p)))
    return warpers


class OwnDraw(LogitsProcessor):
    """The last link of the chain: picks o_t from the processed scores s_t (after
    temperature and top-p), keeps log μ(o_t) = s_t[o_t] − logsumexp(s_t) in ``logprobs``,
    (B,) a step, and returns scores that are 0 at o_t and −inf elsewhere, so that greedy
    ``generate`` picks o_t. ``generate`` itself then keeps no scores: (T, B, V) of them are
    39.8 GB at B = 256, T = 256, V = 151,936.

    o_t: the argmax (``greedy``, as ``generate`` picks it); a draw from softmax(s_t) with
    the engine's own ``generator``; or, without one, exactly ``generate``'s own draw
    (``multinomial(softmax(s_t))`` on the device's default generator, the same numbers).

    With ``kept_cap`` > 0 it also keeps each step's kept set K_t = {v : s_t[v] > −inf}, the
    support log μ is normalised over (o_t is always in it: −inf has probability 0), for
    the sets of at most ``kept_cap`` ids; a larger set is a row of -1 (not recorded)."""

    def __init__(
        self, generator: torch.Generator | None, *, greedy: bool = False, kept_cap: int = 0
    ) -> None:
        self.generator, self.greedy, self.kept_cap = generator, greedy, kept_cap
        self.logprobs: list[Tensor] = []
        """Per step, (B,) float32 log μ of the drawn tokens."""
        self.kept: list[Tensor] = []
        """Per step (with ``kept_cap``), (B, k_t) int32 kept ids, highest score first, -1 padded."""

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self.generator is not None and not self.greedy:
            logp = torch.log_softmax(scores.float(), dim=-1)  # (B, V)
            token = torch.multinomial(logp.exp(), 1, generator=self.generator)  # (B, 1)
            self.logprobs.append(logp.gather(-1, token).squeeze(-1))
        else:
            if self.greedy:
                token = scores.argmax(-1, keepdim=True)  # (B, 1)
            else:
                token = torch.multinomial(torch.softmax(scores, dim=-1), 1)  # (B, 1)
            s = scores.float()
            self.logprobs.append(s.gather(-1, token).squeeze(-1) - s.logsumexp(-1))
        if self.kept_cap > 0:
            self.kept.append(kept_ids(scores, self.kept_cap))
        return torch.full_like(scores, -math.inf).scatter_(-1, token, 0.0)


def kept_ids(scores: Tensor, cap: int) -> Tensor:
    """(B, k) int32: the ids of each row's finite scores, highest first, right-padded with -1;
    a row with more than ``cap`` of them is all -1 (k: the largest set of at most ``cap``)."""
    count = torch.isfinite(scores).sum(-1)  # (B,)
    fits = count <= cap
    k = int(torch.where(fits, count, 0).max())
    values, ids = scores.topk(k, dim=-1)  # (B, k)
    kept = torch.isfinite(values) & fits[:, None]
    return torch.where(kept, ids, -1).to(torch.int32)


class TextStop(StoppingCriteria):
    """Ends the rows whose response (after the ``width`` prompt columns) holds a stop string
    in the text of its last ``window`` tokens (checked at every step, so first seen where
    it is completed). Only saves the steps after it; where each response is cut is
    :func:`~rlmap.engines.engine.cut_at_stop_strings`'s."""

    def __init__(self, stops: StopStrings, width: int) -> None:
        self.stops, self.width = stops, width

    def __call__(self, input_ids: Tensor, scores: Any, **kwargs: Any) -> Tensor:
        tails = input_ids[:, max(self.width, input_ids.shape[1] - self.stops.window) :].tolist()
        texts = [self.stops.decode(tail) for tail in tails]
        hit = [any(s in t for s in self.stops.strings) for t in texts]
        return torch.tensor(hit, dtype=torch.bool, device=input_ids.device)


class FiniteScores(LogitsProcessor):
    """Stops generation at the first NaN or +inf score, or a row of −inf, as a one-line error.

    transformers merges custom processors in before it appends the temperature and top-p
    warpers, so this sees the model's logits (after any processor of ours, none of which
    writes −inf on a whole row). Without it, weights that overflow in the forward pass
    (finite but huge, e.g. after a step at an absurd learning rate) end in
    ``torch.multinomial``'s traceback.
    """

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        broken = torch.isnan(scores) | torch.isposinf(scores)
        if bool(broken.any() or torch.isneginf(scores).all(-1).any()):
            raise TrainingError(
                "rollout: the policy's scores are NaN or infinite (the "
                "weights overflow in the forward pass); stopped"
            )
        return scores


def sampling_config(
    *, max_new_tokens: int, pad_token_id: int, eos_token_ids: Sequence[int]
) -> GenerationConfig:
    """The full generation config: greedy over the chain's own draw (:class:`OwnDraw`, after
    the call's temperature and top-p), every processor of ``generate``'s own off.

    Greedy: none of ``generate``'s sampling fields (top-k, top-p, temperature) is read. No
    scores are returned: the draw keeps log μ of each token itself.
    """
    return GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        guidance_scale=1.0,
        renormalize_logits=False,
        remove_invalid_values=False,
        use_cache=True,
        output_scores=False,
        return_dict_in_generate=True,
        pad_token_id=pad_token_id,
        eos_token_id=list(eos_token_ids),
    )
