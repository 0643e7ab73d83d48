"""The rollout-engine interface: what the loops ask of whatever samples the responses.

An engine turns prompts into sampled completions and reports, for every sampled
token, log μ — the log-probability under the distribution the token was actually
drawn from (temperature and top-p applied). That number becomes
``Batch.behavior_logprobs`` and is never recomputed later under the same name.

Implementations: :class:`rlmap.system.hf_engine.HFEngine` (Hugging Face
``generate``, CPU or GPU); a vLLM engine implements the same protocol on GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class Completion:
    """One sampled response to one prompt."""

    prompt_ids: tuple[int, ...]
    """The prompt exactly as given to the engine (no padding)."""
    response_ids: tuple[int, ...]
    """The sampled tokens, including the EOS token when one was emitted; no padding."""
    logprobs: tuple[float, ...]
    """log μ(o_t | q, o_<t) of each response token under the distribution it was sampled from
    (temperature and top-p applied; computed in float32); same length as ``response_ids``."""
    stopped: bool
    """True when the response ended with a stop token — EOS, or one of the call's
    ``stop_token_ids`` (``response_ids[-1]`` says which); False when it hit ``max_new_tokens``."""
    version: int
    """Weight version of the engine that sampled it."""
    routes: torch.Tensor | None = None
    """Mixture-of-experts policies, when the engine records routing: (len(prompt_ids) +
    len(response_ids), L, K) long, the experts each position was routed through (-1 where
    none was: the last token of the longest responses of a call is never fed back)."""


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples completions from the current rollout weights and tracks their version."""

    @property
    def version(self) -> int:
        """The weight version the next ``generate`` samples from."""
        ...

    def reseed(self, seed: int | None) -> None:
        """Sample from a generator of the engine's own seeded with ``seed`` from now on
        (None: torch's default generator)."""
        ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop_token_ids: Sequence[int] = (),
    ) -> list[list[Completion]]:
        """``n`` samples for each prompt: the outer list follows ``prompts``, the inner has ``n``.

        ``temperature == 0`` means greedy decoding (for evaluation). A sample ends at EOS, at
        any of ``stop_token_ids`` (e.g. the end of a tool call, where an environment takes
        over), or after ``max_new_tokens``; the stop token is part of the response.
        """
        ...

    def update_weights(self, model: torch.nn.Module, version: int) -> None:
        """Take the weights of ``model`` (the learner's policy) and label them ``version``."""
        ...


def forget_cache(engine: RolloutEngine) -> None:
    """Clear the engine's cache of earlier calls, for an engine that keeps one (vLLM's prefix
    cache; the HF engine keeps none). Called where a resumed run's engine would start
    empty — at the end of every step and after every evaluation — so that an
    uninterrupted run and a resumed one sample the same steps from the same state."""
    clear = getattr(engine, "clear_cache", None)
    if clear is not None:
        clear()
