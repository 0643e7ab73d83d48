"""Routing replay (R3) on a real transformers MoE: recorded, laid out, replayed, compared."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlmap.core.batch import RewardStatus
from rlmap.engines.engine import Completion
from rlmap.engines.hf import HFEngine
from rlmap.experiments.train import run_training
from rlmap.learner.logprobs import token_logprobs
from rlmap.models.routing import NO_ROUTE, RouteStats, moe_routers, recording, replaying
from rlmap.recipes import build_config
from rlmap.rollout.episodes import single_turn
from rlmap.rollout.packing import Scored, to_batch
from rlmap.tasks.prompts import encode_prompt

Toy = Callable[..., list[str]]


def _engine(model_dir: Path) -> tuple[torch.nn.Module, HFEngine, list[list[int]]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFEngine(
        model, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    prompts = [encode_prompt(tokenizer, p) for p in ("1+2=", "37+85=")]  # uneven: left padding
    return model, engine, prompts


def test_the_engine_records_the_experts_each_position_was_routed_through(
    tiny_moe_model_dir: Path,
) -> None:
    model, engine, prompts = _engine(tiny_moe_model_dir)
    torch.manual_seed(0)
    groups = engine.generate(prompts, n=2, max_new_tokens=6, temperature=1.0, top_p=1.0)
    layers = len(moe_routers(model))
    assert layers == 2
    for completions in groups:
        for c in completions:
            routes = c.routes
            n = len(c.prompt_ids) + len(c.response_ids)
            assert routes is not None and tuple(routes.shape) == (n, layers, 2)
            # the same weights, one full forward over the sequence, no cache, no padding:
            with torch.no_grad(), recording(model) as calls:
                model(torch.tensor([list(c.prompt_ids + c.response_ids)]))
            for layer in range(layers):
                full = calls[layer][0].sort(-1).values  # (n, K)
                assert torch.equal(routes[:-1, layer].sort(-1).values, full[:-1])
                # the last sampled token was fed back only if a longer row kept generating
                last = routes[-1, layer]
                assert (last == NO_ROUTE).all() or torch.equal(last.sort().values, full[-1])
    longest = max(len(c.response_ids) for cs in groups for c in cs)
    assert any(
        (c.routes[-1] == NO_ROUTE).all()
        for cs in groups
        for c in cs
        if c.routes is not None and len(c.response_ids) == longest
    )


def _completion(prompt: tuple[int, ...], response: tuple[int, ...], seed: int) -> Completion:
    g = torch.Generator().manual_seed(seed)
    routes = torch.stack(
        [torch.randperm(4, generator=g)[:2] for _ in range(2 * (len(prompt) + len(response)))]
    ).view(-1, 2, 2)
    routes[-1] = NO_ROUTE
    return Completion(
        prompt_ids=prompt,
        response_ids=response,
        logprobs=(-0.5,) * len(response),
        stopped=True,
        version=0,
        routes=routes,
    )


def test_the_batch_layout_of_the_routes() -> None:
    a = _completion((1, 5), (6, 7, 2), seed=0)  # P = 2, R = 3
    b = _completion((1, 5, 6, 14), (2,), seed=1)  # P = 4, R = 1
    batch = to_batch(
        [Scored(single_turn(c), 0, 1.0, 1.0, RewardStatus.OK) for c in (a, b)], pad_token_id=0
    )
    routed = batch.routed_experts
    # columns: prompts right-aligned to the longest (4), responses after: T = 4 + 3 = 7
    assert routed is not None and tuple(routed.shape) == (2, 7, 2, 2)
    assert a.routes is not None and b.routes is not None
    assert torch.equal(routed[0, 2:7], a.routes) and (routed[0, :2] == NO_ROUTE).all()
    assert torch.equal(routed[1, 0:5], b.routes) and (routed[1, 5:] == NO_ROUTE).all()
    assert torch.equal(batch.select(torch.tensor([1])).routed_experts, routed[1:])


def test_replay_routes_through_exactly_the_recorded_experts_and_trains_the_router(
    tiny_moe_model_dir: Path,
) -> None:
    model, _, _ = _engine(tiny_moe_model_dir)
    tokens = torch.tensor([[1, 5, 6, 14, 7, 17, 8]])
    g = torch.Generator().manual_seed(3)
    recorded = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(7 * 2)])
    recorded = recorded.view(1, 7, 2, 2)
    recorded[0, -1] = NO_ROUTE  # an unrecorded position keeps the learner's own routing
    stats = RouteStats()
    with replaying(model, recorded, replay=True, stats=stats), recording(model) as seen:
        logprobs, _ = token_logprobs(model, tokens, torch.ones_like(tokens, dtype=torch.bool))
    for layer in range(2):
        used = seen[layer][0]  # what the experts were handed, after the replay hook
        assert torch.equal(used[:-1], recorded[0, :-1, layer])
    assert stats.compared == 2 * 6 and stats.mismatched > 0  # random routes differ
    logprobs[0, 1:].sum().backward()
    router = moe_routers(model)[0]
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_replayed_scores_are_the_router_softmax_renormalised_over_the_recorded_experts(
    tiny_moe_model_dir: Path,
) -> None:
    model, _, _ = _engine(tiny_moe_model_dir)
    router = moe_routers(model)[0]
    hidden = torch.randn(3, router.weight.shape[1], generator=torch.Generator().manual_seed(0))
    recorded = torch.tensor([[0, 3], [1, 2], [2, 0]])
    routes = torch.full((1, 3, 2, 2), NO_ROUTE)
    routes[0, :, 0] = recorded
    with torch.no_grad(), replaying(model, routes, replay=True):
        logits, scores, ids = router(hidden)
    assert torch.equal(ids, recorded)
    for i in range(3):  # p_j = exp(z_j) / Σ_{recorded} exp(z): a reference loop
        z = logits[i].double()
        kept = z[recorded[i]].exp()
        torch.testing.assert_close(scores[i].double(), kept / kept.sum(), rtol=1e-6, atol=1e-7)


def test_the_mismatch_is_zero_for_identical_routes_and_counted_for_others(
    tiny_moe_model_dir: Path,
) -> None:
    model, _, _ = _engine(tiny_moe_model_dir)
    tokens = torch.tensor([[1, 5, 6, 14, 7]])
    with torch.no_grad(), recording(model) as own:
        model(tokens)
    routes = torch.stack([own[layer][0] for layer in range(2)], dim=1)[None]  # (1, 5, 2, 2)
    same = RouteStats()
    with torch.no_grad(), replaying(model, routes.flip(-1), replay=False, stats=same):
        model(tokens)  # the same sets in another order
    assert (same.compared, same.mismatched) == (10, 0)
    other = routes.clone()
    other[0, 2, 1] = torch.tensor([x for x in range(4) if x not in routes[0, 2, 1]][:2])
    counted = RouteStats()
    with torch.no_grad(), replaying(model, other, replay=False, stats=counted):
        model(tokens)
    assert (counted.compared, counted.mismatched) == (10, 1)  # one token, one layer


def _near_tied_moe(model_dir: Path, out: Path) -> Path:
    """The tiny MoE with routers whose top-2 is a near tie at every token: experts 0-2 get
    router rows w + 0.001·mean|w|·noise (w: expert 0's row), expert 3 gets −w. For any h,
    one of the logits ±w·h leads or trails the three near-equal ones, so the top-2 boundary
    always falls inside that near tie and a bfloat16 rollout's rounding moves it often."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for router in moe_routers(model):
            assert isinstance(router.weight, torch.Tensor)
            w = router.weight[0].clone()
            for expert in range(3):
                noise = torch.randn(w.shape, generator=g)
                router.weight[expert] = w + 1e-3 * w.abs().mean() * noise
            router.weight[3] = -w
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


def test_a_moe_run_reports_route_mismatch_and_replays_when_asked(
    tiny_moe_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    # One step each, replay off and on, from the same weights and seed: the rollouts (bf16)
    # are the same, only the learner differs. moe/route_mismatch_frac counts the learner's
    # own top-2 against the rollout's, before any replay, so it is well above 0 both ways
    # (a count taken after the replay would be 0 with it on). Replay shows in κ = π_old / μ:
    # π_old through the rollout's experts is left with the numerics' gap only.
    model_dir = _near_tied_moe(tiny_moe_model_dir, tmp_path / "near-tied")
    step: dict[bool, dict[str, float]] = {}
    for replay in (False, True):
        flag = f"behaviour.routing_replay={str(replay).lower()}"
        cfg = build_config(
            "grpo", None, [*toy(model_dir, steps=1), "system.rollout_dtype=bfloat16", flag]
        )
        run = tmp_path / f"replay-{replay}"
        run_training(cfg, run)
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        (step[replay],) = rows[1:]
    off, on = step[False], step[True]
    assert off["moe/route_mismatch_frac"] > 0.2 and on["moe/route_mismatch_frac"] > 0.2
    # measured: mean |log κ| 0.0019 off, 0.0005 on (the bf16 gap of a dense model)
    kappa = "ratio/kappa/mean_abs_log"
    assert on[kappa] < 0.5 * off[kappa], (on[kappa], off[kappa])


def test_the_learner_replays_the_recorded_experts_in_its_update(
    tiny_moe_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A spy inside the learner's own replay context: what the experts are handed during
    # update_policy must be the batch's recorded routes (random here), only with replay on.
    from contextlib import contextmanager

    from rlmap.correction import BehaviourParams, KLParams
    from rlmap.learner import policy as learner
    from rlmap.learner.policy import UpdateSettings, update_policy
    from rlmap.learner.update_loop import Schedule
    from rlmap.reduction import ReductionParams

    model, engine, prompts = _engine(tiny_moe_model_dir)
    torch.manual_seed(0)
    groups = engine.generate(prompts, n=2, max_new_tokens=4, temperature=1.0, top_p=1.0)
    batch = to_batch(
        [
            Scored(single_turn(c), g, 1.0 * (k % 2), 1.0 * (k % 2), RewardStatus.OK)
            for g, cs in enumerate(groups)
            for k, c in enumerate(cs)
        ],
        pad_token_id=0,
    )
    assert batch.routed_experts is not None
    known = batch.routed_experts != NO_ROUTE
    g = torch.Generator().manual_seed(5)
    shuffled = torch.stack(
        [torch.randperm(4, generator=g)[:2] for _ in range(known[..., 0].numel())]
    )
    random_routes = torch.where(known, shuffled.view(batch.routed_experts.shape), NO_ROUTE)
    batch = batch.replace(routed_experts=random_routes)
    real, seen = learner.replaying, []

    @contextmanager
    def spy(policy, routes, *, replay, stats=None):  # type: ignore[no-untyped-def]
        with real(policy, routes, replay=replay, stats=stats), recording(policy) as calls:
            yield
        seen.append((routes, calls))

    monkeypatch.setattr(learner, "replaying", spy)
    for replay in (True, False):
        seen.clear()
        s = UpdateSettings(
            behaviour=BehaviourParams(routing_replay=replay),
            kl=KLParams(),
            reduction=ReductionParams(),
            schedule=Schedule(epochs=1, minibatches=1, micro_batch_size=3, max_grad_norm=1.0),
            temperature=1.0,
        )
        sgd = torch.optim.SGD(model.parameters(), lr=0.0)
        update_policy(
            model,
            sgd,
            torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0),
            batch,
            torch.randn(batch.tokens.shape),
            s,
            learner_version=0,
            generator=torch.Generator(),
        )
        assert len(seen) == 2  # micro-batches of 3 and 1 rows
        for routes, calls in seen:
            for layer in range(2):
                used = calls[layer][0].view(*routes.shape[:2], 2)
                rec = routes[:, :, layer]
                mask = rec[..., 0] != NO_ROUTE  # the micro-batch's own recorded positions
                same = (used.sort(-1).values == rec.sort(-1).values).all(-1)[mask]
                assert bool(same.all()) == replay  # random routes: the own ones differ


def test_replay_is_refused_for_a_model_it_would_change(
    tiny_model_dir: Path, tiny_moe_model_dir: Path
) -> None:
    from rlmap.models.routing import check_replayable

    class SigmoidRouter(torch.nn.Module):  # DeepSeek-V3 style: sigmoid scores, not a softmax
        def __init__(self) -> None:
            super().__init__()
            self.top_k, self.num_experts = 2, 4
            self.weight = torch.nn.Parameter(torch.randn(4, 8))

        def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
            logits = hidden @ self.weight.T
            scores, ids = torch.topk(torch.sigmoid(logits), 2, dim=-1)
            return logits, scores * 2.5, ids

    moe = AutoModelForCausalLM.from_pretrained(tiny_moe_model_dir)
    assert check_replayable(moe) is None
    dense = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert check_replayable(dense) == "the policy has no mixture-of-experts routers to replay"
    problem = check_replayable(torch.nn.Sequential(SigmoidRouter()))
    assert problem is not None and "SigmoidRouter does not weight its top-k" in problem


def test_a_dense_policy_with_routing_replay_is_a_one_line_config_error(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy
) -> None:
    from rlmap.core.errors import ConfigError

    cfg = build_config("grpo", None, [*toy(tiny_model_dir), "behaviour.routing_replay=true"])
    with pytest.raises(ConfigError, match=r"^behaviour.routing_replay: the policy has no"):
        run_training(cfg, tmp_path / "run")


def test_each_position_keeps_the_routes_of_the_call_that_first_routed_it() -> None:
    from rlmap.rollout.episodes import earliest_routes

    # turn 0's call routed positions 0-2 (its last token, 3, was never fed back); turn 1's
    # call re-routed 0-3 (newer weights under partial rollout) and routed 4-5 anew
    first = torch.tensor([[[1, 2]], [[1, 3]], [[0, 2]], [[NO_ROUTE, NO_ROUTE]]])  # (4, L=1, K)
    second = torch.tensor([[[3, 0]], [[3, 0]], [[3, 0]], [[2, 1]], [[1, 0]], [[0, 3]]])
    merged = earliest_routes(first, second)
    assert merged is not None
    assert merged[:3].tolist() == first[:3].tolist()  # kept from the call that sampled them
    assert merged[3:].tolist() == second[3:].tolist()  # first routed by the later call
    assert earliest_routes(None, second) is second and earliest_routes(first, None) is None
