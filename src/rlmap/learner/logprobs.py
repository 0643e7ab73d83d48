"""Token log-probabilities and entropies from a training-engine forward pass.

``logprobs[:, t] = log π(tokens[:, t] | tokens[:, <t])`` on the learner's side,
aligned with the batch record's columns (column 0 has no context and gets 0).
Logits are divided by the sampling temperature so that π_θ and μ describe the
same distribution. Top-p is applied only through a recorded kept set (``kept_BTK``,
``behaviour.replay_sampling_set``): the log-prob is then renormalised over the set the
engine drew from, K ∪ {y}, as μ's is (docs/formulas.md §4.1); without one, with
``top_p < 1`` the gap, log S_μ(K), shows up in κ.

Left padding: position ids are counted over real tokens only, as Hugging Face
``generate`` counts them, so that the learner and the rollout engine see the
same positions (otherwise κ ≠ 1 for a reason that is not numerics).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from rlmap.core.batch import Batch, cross
from rlmap.core.device import model_device
from rlmap.core.ops import at_least_float32
from rlmap.models.lora import plain_model
from rlmap.models.routing import replaying


def attention_of(batch: Batch) -> Tensor:
    """(B, T) bool: the batch's attention mask, or all True when it has none."""
    if batch.attention_mask is not None:
        return batch.attention_mask
    return torch.ones_like(batch.action_mask)


def position_ids(attention_BT: Tensor) -> Tensor:
    """(B, T) positions counted over real tokens; padding gets 0 (it is masked anyway)."""
    return (attention_BT.long().cumsum(-1) - 1).clamp(min=0)


LOGPROB_CHUNK = 256
"""Token positions per LM-head chunk: the logits held at once are chunk × V, not B·T·V (at
V = 151,936, 256 positions are 156 MB in float32)."""


