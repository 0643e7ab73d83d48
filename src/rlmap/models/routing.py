"""Routing replay (R3) on Hugging Face mixture-of-experts models: record, replay, compare.

A transformers MoE layer (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE) routes each token through
a router module whose forward maps the flattened hidden states (N, H) to
``(router_logits (N, E), scores (N, K), indices (N, K))`` — the top-k experts and their
mixing weights. Forward hooks on those routers do the three jobs here:

- **record** (:func:`recording`): the rollout engine keeps each call's indices, one
  tensor per router per forward call (the prompt's prefill, then one token per step);
  :func:`assemble` turns them into each sequence's ``(P + R, L, K)`` routes, ``-1`` where
  nothing was routed (left padding; the last sampled token, never fed back);
- **replay** (:func:`replaying`, ``replay=True``): the learner's router keeps its own
  logits, but its indices become the recorded ones and its scores the training router's
  softmax renormalised over them (:func:`rlmap.correction.r3.replay_router_logits`), so
  the gradient still reaches the router (Ma et al. 2025) while both engines use the
  same experts. A router that does not renormalise its top-k (``norm_topk_prob=False``)
  gets softmax over all experts gathered at the recorded ids instead;
- **compare** (either mode): the share of (token, layer) pairs whose top-k set under the
  learner's own routing differs from the recorded one (``moe/route_mismatch_frac``).

Routes use the learner's layout ``(B, T, L, K)``: the batch's token columns, L routers in
module order, K experts; positions without a record keep the learner's own routing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlmap.correction.r3 import replay_router_logits

NO_ROUTE = -1
"""Expert id of a position nothing was routed for."""


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The model's top-k routers in layer order (modules with ``top_k``, ``num_experts`` and a
    ``weight`` parameter: transformers' ``*TopKRouter`` classes); empty for a dense model."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "top_k")
        and hasattr(m, "num_experts")
        and isinstance(getattr(m, "weight", None), nn.Parameter)
    ]


@contextmanager
def recording(model: nn.Module) -> Iterator[list[list[Tensor]]]:
    """Within the block, every router's indices of every forward call: ``calls[l][c]`` is
    router l's (N_c, K) long tensor of call c."""
    routers = moe_routers(model)
    calls: list[list[Tensor]] = [[] for _ in routers]

    def hook(layer: int) -> Callable[[nn.Module, object, tuple[Tensor, ...]], None]:
        def keep(module: nn.Module, args: object, output: tuple[Tensor, ...]) -> None:
            calls[layer].append(output[2].detach().to("cpu", torch.long))

        return keep

    handles = [r.register_forward_hook(hook(layer)) for layer, r in enumerate(routers)]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def assemble(calls: list[list[Tensor]], batch: int, prompt_len: int) -> Tensor:
    """(B, P + S − 1, L, K) routes of one ``generate`` call from its recorded calls: the
    prefill routed B·P prompt positions (left-padded to P), each of the S − 1 later calls
    one new position per row (the token sampled the step before)."""
    per_layer = []
    for layer_calls in calls:
        first, rest = layer_calls[0], layer_calls[1:]
        k = first.shape[-1]
        parts = [first.view(batch, prompt_len, k)] + [c.view(batch, 1, k) for c in rest]
        per_layer.append(torch.cat(parts, dim=1))
    return torch.stack(per_layer, dim=2)


@dataclass
class RouteStats:
    """Counts of (token, layer) pairs compared, and of those whose top-k sets differed."""

    compared: int = 0
    mismatched: int = 0

    @property
    def mismatch_frac(self) -> float:
        return self.mismatched / self.compared if self.compared else 0.0


@contextmanager
def replaying(
    model: nn.Module, routes_BTLK: Tensor | None, *, replay: bool, stats: RouteStats | None = None
) -> Iterator[None]:
    """Within the block, every forward of ``model`` on a (B, T) input with these routes
    compares (into ``stats``) and, with ``replay``, replays them; nothing without routes."""
    routers = moe_routers(model)
    if routes_BTLK is None or not routers:
        yield
        return
    if routes_BTLK.shape[2] != len(routers):
        raise ValueError(
            f"routes: {routes_BTLK.shape[2]} layers recorded, model has {len(routers)} routers"
        )

    def hook(layer: int) -> Callable[[nn.Module, object, tuple[Tensor, ...]], object]:
        def swap(module: nn.Module, args: object, output: tuple[Tensor, ...]) -> object:
            logits, scores, own = output
            recorded = routes_BTLK[:, :, layer, :].reshape(own.shape).to(own.device)
            known = recorded[:, 0] != NO_ROUTE  # (N,)
            if stats is not None:
                differ = (own.sort(-1).values != recorded.sort(-1).values).any(-1) & known
                stats.compared += int(known.sum())
                stats.mismatched += int(differ.sum())
            if not replay:
                return None
            ids = torch.where(known[:, None], recorded, own)
            return logits, _replayed_scores(module, logits, ids).to(scores.dtype), ids

        return swap

    handles = [r.register_forward_hook(hook(layer)) for layer, r in enumerate(routers)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def check_replayable(model: nn.Module) -> str | None:
    """Why ``model``'s routing cannot be replayed, or None when it can.

    Replay rebuilds a router's mixing weights as a softmax over the chosen experts. That
    is how Qwen2-MoE, Qwen3-MoE, Mixtral and OLMoE weight them; routers that score experts
    otherwise (DeepSeek-V3's sigmoid with a correction bias and a scaling factor, ...) would
    be changed by replay. So each router must give back its own weights when its own choice
    is replayed, on a few random hidden states.
    """
    routers = moe_routers(model)
    if not routers:
        return "the policy has no mixture-of-experts routers to replay"
    g = torch.Generator().manual_seed(0)
    for router in routers:
        weight: Tensor = router.weight  # type: ignore[assignment]
        hidden = torch.randn(8, int(weight.shape[1]), generator=g).to(weight.device, weight.dtype)
        with torch.no_grad():
            logits, scores, ids = router(hidden)
            replayed = _replayed_scores(router, logits, ids).to(scores.dtype)
        if not torch.allclose(replayed, scores, rtol=1e-3, atol=1e-5):
            return (
                f"{type(router).__name__} does not weight its top-k experts by a softmax "
                "over them; replaying its routes would change the model"
            )
    return None


def _replayed_scores(router: nn.Module, logits_NE: Tensor, ids_NK: Tensor) -> Tensor:
    """(N, K) mixing weights of experts ``ids`` under the training router's logits."""
    if getattr(router, "norm_topk_prob", True):  # Mixtral always renormalises
        probs = replay_router_logits(logits_NE.float(), ids_NK).softmax(-1)
    else:
        probs = logits_NE.float().softmax(-1)
    return probs.gather(-1, ids_NK)
