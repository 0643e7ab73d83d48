"""M2PO, the off-policy sequence mask and the importance-weighted KL (docs/formulas.md §4, §6).

Each is tested three ways: hand cases (the research note's fixtures F1/F2, re-derived in the
comments), a plain reference loop over i, t, and properties. Where an anchor's code can be
imported (TRL here; AReaL from a scratch environment) it is compared on the same tensors.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from torch import Tensor

from rlmap.core.batch import make_batch
from rlmap.core.errors import ConfigError
from rlmap.correction import (
    BehaviourParams,
    KLParams,
    PolicyTerms,
    check_behaviour,
    corrections,
    k3,
    kl_estimators,
    policy_loss,
)
from rlmap.correction.kl import importance_weighted
from rlmap.correction.weights import m2po_keep, minibatch_keep, opsm_keep

LN = math.log

# F2 (decoupled, first step): κ = p_old/p_μ per token, two rows of three action tokens.
F2_KAPPA = [[0.62 / 0.50, 0.45 / 0.20, 0.012 / 0.002], [0.25 / 0.50, 0.28 / 0.30, 0.90 / 0.60]]


def f2_log_kappa() -> Tensor:
    return torch.tensor([[LN(k) for k in row] for row in F2_KAPPA])


# ---------------------------------------------------------------- M2PO


def test_m2po_hand_case_f2() -> None:
    # log κ = 0.215111, 0.810930, 1.791759 | −0.693147, −0.068993, 0.405465
    # M2 = (log κ)² = 0.046273, 0.657608, 3.210402 | 0.480453, 0.004760, 0.164402
    # descending: 3.210402 (1,3), 0.657608 (1,2), 0.480453 (2,1), 0.164402 (2,3),
    #             0.046273 (1,1), 0.004760 (2,2); Σ = 4.563898
    # mean of the rest after dropping k of them:
    #   k = 0: 4.563898/6 = 0.76065    k = 1: 1.353496/5 = 0.27070    k = 2: 0.695888/4 = 0.17397
    #   k = 3: 0.215435/3 = 0.07181    k = 4: 0.051033/2 = 0.02552
    # τ = 0.04: the first k with mean ≤ τ is 4 → keep (1,1) and (2,2) only (4 of 6 dropped)
    # τ = 0.2:  k = 2 (0.17397 ≤ 0.2) → drop (1,3), (1,2)
    # τ = 0.77: k = 0 (0.76065 ≤ 0.77) → keep all
    log_k, mask = f2_log_kappa(), torch.ones(2, 3, dtype=torch.bool)
    got = {tau: m2po_keep(log_k, mask, threshold=tau).tolist() for tau in (0.04, 0.2, 0.77)}
    assert got[0.04] == [[True, False, False], [False, True, False]]
    assert got[0.2] == [[True, False, False], [True, True, True]]
    assert got[0.77] == [[True] * 3, [True] * 3]


def test_m2po_keeps_everything_at_a_second_moment_equal_to_tau() -> None:
    # M2 = 2² = 4 and 0.5² = 0.25, mean (4 + 0.25)/2 = 2.125 = τ (exact in binary): "≤ τ"
    # keeps both (AReaL's "< τ" would drop the 4)
    keep = m2po_keep(
        torch.tensor([[2.0, 0.5]]), torch.ones(1, 2, dtype=torch.bool), threshold=2.125
    )
    assert keep.tolist() == [[True, True]]


def test_m2po_drops_everything_when_even_the_smallest_is_above_tau() -> None:
    # smallest M2 = 0.004760 > τ = 1e-3: no non-empty rest has mean ≤ τ. AReaL keeps the
    # single smallest token; rlmap drops all (its denominator stays, so the loss is 0, not 0/0)
    keep = m2po_keep(f2_log_kappa(), torch.ones(2, 3, dtype=torch.bool), threshold=1e-3)
    assert not keep.any()


def m2po_reference(log_kappa: Tensor, mask: Tensor, tau: float) -> list[list[bool]]:
    """Plain loops: drop the largest M2 one at a time until the rest's mean is ≤ τ; ties at
    the cut go together."""
    b, t = mask.shape
    values = sorted(
        (float(log_kappa[i, j]) ** 2 for i in range(b) for j in range(t) if mask[i, j]),
        reverse=True,
    )
    k = 0
    while k < len(values) and sum(values[k:]) / len(values[k:]) > tau:
        k += 1
    cut = values[k - 1] if k > 0 else math.inf
    return [
        [bool(mask[i, j]) and float(log_kappa[i, j]) ** 2 < cut for j in range(t)] for i in range(b)
    ]


@pytest.mark.parametrize("seed", range(6))
def test_m2po_reference_loop(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    log_k = torch.randn(5, 7, generator=g, dtype=torch.float64) * 0.5
    mask = torch.rand(5, 7, generator=g) > 0.3
    for tau in (0.01, 0.05, 0.2, 1.0):
        assert m2po_keep(log_k, mask, threshold=tau).tolist() == m2po_reference(log_k, mask, tau)


@pytest.mark.parametrize("seed", range(4))
def test_m2po_properties(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    log_k = torch.randn(6, 8, generator=g) * 0.4
    mask = torch.rand(6, 8, generator=g) > 0.25
    m2 = log_k.square()
    second_moment = float(m2[mask].mean())
    # already within the trust region: nothing is dropped
    assert torch.equal(m2po_keep(log_k, mask, threshold=second_moment + 1e-6), mask)
    previous = torch.zeros_like(mask)
    for tau in (0.005, 0.02, 0.08, 0.3):
        keep = m2po_keep(log_k, mask, threshold=tau)
        assert not (keep & ~mask).any()  # never keeps a token off the action mask
        if keep.any():
            assert float(m2[keep].mean()) <= tau  # what is kept is inside the region
        assert not (previous & ~keep).any()  # a larger τ keeps a superset
        previous = keep
        # the kept tokens are exactly those below a cut: every dropped M2 ≥ every kept M2
        dropped = mask & ~keep
        if keep.any() and dropped.any():
            assert float(m2[dropped].min()) > float(m2[keep].max())
        # the order of rows and of tokens does not matter
        rows, cols = torch.randperm(6, generator=g), torch.randperm(8, generator=g)
        moved = m2po_keep(log_k[rows][:, cols], mask[rows][:, cols], threshold=tau)
        assert torch.equal(moved, keep[rows][:, cols])


def test_m2po_ties_at_the_cut_are_dropped_together() -> None:
    # M2 = 1, 1, 0.01, 0.01 (log κ = ±1, ±0.1); τ = 0.3: dropping one 1 leaves
    # (1 + 0.02)/3 = 0.34 > 0.3, dropping both leaves 0.01 ≤ 0.3 → both 1s go, whichever row
    # they sit in; with three at 1 (τ = 0.3): (2 + 0.01)/3 = 0.67, (1 + 0.01)/2 = 0.505,
    # 0.01/1 → all three go
    log_k = torch.tensor([[1.0, 0.1], [-1.0, -0.1]])
    keep = m2po_keep(log_k, torch.ones(2, 2, dtype=torch.bool), threshold=0.3)
    assert keep.tolist() == [[False, True], [False, True]]
    log_k = torch.tensor([[1.0, -1.0], [1.0, 0.1]])
    keep = m2po_keep(log_k, torch.ones(2, 2, dtype=torch.bool), threshold=0.3)
    assert keep.tolist() == [[False, False], [False, True]]


def test_m2po_per_micro_batch_selection_would_differ() -> None:
    # Why rlmap selects over the whole mini-batch: AReaL's per-micro-batch selection gives
    # another mask for the same tokens, so its loss changes with micro_batch_size.
    g = torch.Generator().manual_seed(0)
    log_k = torch.randn(8, 6, generator=g) * torch.linspace(0.1, 1.0, 8).unsqueeze(-1)
    mask = torch.ones(8, 6, dtype=torch.bool)
    whole = m2po_keep(log_k, mask, threshold=0.1)
    pieces = torch.cat(
        [m2po_keep(log_k[i : i + 2], mask[i : i + 2], threshold=0.1) for i in range(0, 8, 2)]
    )
    assert not torch.equal(whole, pieces)


def test_m2po_entry_weight_is_one_and_reports_the_selection() -> None:
    # The learner applies the mask to the pinned weights; policy_loss must not apply it again
    # per micro-batch. Its figures: mean M2 = 4.563898/6 = 0.76065; 4 of 6 dropped at 0.04
    log_k = f2_log_kappa()
    old = torch.full((2, 3), -1.0)
    terms = PolicyTerms(old.clone(), old, old - log_k, torch.ones(2, 3), torch.ones(2, 3).bool())
    w, diag = corrections.get("m2po").fn(terms, BehaviourParams(m2po_threshold=0.04))
    assert torch.equal(w, torch.ones(2, 3))
    assert diag["ratio/kappa/m2"].item() == pytest.approx(0.76065, abs=1e-5)
    assert diag["ratio/kappa/m2po_masked_frac"].item() == pytest.approx(4 / 6)


def test_minibatch_keep_reads_kappa_of_the_batch() -> None:
    log_k = f2_log_kappa()
    mask = torch.ones(2, 3, dtype=torch.bool)
    behaviour = torch.full((2, 3), -1.0)
    batch = make_batch(
        mask, torch.ones(2), behavior_logprobs=behaviour, old_logprobs=behaviour + log_k
    )
    p = BehaviourParams(corrections=("m2po",), m2po_threshold=0.04)
    assert minibatch_keep(batch, p).tolist() == [[True, False, False], [False, True, False]]
    assert minibatch_keep(batch, BehaviourParams(corrections=("icepop",))).all()
    with pytest.raises(ConfigError, match=r"behaviour\.corrections: .*m2po.*old_logprobs"):
        minibatch_keep(batch.replace(old_logprobs=None), p)


def test_m2po_comparison_with_areal() -> None:
    # AReaL's shipped selection on the same tensors (needs AReaL, not a dependency of rlmap;
    # see tests/correction's report). It tests "< τ" and keeps one token when nothing fits:
    # continuous values with the smallest M2 far below τ avoid both differences.
    # Importing its actor module pulls 17 more packages (wandb, swanlab, flask, hydra …,
    # 112 MB), too much for `make test`'s anchors, so CI skips it. Run by hand (passed with
    # AReaL 1.0.4 on 2026-12-04):
    #   pip install --no-deps --target /tmp/areal areal==1.0.4 colorlog flask werkzeug \
    #     blinker itsdangerous torchdata hydra-core antlr4-python3-runtime==4.9.3 swanlab \
    #     pyroaring watchdog pyecharts simplejson prettytable trackio gradio_client wandb \
    #     platformdirs tensorboardX
    #   PYTHONPATH=/tmp/areal:.venv/anchors pytest tests/correction -k areal
    actor = pytest.importorskip("areal.trainer.ppo.actor")
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        log_k = torch.randn(4, 9, generator=g) * 0.5
        mask = torch.rand(4, 9, generator=g) > 0.2
        mu = -torch.rand(4, 9, generator=g) * 3
        old = mu + log_k
        for tau in (0.02, 0.1, 0.4):
            theirs = actor._apply_m2po_masking(mu, old, mask, tau)
            ours = m2po_keep(old - mu, mask, threshold=tau)
            assert torch.equal(ours, theirs)


# ---------------------------------------------------------------- learner: M2PO per mini-batch


def _learner_run(
    model_dir: Path, micro: int, minibatches: int, corrections_: tuple[str, ...]
) -> tuple[Tensor, dict[str, float]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlmap.core.batch import RewardStatus
    from rlmap.engines.hf import HFEngine
    from rlmap.learner.policy import UpdateSettings, prepare_batch, update_policy
    from rlmap.learner.update_loop import Schedule
    from rlmap.reduction import ReductionParams
    from rlmap.rollout.episodes import single_turn
    from rlmap.rollout.packing import Scored, to_batch
    from rlmap.tasks.prompts import encode_prompt

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFEngine(
        model, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    prompts = [encode_prompt(tokenizer, p) for p in ("1+2=", "37+85=", "9+9=")]
    torch.manual_seed(0)
    groups = engine.generate(prompts, n=4, max_new_tokens=6, temperature=1.0, top_p=1.0)
    scored = [
        Scored(single_turn(c), g, float(i % 2), float(i % 2), RewardStatus.OK)
        for g, group in enumerate(groups)
        for i, c in enumerate(group)
    ]
    batch = to_batch(scored, pad_token_id=tokenizer.pad_token_id)
    noise = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(3))
    stale = batch.replace(behavior_logprobs=batch.behavior_logprobs + 0.4 * noise)  # μ ≠ π_old
    advantages = torch.randn(batch.tokens.shape, generator=torch.Generator().manual_seed(2))
    policy = copy.deepcopy(model).double()
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    s = UpdateSettings(
        behaviour=BehaviourParams(corrections=corrections_, m2po_threshold=0.05),
        kl=KLParams(),
        reduction=ReductionParams(name="token_mean"),
        schedule=Schedule(
            epochs=1, minibatches=minibatches, micro_batch_size=micro, max_grad_norm=1e9
        ),
        temperature=1.0,
    )
    prepared, timings = prepare_batch(stale, policy, None, s)
    if corrections_:  # one optimiser step in decoupled mode, yet π_old is recomputed for M2PO
        assert prepared.old_logprobs is not None and "system/old_logprobs_s" in timings
    metrics = update_policy(
        policy,
        optimizer,
        scheduler,
        prepared,
        advantages.double() * batch.action_mask,
        s,
        learner_version=0,
        generator=torch.Generator().manual_seed(0),
    )
    return torch.cat([p.detach().flatten() for p in policy.parameters()]), metrics


def test_m2po_update_does_not_depend_on_micro_batch_size(tiny_model_dir: Path) -> None:
    runs = [_learner_run(tiny_model_dir, micro, 1, ("m2po",)) for micro in (12, 5, 1)]
    for params, metrics in runs[1:]:
        assert torch.allclose(params, runs[0][0], atol=1e-10, rtol=0)
        assert metrics["ratio/kappa/m2po_masked_frac"] == runs[0][1]["ratio/kappa/m2po_masked_frac"]
    assert 0 < runs[0][1]["ratio/kappa/m2po_masked_frac"] < 1  # the selection bit, not all
    plain, _ = _learner_run(tiny_model_dir, 12, 1, ())
    assert not torch.allclose(plain, runs[0][0], atol=1e-6, rtol=0)  # and changed the update


def test_m2po_two_minibatches_do_not_depend_on_micro_batch_size(tiny_model_dir: Path) -> None:
    first, _ = _learner_run(tiny_model_dir, 6, 2, ("m2po",))
    other, _ = _learner_run(tiny_model_dir, 1, 2, ("m2po",))
    assert torch.allclose(first, other, atol=1e-10, rtol=0)


def test_a_token_m2po_drops_keeps_its_kl_term() -> None:
    # M2PO removes a token's policy gradient, never its KL regulariser (as every correction:
    # policy_loss's contract). One token, pg objective, Â = 1, log π_θ = −1, log π_ref = −1.2,
    # β = 0.1: k3 = e^(−0.2) − 1 + 0.2 = 0.018731; kept j = −Â·log π_θ + β·k3 = 1 + 0.0018731;
    # dropped j = β·k3 = 0.0018731 (before the fix the whole j was multiplied away: 0).
    lp = torch.tensor([[-1.0]])
    one = torch.ones(1, 1)
    terms = PolicyTerms(
        logprobs=lp, old_logprobs=lp, behavior_logprobs=lp, advantages=one, mask=one.bool()
    )
    p, kl = BehaviourParams(objective="pg"), KLParams(placement="loss", estimator="k3", beta=0.1)
    ref = torch.tensor([[-1.2]])
    k = math.exp(-0.2) - 1 + 0.2
    kept, _ = policy_loss(terms, p, kl, ref, keep_BT=torch.ones(1, 1))
    dropped, _ = policy_loss(terms, p, kl, ref, keep_BT=torch.zeros(1, 1))
    assert kept.item() == pytest.approx(1 + 0.1 * k) and dropped.item() == pytest.approx(0.1 * k)


def test_m2po_selects_over_each_optimiser_mini_batch_not_the_whole_batch() -> None:
    # F2's (log κ)², τ = 0.2. Row 1 alone: 0.0463, 0.6576, 3.2104 → drop 3.2104 (rest's mean
    # 0.352 > τ), drop 0.6576 (0.0463 ≤ τ): keeps (1,1). Row 2 alone: 0.4805, 0.0048, 0.1644
    # (mean 0.2166 > τ) → drop 0.4805 (0.0846 ≤ τ): keeps (2,2), (2,3). Over both rows: drop
    # 3.2104 (0.2707 > τ), 0.6576 (0.1740 ≤ τ): row 2 would keep all three tokens.
    from rlmap.learner.policy import UpdateSettings, _weights
    from rlmap.learner.update_loop import Schedule
    from rlmap.reduction import ReductionParams

    log_k, mask = f2_log_kappa(), torch.ones(2, 3, dtype=torch.bool)
    batch = make_batch(mask, torch.ones(2), old_logprobs=log_k, behavior_logprobs=torch.zeros(2, 3))
    s = UpdateSettings(
        behaviour=BehaviourParams(corrections=("m2po",), m2po_threshold=0.2),
        kl=KLParams(),
        reduction=ReductionParams(name="token_mean"),
        schedule=Schedule(epochs=1, minibatches=2, micro_batch_size=1, max_grad_norm=1.0),
        temperature=1.0,
    )
    for row, expected in ((0, [1.0, 0.0, 0.0]), (1, [0.0, 1.0, 1.0])):
        w = _weights(batch.select(torch.tensor([row])), s)
        torch.testing.assert_close(w[0], torch.full((1, 3), 1 / 3))  # M2PO leaves these alone
        assert w[1].tolist() == [expected], row
    assert minibatch_keep(batch, s.behaviour)[1].tolist() == [True, True, True]


# ---------------------------------------------------------------- OPSM

# F1 (bypass): p_μ and p_θ per token; row 2 has two action tokens.
F1_MU = [[0.50, 0.20, 0.90], [0.50, 0.30, 0.50]]
F1_THETA = [[0.62, 0.45, 0.90], [0.25, 0.28, 0.50]]
F1_MASK = [[True, True, True], [True, True, False]]


def f1_log_d() -> Tensor:
    return torch.tensor(
        [
            [LN(a / b) for a, b in zip(ra, rb, strict=True)]
            for ra, rb in zip(F1_THETA, F1_MU, strict=True)
        ]
    )


def test_opsm_hand_case_f1() -> None:
    # log d = 0.215111, 0.810930, 0 | −0.693147, −0.068993, (off the mask)
    # D_1 = −(0.215111 + 0.810930 + 0)/3 = −0.342014;  D_2 = −(−0.693147 − 0.068993)/2 = 0.381070
    # δ = 1e-4: row 1 has Â = +1 → kept; row 2 has Â = −1 and D_2 > δ → dropped
    # Â_1 = −1 instead: D_1 = −0.342 ≤ δ → still kept.  δ = 0.5: D_2 ≤ δ → row 2 kept
    log_d, mask = f1_log_d(), torch.tensor(F1_MASK)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3])
    assert opsm_keep(log_d, adv, mask, delta=1e-4).tolist() == [[1.0] * 3, [0.0] * 3]
    assert opsm_keep(log_d, -adv.abs(), mask, delta=1e-4).tolist() == [[1.0] * 3, [0.0] * 3]
    assert opsm_keep(log_d, adv, mask, delta=0.5).tolist() == [[1.0] * 3, [1.0] * 3]


def opsm_reference(
    log_theta: Tensor, log_mu: Tensor, adv: Tensor, mask: Tensor, delta: float
) -> list[list[float]]:
    b, t = mask.shape
    out = []
    for i in range(b):
        n = sum(bool(mask[i, j]) for j in range(t))
        kl = sum(float(log_mu[i, j] - log_theta[i, j]) for j in range(t) if mask[i, j])
        a = sum(float(adv[i, j]) for j in range(t) if mask[i, j])
        keep = n == 0 or a / n >= 0 or kl / n <= delta
        out.append([1.0 if keep else 0.0] * t)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_opsm_reference_loop(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    log_theta = -torch.rand(6, 5, generator=g, dtype=torch.float64) * 3
    log_mu = log_theta + torch.randn(6, 5, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(6, 1, generator=g, dtype=torch.float64).expand(6, 5)
    mask = torch.rand(6, 5, generator=g) > 0.3
    mask[0] = False  # an empty row is kept
    for delta in (0.0, 1e-4, 0.05, 0.3):
        got = opsm_keep(log_theta - log_mu, adv, mask, delta=delta).tolist()
        assert got == opsm_reference(log_theta, log_mu, adv, mask, delta)


@pytest.mark.parametrize("seed", range(4))
def test_opsm_properties(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    log_d = torch.randn(8, 6, generator=g) * 0.5
    adv = torch.randn(8, 1, generator=g).expand(8, 6)
    mask = torch.rand(8, 6, generator=g) > 0.2
    w = opsm_keep(log_d, adv, mask, delta=1e-4)
    assert torch.equal(w, w[:, :1].expand_as(w))  # one decision per trajectory
    assert (w[adv[:, 0] >= 0] == 1).all()  # never drops a trajectory with Â ≥ 0
    loose = opsm_keep(log_d, adv, mask, delta=10.0)
    assert (loose == 1).all()  # a larger δ drops nothing here (|mean log d| < 10)
    # row-local: a subset of rows gets the same decision alone (micro-batch independent)
    assert torch.equal(opsm_keep(log_d[3:5], adv[3:5], mask[3:5], delta=1e-4), w[3:5])


def test_opsm_drops_whole_trajectories_in_the_loss_without_changing_the_rest() -> None:
    # bypass, pg objective: j = −Â·d. OPSM zeros row 2's loss and gradient, row 1 unchanged
    log_mu = torch.tensor([[LN(p) for p in row] for row in F1_MU])
    log_theta = torch.tensor([[LN(p) for p in row] for row in F1_THETA], requires_grad=True)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3])
    terms = PolicyTerms(log_theta, log_mu, log_mu, adv, torch.tensor(F1_MASK))
    with_opsm = BehaviourParams(objective="pg", mode="bypass", corrections=("opsm",))
    j, diag = policy_loss(terms, with_opsm, KLParams())
    j0, _ = policy_loss(terms, BehaviourParams(objective="pg", mode="bypass"), KLParams())
    assert torch.equal(j[0], j0[0]) and (j[1] == 0).all()
    assert diag["ratio/d/seq_masked_frac"].item() == pytest.approx(1 / 2)
    (grad,) = torch.autograd.grad(j.sum(), log_theta)
    assert (grad[1] == 0).all() and (grad[0, :3] != 0).all()


def test_opsm_comparison_with_trl() -> None:
    # TRL's GRPOTrainer.get_off_policy_mask (a dev dependency) on the same tensors: per-row
    # advantages (B, 1), as TRL's GRPO has them, so the sign tests coincide.
    trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    g = torch.Generator().manual_seed(7)
    log_theta = -torch.rand(10, 6, generator=g) * 3
    log_mu = log_theta + torch.randn(10, 6, generator=g) * 0.2
    adv = torch.randn(10, 1, generator=g)
    mask = torch.rand(10, 6, generator=g) > 0.2
    for delta in (1e-4, 0.05, 0.2):
        theirs = trainer.GRPOTrainer.get_off_policy_mask(
            advantages=adv,
            per_token_logps=log_theta,
            sampling_per_token_logps=log_mu,
            mask=mask.float(),
            off_policy_threshold=delta,
        )
        ours = opsm_keep(log_theta - log_mu, adv.expand(10, 6), mask, delta=delta)
        assert torch.equal(ours[:, :1], theirs)


# ---------------------------------------------------------------- importance-weighted KL


def test_iw_kl_hand_case_same_value_other_gradient() -> None:
    # token (1,1): π_θ = 0.62, π_ref = 0.5, one optimiser step (π_old = sg π_θ, ρ = 1)
    # x = ln(0.5/0.62) = −0.215111; e^x = 0.806452; k3 = 0.806452 + 0.215111 − 1 = 0.021563
    # ∂k3/∂log π_θ = 1 − e^x = 0.193548
    # ∂(ρ·k3)/∂log π_θ = ρ·k3 + ρ·(1 − e^x) = 0.021563 + 0.193548 = 0.215111 (= log π_θ/π_ref)
    lp = torch.tensor([[LN(0.62)]], requires_grad=True)
    ref = torch.tensor([[LN(0.5)]])
    plain = k3(lp, ref)
    weighted = kl_estimators.get("k3_iw").per_token(lp, ref, lp.detach())
    assert plain.item() == pytest.approx(0.021563, abs=1e-6)
    assert weighted.item() == pytest.approx(plain.item(), abs=1e-7)
    (g_plain,) = torch.autograd.grad(plain.sum(), lp)
    (g_weighted,) = torch.autograd.grad(weighted.sum(), lp)
    assert g_plain.item() == pytest.approx(0.193548, abs=1e-6)
    assert g_weighted.item() == pytest.approx(0.215111, abs=1e-6)


def test_iw_kl_hand_case_off_policy() -> None:
    # π_old = 0.5 (so ρ = 0.62/0.5 = 1.24): value 1.24·0.021563 = 0.026738;
    # gradient ρ·k3 + ρ·(1 − e^x) = 0.026738 + 1.24·(1 − 0.5/0.62) = 0.026738 + 0.24 = 0.266738
    lp = torch.tensor([[LN(0.62)]], requires_grad=True)
    k = kl_estimators.get("k3_iw").per_token(
        lp, torch.tensor([[LN(0.5)]]), torch.tensor([[LN(0.5)]])
    )
    (grad,) = torch.autograd.grad(k.sum(), lp)
    assert k.item() == pytest.approx(0.026738, abs=1e-6)
    assert grad.item() == pytest.approx(0.266738, abs=1e-6)


def test_iw_kl_reference_loop_value_and_gradient() -> None:
    g = torch.Generator().manual_seed(0)
    lp = (-torch.rand(3, 4, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    ref = -torch.rand(3, 4, generator=g, dtype=torch.float64) * 3
    old = lp.detach() + torch.randn(3, 4, generator=g, dtype=torch.float64) * 0.3
    k = kl_estimators.get("k3_iw").per_token(lp, ref, old)
    (grad,) = torch.autograd.grad(k.sum(), lp)
    for i in range(3):
        for t in range(4):
            a, b, o = float(lp.detach()[i, t]), float(ref[i, t]), float(old[i, t])
            rho, x = math.exp(a - o), b - a
            value = rho * (math.exp(x) - x - 1)
            assert k[i, t].item() == pytest.approx(value, rel=1e-9)
            assert grad[i, t].item() == pytest.approx(value + rho * (1 - math.exp(x)), rel=1e-9)


def test_iw_kl_in_the_loss_and_its_properties() -> None:
    # j = j_obj + β·ρ·k3: with π_old = π_θ (ρ = 1) its value equals k3's, its gradient does not
    g = torch.Generator().manual_seed(1)
    lp = (-torch.rand(2, 3, generator=g) * 2).requires_grad_(True)
    ref = -torch.rand(2, 3, generator=g) * 2
    terms = PolicyTerms(lp, lp.detach(), lp.detach(), torch.zeros(2, 3), torch.ones(2, 3).bool())
    behaviour = BehaviourParams(objective="pg")
    runs = {}
    for name in ("k3", "k3_iw"):
        j, diag = policy_loss(
            terms, behaviour, KLParams(placement="loss", estimator=name, beta=0.5), ref
        )
        (grad,) = torch.autograd.grad(j.sum(), lp)
        runs[name] = (j.detach(), grad, diag["kl/mean"])
    torch.testing.assert_close(runs["k3"][0], runs["k3_iw"][0])
    torch.testing.assert_close(runs["k3"][2], runs["k3_iw"][2])
    # Â = 0: the gradient is β times the KL's; k3_iw's is β·(log π_θ − log π_ref) at ρ = 1
    torch.testing.assert_close(runs["k3_iw"][1], 0.5 * (lp.detach() - ref))
    assert not torch.allclose(runs["k3"][1], runs["k3_iw"][1])
    # the weight is the same function as ρ·k3 for any π_old
    old = lp.detach() - 0.3
    torch.testing.assert_close(
        importance_weighted(k3(lp, ref), lp, old), math.exp(0.3) * k3(lp, ref)
    )


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"m2po_threshold": 0.0}, "behaviour.m2po_threshold: must be > 0"),
        ({"m2po_threshold": float("nan")}, "behaviour.m2po_threshold: must be > 0"),
        ({"opsm_delta": -0.1}, "behaviour.opsm_delta: must be >= 0"),
        ({"mode": "bypass", "corrections": ("m2po",)}, "'m2po' corrects κ"),
        ({"objective": "gspo", "corrections": ("m2po",)}, "'m2po' weights single tokens"),
    ],
)
def test_bad_settings_are_refused_in_one_line(fields: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_behaviour(BehaviourParams(**fields), KLParams())  # type: ignore[arg-type]
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_opsm_is_sequence_level_so_gspo_accepts_it() -> None:
    check_behaviour(BehaviourParams(objective="gspo", corrections=("opsm",)), KLParams())
    check_behaviour(BehaviourParams(mode="bypass", corrections=("opsm",)), KLParams())
    check_behaviour(BehaviourParams(), KLParams(placement="loss", estimator="k3_iw", beta=0.1))