def token_logprobs(
    model: nn.Module,
    tokens_BT: Tensor,
    attention_BT: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk: int = LOGPROB_CHUNK,
    kept_BTK: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """(log π of each token (B, T), its entropy (B, T) or None), column 0 set to 0.

    log π(x) = z_x − logsumexp(z) with z = logits / temperature; with ``kept_BTK`` (the
    batch's ``sampling_set``) a token whose set was recorded gets log π̃(x) = z_x −
    logsumexp_{v ∈ K ∪ {x}} z_v (:func:`kept_only`). Entropy is a detached diagnostic over
    the full vocabulary whatever the set: H = logsumexp(z) − Σ softmax(z)·z. The transformer
    runs once; its final hidden states go through the LM head ``chunk`` positions at a time,
    forward and backward (:class:`ChunkedLogprobs`: the chunk's logits are recomputed in
    backward), so no (B, T, V) tensor ever exists — at Qwen2.5's V = 151,936, T = 1,024 and
    8 rows the full logits alone would be 4.98 GB in float32. Models whose logits are not a
    plain linear map of the hidden states (logit soft-capping or scaling) take the full path.
    """
    model = plain_model(model)  # a LoRA policy: the transformers model carrying its adapters
    head = _plain_lm_head(model)
    if head is None:
        return _full_logprobs(model, tokens_BT, attention_BT, temperature, with_entropy, kept_BTK)
    hidden = model.base_model(  # type: ignore[operator]
        input_ids=tokens_BT,
        attention_mask=attention_BT,
        position_ids=position_ids(attention_BT),
        use_cache=False,  # no KV cache: nothing reads it, and checkpointing refuses one
    ).last_hidden_state[:, :-1]  # (B, T-1, H) predicts tokens 1..T-1
    b, t1, h = hidden.shape
    kept_NK = None if kept_BTK is None else kept_BTK[:, 1:].reshape(b * t1, -1)
    logprobs_N, entropy_N = ChunkedLogprobs.apply(
        hidden.reshape(b * t1, h),
        head.weight,
        head.bias,
        tokens_BT[:, 1:].reshape(-1),
        1.0 / temperature,
        chunk,
        with_entropy,
        kept_NK,
    )
    pad = hidden.new_zeros((b, 1), dtype=torch.float32)
    logprobs = torch.cat([pad, logprobs_N.view(b, t1)], dim=1)
    entropy = torch.cat([pad, entropy_N.view(b, t1)], dim=1) if with_entropy else None
    return logprobs, entropy


class Scorer(nn.Module):
    """:func:`token_logprobs` of ``model`` as a module's forward.

    A data-parallel wrapper (DDP, FSDP2) hooks its communication into its module's forward
    and backward; the chunked path calls the trunk and the LM head directly, so the learner
    wraps this instead of the model, and the whole computation is the wrapped forward.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        tokens_BT: Tensor,
        attention_BT: Tensor,
        temperature: float = 1.0,
        with_entropy: bool = False,
        kept_BTK: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        return token_logprobs(
            self.model,
            tokens_BT,
            attention_BT,
            temperature=temperature,
            with_entropy=with_entropy,
            kept_BTK=kept_BTK,
        )


def scored(
    model: nn.Module,
    tokens_BT: Tensor,
    attention_BT: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    kept_BTK: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`token_logprobs`, through the learner's wrapper when ``model`` is one (a
    :class:`Scorer`, or DDP around one), else on the plain model."""
    inner = getattr(model, "module", model)
    if isinstance(inner, Scorer):
        out: tuple[Tensor, Tensor | None] = model(
            tokens_BT, attention_BT, temperature, with_entropy, kept_BTK
        )
        return out
    return token_logprobs(
        model,
        tokens_BT,
        attention_BT,
        temperature=temperature,
        with_entropy=with_entropy,
        kept_BTK=kept_BTK,
    )


def kept_only(z: Tensor, kept: Tensor | None, targets: Tensor) -> Tensor:
    """``z`` (..., V) with −inf outside K ∪ {y} on every row that carries a kept set, in place.

    ``kept`` (..., K): the row's kept ids, -1 padded; a row of -1 (no set recorded) and
    every row when ``kept`` is None stay whole (the full vocabulary). ``targets`` (...): y,
    the sampled token, kept even if the set lacks it — so log π̃(y) is finite and a set of
    {y} alone gives log π̃(y) = 0. Then logsumexp(z) over the row is logsumexp over K ∪ {y}
    (slime ``_build_topp_keep_mask``, slime/backends/megatron_utils/loss.py: rows without a
    recorded nucleus stay unmasked).
    """
    if kept is None:
        return z
    ids = kept.long()
    recorded = (ids >= 0).any(-1, keepdim=True)  # (..., 1)
    ids = torch.where(ids >= 0, ids, targets.unsqueeze(-1))  # padding points at y, kept anyway
    keep = torch.zeros_like(z, dtype=torch.bool).scatter_(-1, ids, True)
    keep.scatter_(-1, targets.unsqueeze(-1), True)
    return z.masked_fill_(recorded & ~keep, -math.inf)


def _plain_lm_head(model: nn.Module) -> nn.Linear | None:
    """The model's LM head when logits = head(base_model(...).last_hidden_state), else None."""
    config = getattr(model, "config", None)
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if config is None or not isinstance(head, nn.Linear) or not hasattr(model, "base_model"):
        return None
    if model.base_model is model:  # a bare trunk: no head of its own
        return None
    scaled = any(
        getattr(config, k, None) not in (None, 1, 1.0)
        for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")
    )
    return None if scaled else head


class ChunkedLogprobs(torch.autograd.Function):
    """log π(target) = z_target − logsumexp(z), z = (h Wᵀ + b) / T, chunk by chunk.

    With ``kept_NK`` each chunk's z is set to −inf outside K ∪ {target} on the rows that
    carry a kept set (:func:`kept_only`), in forward and in backward's recomputation, so
    softmax and ∂z below are the kept set's (0 outside it); the entropy is taken before.

    Forward keeps only (N,) results and each row's logsumexp; backward recomputes each
    chunk's logits and applies ∂ log π / ∂z = onehot(target) − softmax(z):
    ∂h = (g ⊙ (onehot − p)) W / T, ∂W = (g ⊙ (onehot − p))ᵀ h / T, ∂b = Σ g ⊙ (onehot − p) / T.
    Peak memory is one or two chunk × V float32 tensors, plus a float32 V × H accumulator
    for ∂W when the head is trained (none for a frozen head).

    Precision: the product h Wᵀ runs in the model's dtype, or in the autocast dtype when the
    caller runs under autocast (as the full path's LM head would); its logits are upcast to
    float32 before any reduction, so logsumexp, softmax and the ∂z arithmetic are float32
    whatever autocast does. Backward replays the forward's autocast state (what
    ``torch.amp.custom_bwd`` does, for whichever device the tensors are on): its recomputed
    logits are the forward's, so p = exp(z − lse) sums to 1 — recomputed in float32 against
    a bfloat16 forward's lse it would not, and every ∂z would be off.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden_NH: Tensor,
        weight_VH: Tensor,
        bias_V: Tensor | None,
        targets_N: Tensor,
        inv_t: float,
        chunk: int,
        with_entropy: bool,
        kept_NK: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        n, dtype = hidden_NH.shape[0], torch.promote_types(hidden_NH.dtype, torch.float32)
        logprobs = hidden_NH.new_empty(n, dtype=dtype)
        lse_all = hidden_NH.new_empty(n, dtype=dtype)
        entropy = hidden_NH.new_zeros(n if with_entropy else 0, dtype=dtype)
        for s in range(0, n, chunk):
            rows = slice(s, s + chunk)
            z = _chunk_logits(hidden_NH[rows], weight_VH, bias_V, inv_t)  # (c, V)
            lse = torch.logsumexp(z, dim=-1)
            if with_entropy:  # the full vocabulary's, before any kept-set mask
                entropy[rows] = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
            if kept_NK is not None:
                lse = torch.logsumexp(kept_only(z, kept_NK[rows], targets_N[rows]), dim=-1)
            logprobs[rows] = z.gather(-1, targets_N[rows, None])[:, 0] - lse
            lse_all[rows] = lse
        ctx.save_for_backward(hidden_NH, weight_VH, bias_V, targets_N, lse_all, kept_NK)
        ctx.inv_t, ctx.chunk = inv_t, chunk
        device = hidden_NH.device.type
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx: Any, g_N: Tensor, _: Tensor) -> tuple[Tensor | None, ...]:
        device, enabled, dtype = ctx.autocast
        with torch.autocast(device_type=device, dtype=dtype, enabled=enabled):
            return ChunkedLogprobs._backward(ctx, g_N)

    @staticmethod
    def _backward(ctx: Any, g_N: Tensor) -> tuple[Tensor | None, ...]:
        hidden_NH, weight_VH, bias_V, targets_N, lse_all, kept_NK = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]  # a frozen head (LoRA): no ∂W
        grad_h = torch.empty_like(hidden_NH) if need_h else None
        wide = torch.promote_types(weight_VH.dtype, torch.float32)
        grad_w = torch.zeros_like(weight_VH, dtype=wide) if need_w else None
        grad_b = torch.zeros_like(bias_V, dtype=wide) if need_b and bias_V is not None else None
        for s in range(0, hidden_NH.shape[0], ctx.chunk):
            h = hidden_NH[s : s + ctx.chunk]
            g = at_least_float32(g_N[s : s + ctx.chunk])
            # one (c, V) buffer, in place: z → p = exp(z − lse) → −g·p → + g·onehot → · 1/T
            dz = _chunk_logits(h, weight_VH, bias_V, ctx.inv_t)
            if kept_NK is not None:  # p = 0 outside K ∪ {target}
                rows = slice(s, s + ctx.chunk)
                kept_only(dz, kept_NK[rows], targets_N[rows])
            dz.sub_(lse_all[s : s + ctx.chunk, None]).exp_().mul_(-g[:, None])
            dz.scatter_add_(-1, targets_N[s : s + ctx.chunk, None], g[:, None])
            if ctx.inv_t != 1.0:
                dz.mul_(ctx.inv_t)  # ∂/∂(h Wᵀ + b)
            if grad_h is not None:
                grad_h[s : s + ctx.chunk] = (dz.to(weight_VH.dtype) @ weight_VH).to(grad_h.dtype)
            if grad_w is not None:
                grad_w += dz.t() @ at_least_float32(h)
            if grad_b is not None:
                grad_b += dz.sum(0)
        grad_weight = None if grad_w is None else grad_w.to(weight_VH.dtype)
        grad_bias = None if grad_b is None else grad_b.to(bias_V.dtype)
        return grad_h, grad_weight, grad_bias, None, None, None, None, None


def _chunk_logits(h: Tensor, weight_VH: Tensor, bias_V: Tensor | None, inv_t: float) -> Tensor:
    """(c, V) logits / T in at least float32: a new tensor, which the caller may overwrite."""
    z = at_least_float32(nn.functional.linear(h, weight_VH, bias_V))
    return z.mul_(inv_t) if inv_t != 1.0 else z


def _full_logprobs(
    model: nn.Module,
    tokens_BT: Tensor,
    attention_BT: Tensor,
    temperature: float,
    with_entropy: bool,
    kept_BTK: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The reference path: the model's full (B, T, V) logits, then one gather, one logsumexp
    (over each recorded kept set, :func:`kept_only`, for the log-probs; never the entropy)."""
    logits = model(
        input_ids=tokens_BT,
        attention_mask=attention_BT,
        position_ids=position_ids(attention_BT),
        use_cache=False,
    ).logits[:, :-1]  # (B, T-1, V) predicts tokens 1..T-1
    z = logits.float() / temperature if temperature != 1.0 else logits.float()
    targets = tokens_BT[:, 1:]
    full = torch.logsumexp(z, dim=-1)  # (B, T-1)
    lse = full
    if kept_BTK is not None:  # out of place: z stays whole for the entropy
        lse = torch.logsumexp(kept_only(z.clone(), kept_BTK[:, 1:], targets), dim=-1)
    chosen = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    pad = tokens_BT.new_zeros((tokens_BT.shape[0], 1), dtype=z.dtype)
    logprobs = torch.cat([pad, chosen - lse], dim=1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            h = full - (torch.softmax(z, dim=-1) * z).sum(-1)
            entropy = torch.cat([pad, h], dim=1)
    return logprobs, entropy


@torch.no_grad()
def batched_logprobs(
    model: nn.Module,
    tokens_BT: Tensor,
    attention_BT: Tensor,
    *,
    temperature: float,
    micro_batch_size: int,
    routes_BTLK: Tensor | None = None,
    passes: int = 0,
    kept_BTK: Tensor | None = None,
) -> Tensor:
    """(B, T) detached log-probs in micro-batches (π_old recomputation, π_ref); with
    ``routes_BTLK`` a mixture-of-experts model replays the rollout's routing (R3), with
    ``kept_BTK`` each token is scored over its recorded kept set (top-p replay). At least
    ``passes`` forward passes run (extra ones on row 0, discarded: a sharded model's ranks
    must all run as many; B may then be 0, given a row to run on)."""
    was_training = model.training
    model.eval()
    device = model_device(model)  # each micro-batch crosses to it; the results come back once
    parts = []
    try:
        starts = list(range(0, tokens_BT.shape[0], micro_batch_size))
        for _ in range(passes - len(starts)):
            scored(
                model,
                cross(tokens_BT[:1], device),
                cross(attention_BT[:1], device),
                temperature=temperature,
            )
        for i in starts:
            rows = slice(i, i + micro_batch_size)
            routes = None if routes_BTLK is None else cross(routes_BTLK[rows], device)
            kept = None if kept_BTK is None else cross(kept_BTK[rows], device)
            with replaying(model, routes, replay=True):
                parts.append(
                    scored(
                        model,
                        cross(tokens_BT[rows], device),
                        cross(attention_BT[rows], device),
                        temperature=temperature,
                        kept_BTK=kept,
                    )[0]
                )
    finally:
        model.train(was_training)
    if not parts:
        return tokens_BT.new_zeros(tokens_BT.shape, dtype=torch.float32)
    return torch.cat(parts).to(tokens_BT.device)
