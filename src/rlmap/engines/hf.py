"""A rollout engine on Hugging Face ``generate`` (CPU or GPU).

Notation: ``B`` sequences in a chunk (prompts × n, at most ``max_batch``), ``P`` the
longest prompt of the chunk (prompts are left-padded to it), ``T`` generated
steps (≤ max_new_tokens), ``V`` the vocabulary.

Behaviour log-probs. o_t is drawn from softmax(s_t), where s_t are the *processed* scores:
the float32 logits after the temperature and top-p warpers (tokens outside the nucleus at
-inf), and the last link of the chain, :class:`OwnDraw`, keeps

    log μ(o_t) = s_t[o_t] − logsumexp(s_t)

as it draws: the log-probability of the distribution the token was drawn from — the
nucleus renormalisation included, no recomputation — (B,) a step. ``generate`` runs greedy
over the draw's forced scores and keeps none of its own: (T, B, V) of them would be 39.8 GB
at B = 256, T = 256, V = 151,936. Greedy decoding (temperature == 0) runs no warpers, so
there log μ is the log-softmax of the raw logits.

Kept sets (``generate(kept_sets=cap)``, for ``behaviour.replay_sampling_set``): the draw also
keeps, per step, the ids whose processed score is finite — the support it drew from, so
the sampled token is in it — as (B, k) int32 (:func:`kept_ids`), a set over ``cap`` ids
not kept; the learner renormalises over them (docs/formulas.md §4.1).

Only our settings shape μ. In transformers 5, ``generate`` fills every field of an
explicit ``GenerationConfig`` left at ``None`` from ``model.generation_config`` and
then from global defaults (``top_k=50``). Real checkpoints ship ``top_k=20``,
``repetition_penalty``, ``min_p``, ``suppress_tokens``…; several of these have no
non-``None`` "off" value. So the engine (a) runs ``generate`` greedy over its own chain
(no sampling field of ``generate``'s is read) with every other processor set off
explicitly, and (b) hides the model's shipped generation config for the duration of the
call.

Randomness: sampling draws from torch's default generator of the model's device, exactly
as ``generate``'s own sampling would (``multinomial(softmax(s_t))``, the same numbers), so
saving and restoring the torch RNG state reproduces the rollouts exactly. An engine given
a generator of its own (:meth:`HFEngine.reseed`: the asynchronous loop's workers, one per
round) draws from that instead and touches no global generator. Either way the chain is
temperature and top-p (transformers' own warpers, in its order), then :class:`OwnDraw`.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor
from transformers import (
    GenerationConfig,
    GenerationMixin,
    LogitsProcessor,
    PreTrainedModel,
    StoppingCriteriaList,
)

from rlmap.core.batch import cross
from rlmap.core.hf import context_length
from rlmap.engines.engine import Completion, StopStrings, cut_at_stop_strings
from rlmap.engines.hf_sampling import (
    FiniteScores,
    OwnDraw,
    TextStop,
    sampling_config,
    sampling_warpers,
)
from rlmap.models.lora import is_lora, merged_copy, rollout_stream
from rlmap.models.routing import NO_ROUTE, assemble, recording

if TYPE_CHECKING:

    class Generative(PreTrainedModel, GenerationMixin):
        """A Hugging Face model with ``generate`` (in transformers 5 not every one has it)."""

else:
    Generative = GenerationMixin


class HFEngine:
    """Batched sampling with ``model.generate`` (KV cache on), left padding and an attention mask.

    Precision: when ``dtype`` equals the policy's parameter dtype (and ``own_copy`` is
    False) the engine *shares* the policy module (no copy; generation runs under
    ``inference_mode`` in eval mode and the previous training mode is restored after).
    Otherwise it keeps its own copy whose parameters are cast to ``dtype`` (buffers such
    as rotary ``inv_freq`` stay as they are, as in ``from_pretrained(dtype=...)``), and
    ``update_weights`` / ``set_weights`` copy new weights into it.

    LoRA policy (a peft model): the engine always keeps its own plain copy of the base
    architecture and samples from the merged weights W + (α/r)·BA, recomputed at every
    ``update_weights`` one layer at a time (:func:`rlmap.models.lora.merged_stream`);
    ``set_weights`` takes such merged weights, as a dict or a stream.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_token_id: int,
        eos_token_id: int | Sequence[int],
        dtype: torch.dtype = torch.float32,
        max_batch: int = 256,
        own_copy: bool = False,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch: must be >= 1, got {max_batch}")
        self.pad_token_id = pad_token_id
        self.eos_token_ids = (
            (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id)
        )
        self.dtype = dtype
        self.max_batch = max_batch
        self.shares_policy = parameter_dtype(model) == dtype and not own_copy and not is_lora(model)
        self.model = generative(model) if self.shares_policy else cast_copy(model, dtype)
        self._version = 0
        self.generator: torch.Generator | None = None
        """Sampling's own generator (:meth:`reseed`); None: torch's default one."""
        self.max_len = model_context(model)
        """The model's context in positions (None when its config does not say): the runner
        of episodes never starts a turn that could run past it."""

    def reseed(self, seed: int | None) -> None:
        """Sample from a generator of the engine's own seeded with ``seed`` from now on
        (None: torch's default generator again)."""
        if seed is None:
            self.generator = None
            return
        device = next(self.model.parameters()).device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    @property
    def version(self) -> int:
        """The weight version the next ``generate`` samples from (0 until the first update)."""
        return self._version

    def update_weights(self, model: torch.nn.Module, version: int) -> None:
        """Sample from ``model``'s weights from now on, labelled ``version``.

        Sharing engine: it now shares ``model`` (no copy). Own-copy engine: the weights are
        streamed into the copy one tensor at a time (:func:`~rlmap.models.lora.rollout_stream`:
        a LoRA policy's merged layer by layer, FSDP2 shards gathered one by one), each
        parameter cast to the engine's dtype as it comes (FSDP2: before the gather, so a
        bfloat16 engine gathers half the bytes).
        """
        if self.shares_policy:
            if parameter_dtype(model) != self.dtype:
                raise ValueError(
                    f"update_weights: the engine shares the policy in {self.dtype}, "
                    f"got a model in {parameter_dtype(model)}"
                )
            self.model = generative(model)
            self._version = version
            return
        self.set_weights(rollout_stream(model, dtype=self.dtype), version)

    def set_weights(self, state: Weights, version: int) -> None:
        """Copy weights (Hugging Face names) into the engine's own copy, and label them
        ``version``: a state dict (a snapshot of the learner's), or a stream of (name,
        tensor) pairs copied as they come. Each is cast to the copy's dtype inside ``copy_``
        (a floating buffer keeps its own dtype). A name the copy lacks, one it misses or a
        shape that differs is refused in one line: a dict's names before anything is copied;
        a stream's as they pass, and a stream refused halfway leaves the engine holding no
        version's weights (``version`` -1, so that a worker loads whole ones again)."""
        if self.shares_policy:
            raise ValueError("set_weights: this engine shares the policy; use update_weights")
        own = self.model.state_dict()  # views of the copy's own tensors
        refuse_mismatch(state, own.keys())
        self._version = PARTIAL
        with torch.no_grad():
            for name, tensor in checked(state, own.keys()):
                target = own[name]
                if tensor.shape != target.shape:  # copy_ would broadcast a smaller one silently
                    raise ValueError(
                        f"set_weights: {name} has shape {tuple(tensor.shape)}, "
                        f"the engine's {tuple(target.shape)}"
                    )
                target.copy_(tensor)
        self._version = version

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
        """``n`` samples per prompt (outer list per prompt, in order); see the module docstring.

        A row stops at EOS, at any of ``stop_token_ids`` or after the token that completes
        one of ``stop_strings``, whichever comes first. ``kept_sets`` > 0: every completion
        carries each step's kept set — the ids left finite by the temperature and top-p
        warpers, what :class:`OwnDraw` draws from — when it has at most that many ids.
        """
        check_sampling_args(
            prompts, n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p
        )
        stops = tuple(dict.fromkeys((*self.eos_token_ids, *stop_token_ids)))
        sampled = temperature > 0  # else greedy: no warpers, the argmax
        config = sampling_config(
            max_new_tokens=max_new_tokens, pad_token_id=self.pad_token_id, eos_token_ids=stops
        )
        warpers = sampling_warpers(temperature, top_p)
        # the n samples of a prompt are adjacent, so regrouping is slicing
        flat = [tuple(p) for p in prompts for _ in range(n)]
        completions: list[Completion] = []
        with rollout_mode(self.model):
            for start in range(0, len(flat), self.max_batch):
                chunk = flat[start : start + self.max_batch]
                draw = OwnDraw(self.generator, greedy=not sampled, kept_cap=kept_sets)
                chain: list[LogitsProcessor] = [FiniteScores(), *warpers, draw]
                done = self._generate_chunk(chunk, config, stops, chain, draw, stop_strings)
                completions += [cut_at_stop_strings(c, stop_strings) for c in done]
        return [completions[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generate_chunk(
        self,
        prompts: list[tuple[int, ...]],
        config: GenerationConfig,
        stops: Sequence[int],
        chain: list[LogitsProcessor],
        draw: OwnDraw,
        stop_strings: StopStrings | None = None,
    ) -> list[Completion]:
        """One ``generate`` call on at most ``max_batch`` prompts (rows that complete a stop
        string stop there; the caller cuts them at it)."""
        device = next(self.model.parameters()).device
        input_ids, attention_mask = left_pad(prompts, self.pad_token_id, device)  # (B, P)
        model: Any = self.model  # transformers' typing of generate differs between releases
        ends = StoppingCriteriaList(
            [] if stop_strings is None else [TextStop(stop_strings, input_ids.shape[1])]
        )
        with recording(self.model) as calls:  # MoE routers only; nothing for a dense model
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                logits_processor=chain,
                stopping_criteria=ends,
            )
        tokens = out.sequences[:, input_ids.shape[1] :]  # (B, T)
        logprobs = torch.stack(draw.logprobs, dim=1)  # (B, T): log μ of each drawn token
        lengths, ended = response_lengths(tokens, stops)  # (B,), (B,)
        packed = torch.cat([lengths[:, None], ended[:, None].long(), tokens], dim=1).tolist()
        routes = _sequence_routes(calls, prompts, lengths.tolist(), input_ids.shape[1])
        kept = _sequence_kept(draw.kept, lengths.tolist())
        return [
            Completion(
                prompt_ids=prompt,
                response_ids=tuple(row[2 : 2 + row[0]]),
                logprobs=tuple(lp[: row[0]]),
                stopped=bool(row[1]),
                version=self._version,
                routes=route,
                kept=k,
            )
            for prompt, row, lp, route, k in zip(
                prompts, packed, logprobs.tolist(), routes, kept, strict=True
            )
        ]


def _sequence_routes(
    calls: list[list[Tensor]], prompts: list[tuple[int, ...]], lengths: list[int], width: int
) -> list[Tensor | None]:
    """Each sequence's (len(prompt) + len(response), L, K) routes; Nones for a dense model."""
    if not calls or not calls[0]:
        return [None] * len(prompts)
    full = assemble(calls, len(prompts), width)  # (B, P + S − 1, L, K)
    unrouted = torch.full_like(full[:, :1], NO_ROUTE)  # the last sampled token: never fed back
    full = torch.cat([full, unrouted], dim=1)
    return [
        full[i, width - len(p) : width + n].clone()
        for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]


def _sequence_kept(steps: list[Tensor], lengths: list[int]) -> list[Tensor | None]:
    """Each sequence's (length, K) int32 kept sets from the draw's per-step (B, k_t) ones,
    K trimmed to the sequence's largest set; Nones when no set was asked for."""
    if not steps:
        return [None] * len(lengths)
    width = max(s.shape[1] for s in steps)
    padded = [_pad_ids(s, width) for s in steps]
    full = torch.stack(padded, dim=1).cpu()  # (B, T, K)
    out: list[Tensor | None] = []
    for i, n in enumerate(lengths):
        rows = full[i, :n]
        k = int((rows >= 0).sum(-1).max()) if n else 0
        out.append(rows[:, :k].clone())
    return out


def _pad_ids(ids: Tensor, width: int) -> Tensor:
    """(B, k) ids right-padded with -1 to (B, width)."""
    return torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=-1)


