"""The rollout-engine interface: what the loops ask of whatever samples the responses.

An engine turns prompts into sampled completions and reports, for every sampled
token, log μ — the log-probability under the distribution the token was actually
drawn from (temperature and top-p applied). That number becomes
``Batch.behavior_logprobs`` and is never recomputed later under the same name.

Implementations: :class:`rlmap.engines.hf.HFEngine` (Hugging Face
``generate``, CPU or GPU); a vLLM engine implements the same protocol on GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
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
    ``stop_token_ids`` (``response_ids[-1]`` says which) — or with the token that completed
    one of its stop strings; False when it hit ``max_new_tokens``."""
    version: int
    """Weight version of the engine that sampled it."""
    routes: torch.Tensor | None = None
    """Mixture-of-experts policies, when the engine records routing: (len(prompt_ids) +
    len(response_ids), L, K) long, the experts each position was routed through (-1 where
    none was: the last token of the longest responses of a call is never fed back)."""
    kept: torch.Tensor | None = None
    """When the call asked for kept sets (``kept_sets``): (len(response_ids), K) int32, the ids
    the top-p filter kept at each step (the set log μ is renormalised over; the sampled
    token is in it), right-padded with -1; a row of -1 where the set was larger than the
    call's cap (not recorded)."""


def kept_rows(sets: Sequence[Sequence[int]], cap: int) -> torch.Tensor:
    """(len(sets), K) int32: each set's ids in a row, right-padded with -1, a set of more than
    ``cap`` ids left out (a row of -1); K is the longest set kept."""
    sets = [s if len(s) <= cap else () for s in sets]
    out = torch.full((len(sets), max((len(s) for s in sets), default=0)), -1, dtype=torch.int32)
    for i, s in enumerate(sets):
        out[i, : len(s)] = torch.tensor(list(s), dtype=torch.int32)
    return out


@dataclass(frozen=True)
class StopStrings:
    """Texts that end a turn however the model spells them in tokens (``</tool_call>`` is
    several tokens of a BPE vocabulary, and not always the same ones), with the decoder
    that reads the sampled ids as text (the tokenizer's, special tokens kept).

    A response stops at the first token after which its text contains one of ``strings``;
    that token is the response's last (:func:`cut_at_stop_strings`). The ids are the
    engine's, never re-encoded: the text only says where to cut."""

    strings: tuple[str, ...]
    decode: Callable[[list[int]], str]

    def __post_init__(self) -> None:
        if not self.strings or not all(self.strings) or any("\ufffd" in s for s in self.strings):
            raise ValueError(f"stop strings: need non-empty strings, got {self.strings!r}")

    @property
    def window(self) -> int:
        """Tokens enough to hold any of the strings (a byte-level token adds a byte or more;
        two more for decoders that drop a leading space)."""
        return max(len(s.encode()) for s in self.strings) + 2


def stop_string_end(stops: StopStrings, ids: Sequence[int]) -> int | None:
    """The length of the shortest prefix of ``ids`` whose text contains a stop string
    (the completing token included), or None when the whole text contains none.

    One decode of the whole, then a bisection over prefixes: a prefix's text is a prefix
    of a longer one's (up to a character still incomplete at its end), so once a string
    is in, it stays in."""

    def has(k: int) -> bool:
        text = stops.decode(list(ids[:k]))
        return any(s in text for s in stops.strings)

    if not ids or not stops.strings or not has(len(ids)):
        return None
    lo, hi = 1, len(ids)  # has(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if has(mid) else (mid + 1, hi)
    return lo


def cut_at_stop_strings(c: Completion, stops: StopStrings | None) -> Completion:
    """``c`` cut after the token that completes its first stop string (then ``stopped``),
    or ``c`` itself when it contains none before its own end."""
    end = None if stops is None else stop_string_end(stops, c.response_ids)
    if end is None or (end == len(c.response_ids) and c.stopped):
        return c
    routes = None if c.routes is None else c.routes[: len(c.prompt_ids) + end]
    kept = None if c.kept is None else c.kept[:end]
    return replace(
        c,
        response_ids=c.response_ids[:end],
        logprobs=c.logprobs[:end],
        stopped=True,
        routes=routes,
        kept=kept,
    )


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
        stop_strings: StopStrings | None = None,
        kept_sets: int = 0,
    ) -> list[list[Completion]]:
        """``n`` samples for each prompt: the outer list follows ``prompts``, the inner has ``n``.

        ``temperature == 0`` means greedy decoding (for evaluation). A sample ends at EOS, at
        any of ``stop_token_ids`` (e.g. the end of a tool call, where an environment takes
        over), after the token that completes one of ``stop_strings``, or after
        ``max_new_tokens``; the stop token is part of the response. ``kept_sets`` > 0: each
        completion carries the kept set of every sampled token, those of at most that many
        ids (``Completion.kept``); callers pass it only when they want sets, so an engine
        without them need not take the argument.
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