@contextmanager
def rollout_mode(model: Generative) -> Iterator[None]:
    """Eval mode, ``inference_mode`` and the model's shipped generation config hidden.

    ``generate`` would fill the ``None`` fields of our config (min_p, suppress_tokens, ...)
    from ``model.generation_config``; a blank one leaves only the global defaults, which
    ``sampling_config`` overrides. Everything is restored on exit.
    """
    was_training, shipped = model.training, model.generation_config
    model.eval()
    model.generation_config = GenerationConfig()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.generation_config = shipped
        model.train(was_training)


def left_pad(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Prompts right-aligned in a (B, P) long tensor, and the (B, P) long attention mask.

    The mask comes from the lengths, not from ``ids != pad``: a prompt may contain the pad id.
    """
    width = max(len(p) for p in prompts)
    ids = torch.tensor(
        [[pad_token_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long
    )
    lengths = torch.tensor([len(p) for p in prompts])  # (B,)
    mask = torch.arange(width)[None, :] >= (width - lengths)[:, None]  # (B, P)
    return cross(ids, device), cross(mask.long(), device)


def response_lengths(tokens: Tensor, stop_token_ids: Sequence[int]) -> tuple[Tensor, Tensor]:
    """(B,) long response lengths up to and including the first stop token (T if none);
    (B,) bool ended.

    Rows that emitted no stop token ran until ``generate`` stopped, i.e. to max_new_tokens.
    """
    is_eos = torch.isin(tokens, torch.tensor(stop_token_ids, device=tokens.device))  # (B, T)
    ended = is_eos.any(-1)
    first = is_eos.long().argmax(-1)  # first True (0 where none)
    return torch.where(ended, first + 1, tokens.shape[1]), ended


def generative(model: torch.nn.Module) -> Generative:
    """``model`` itself, checked to be a Hugging Face model with ``generate``."""
    if not isinstance(model, GenerationMixin):
        raise TypeError(
            f"model: HFEngine needs a Hugging Face generative model, got {type(model).__name__}"
        )
    return cast("Generative", model)


def model_context(model: torch.nn.Module) -> int | None:
    """The model's context in positions, from its config (None when it does not say)."""
    return context_length(getattr(model, "config", None))


def parameter_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the model's first floating-point parameter."""
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


def cast_copy(model: torch.nn.Module, dtype: torch.dtype) -> Generative:
    """A deep copy whose floating parameters are cast to ``dtype`` (tied weights stay tied);
    of a LoRA policy, the plain base architecture holding the merged weights."""
    own = generative(merged_copy(model) if is_lora(model) else copy.deepcopy(model))
    with torch.no_grad():
        for p in own.parameters():
            if p.is_floating_point():
                p.data = p.data.to(dtype)
    return own


Weights = Mapping[str, Tensor] | Iterable[tuple[str, Tensor]]
"""What an engine's ``set_weights`` takes: a state dict, or a stream of (name, tensor) pairs
(:func:`rlmap.models.lora.rollout_stream`), Hugging Face names either way."""
PARTIAL = -1
"""An engine's version while weights stream in, and after a stream refused halfway: no
published version (those start at 0), so every holder of a version loads its own again."""


def refuse_mismatch(weights: Weights, expected: Collection[str]) -> None:
    """ValueError when ``weights`` is a dict whose names are not exactly ``expected``
    (checked whole, before any is loaded); a stream is checked as it passes (:func:`checked`)."""
    if isinstance(weights, Mapping):
        given, names = set(weights), set(expected)
        if given != names:
            raise _mismatch(sorted(names - given), sorted(given - names))


def checked(weights: Weights, expected: Collection[str]) -> Iterator[tuple[str, Tensor]]:
    """``weights``' pairs, passed on one at a time; a ValueError at the first name that is
    not in ``expected`` or comes twice, and, once the stream ends, when one never came (an
    engine loading by name would keep its old tensor and only log it, if that)."""
    names, seen = set(expected), set[str]()
    for name, tensor in weights.items() if isinstance(weights, Mapping) else weights:
        if name not in names:
            raise _mismatch([], [name])
        if name in seen:
            raise ValueError(f"set_weights: the weights name {name} twice")
        seen.add(name)
        yield name, tensor
    if seen != names:
        raise _mismatch(sorted(names - seen), [])


def _mismatch(missing: list[str], extra: list[str]) -> ValueError:
    return ValueError(
        f"set_weights: the weights do not match the engine's (missing "
        f"{missing[:3]}, unexpected {extra[:3]})"
    )


def check_sampling_args(
    prompts: Sequence[Sequence[int]],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
) -> None:
    """Reject arguments ``generate`` would misread or silently clamp, naming the argument."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: need at least one prompt, each with at least one token")
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature: must be >= 0 (0 is greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p: must be in (0, 1], got {top_p}")
