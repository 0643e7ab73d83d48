"""The composed behaviour loss: objective × corrections + β·k (FORMULAS §3, §4, §6)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from rlmap.core.errors import ConfigError, UnknownComponentError
from rlmap.correction import (
    BehaviourParams,
    KLParams,
    PolicyTerms,
    check_behaviour,
    corrections,
    k3,
    policy_loss,
    registry,
)


def test_hand_case_ppo_times_tis_plus_kl() -> None:
    # r = 1 (π_old = π_θ), Â = 1 → ppo_clip j = −1
    # κ = 3, TIS cap 2 → w = 2 → −2
    # KL in the loss: β = 0.1, x = log π_ref − log π_θ = ln 2 → k3 = 2 − ln 2 − 1 = 0.306853
    #   → j = −2 + 0.1·0.306853 = −1.969315
    # second token off the mask → 0
    lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    old = lp.detach()
    mu = old - math.log(3.0)
    mask = torch.tensor([[True, False]])
    terms = PolicyTerms(lp, old, mu, torch.ones(1, 2), mask)
    ref = lp.detach() + math.log(2.0)
    p = BehaviourParams(corrections=("tis",))
    j, diag = policy_loss(terms, p, KLParams(placement="loss", beta=0.1), ref)
    torch.testing.assert_close(j.detach(), torch.tensor([[-1.969315, 0.0]]))
    assert diag["kl/mean"].item() == pytest.approx(0.306853, rel=1e-5)
    assert "ratio/kappa/capped_frac" in diag and "ratio/rho/clipped_frac" in diag


def test_reference_composition_random() -> None:
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(4, 6, generator=g) > 0.3
    lp = (-torch.rand(4, 6, generator=g)).requires_grad_(True)
    old = lp.detach() + 0.1 * torch.randn(4, 6, generator=g)
    mu = old + 0.5 * torch.randn(4, 6, generator=g)
    terms = PolicyTerms(lp, old, mu, torch.randn(4, 6, generator=g), mask)
    ref = lp.detach() + 0.2 * torch.randn(4, 6, generator=g)
    p = BehaviourParams(objective="cispo", corrections=("tis", "icepop"))
    kl = KLParams(placement="loss", estimator="k3", beta=0.05)
    j, _ = policy_loss(terms, p, kl, ref)
    obj, _ = registry.get("cispo").fn(terms, p)
    w1, _ = corrections.get("tis").fn(terms, p)
    w2, _ = corrections.get("icepop").fn(terms, p)
    want = torch.where(mask, obj * w1 * w2 + 0.05 * k3(lp, ref), 0.0)
    torch.testing.assert_close(j, want)
    for i in range(4):  # the same, token by token with Python floats
        for t in range(6):
            if not mask[i, t]:
                assert j[i, t].item() == 0.0
                continue
            kap = math.exp(float(old[i, t]) - float(mu[i, t]))
            w = min(kap, 2.0) * (kap if 0.5 <= kap <= 5.0 else 0.0)
            r = math.exp(float(lp[i, t].detach()) - float(old[i, t]))
            a, x = float(terms.advantages[i, t]), float(ref[i, t]) - float(lp[i, t].detach())
            cis = -min(max(r, 0.8), 1.2) * a * float(lp[i, t].detach())
            want_it = cis * w + 0.05 * (math.exp(x) - x - 1)
            assert j[i, t].item() == pytest.approx(want_it, rel=1e-4, abs=1e-6)


def test_masking_zeroes_tokens_without_touching_the_mask() -> None:
    # IcePop drops κ = 10; the action mask (the reduction's denominator) is unchanged
    lp = torch.full((1, 3), -1.0, requires_grad=True)
    mu = lp.detach() - torch.tensor([[0.0, math.log(10.0), 0.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    terms = PolicyTerms(lp, lp.detach(), mu, torch.ones(1, 3), mask)
    j, diag = policy_loss(terms, BehaviourParams(corrections=("icepop",)), KLParams())
    assert j[0, 1].item() == 0.0 and j[0, 0].item() == pytest.approx(-1.0)
    assert terms.mask.tolist() == [[True, True, True]]
    assert diag["ratio/kappa/masked_frac"].item() == pytest.approx(1 / 3)
    (grad,) = torch.autograd.grad(j.sum(), lp)
    assert grad[0, 1].item() == 0.0 and grad[0, 0].item() != 0.0


def test_kl_placement_reward_or_none_adds_nothing_to_the_loss() -> None:
    lp = torch.full((2, 2), -1.0)
    terms = PolicyTerms(lp, lp, lp, torch.ones(2, 2), torch.ones(2, 2, dtype=torch.bool))
    base, _ = policy_loss(terms, BehaviourParams(), KLParams())
    for placement in ("none", "reward"):
        j, diag = policy_loss(
            terms, BehaviourParams(), KLParams(placement=placement, beta=1.0), lp - 1
        )
        assert torch.equal(j, base) and "kl/mean" not in diag


def test_kl_in_loss_needs_reference() -> None:
    lp = torch.zeros(1, 1)
    terms = PolicyTerms(lp, lp, lp, torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ConfigError, match=r"^kl.placement"):
        policy_loss(terms, BehaviourParams(), KLParams(placement="loss", beta=0.1))


def test_check_behaviour_rejects_bad_combinations() -> None:
    kl = KLParams()
    check_behaviour(
        BehaviourParams(mode="bypass", objective="direct_gate", corrections=("staleness",)), kl
    )
    with pytest.raises(ConfigError, match=r"^behaviour.corrections: 'tis'.*bypass"):
        check_behaviour(BehaviourParams(mode="bypass", corrections=("tis",)), kl)
    with pytest.raises(UnknownComponentError, match="known: tis"):
        check_behaviour(BehaviourParams(corrections=("tiss",)), kl)
    with pytest.raises(UnknownComponentError, match="policy objective 'grpo'"):
        check_behaviour(BehaviourParams(objective="grpo"), kl)
    with pytest.raises(ConfigError, match=r"^behaviour.dual_clip"):
        check_behaviour(BehaviourParams(dual_clip=0.5), kl)
    with pytest.raises(ConfigError, match=r"^behaviour.corrections: duplicate"):
        check_behaviour(BehaviourParams(corrections=("tis", "tis")), kl)
    with pytest.raises(ConfigError, match=r"^kl.target"):
        check_behaviour(BehaviourParams(), KLParams(target=0.0))


# ---------------------------------------------------------------- objective × correction levels


def test_gspo_with_a_token_level_correction_is_rejected() -> None:
    kl = KLParams()
    for name in ("tis", "icepop", "decoupled"):
        with pytest.raises(
            ConfigError,
            match=rf"^behaviour.corrections: '{name}' .*'gspo'.*behaviour.gspo_token=true"
            r".*sequence-level correction \(tis with tis_level=sequence, masked_is, staleness, "
            r"opsm\)",
        ):
            check_behaviour(BehaviourParams(objective="gspo", corrections=(name,)), kl)
    # accepted: sequence-level corrections, or GSPO-token, or a token-level objective
    for p in (
        BehaviourParams(objective="gspo", corrections=("tis",), tis_level="sequence"),
        BehaviourParams(objective="gspo", corrections=("masked_is", "staleness")),
        BehaviourParams(objective="gspo", corrections=("icepop", "tis"), gspo_token=True),
        BehaviourParams(objective="ppo_clip", corrections=("icepop", "tis", "decoupled")),
    ):
        check_behaviour(p, kl)


def test_gspo_token_with_icepop_stops_the_masked_token() -> None:
    # one row of 3 tokens, r = 1 (s = 1), Â = 1, IcePop κ = (10, 1, 1) → w = (0, 1, 1).
    # response_mean weights each token by 1/3. GSPO-token routes token t's gradient to its
    # own log π_θ: ∂j_t/∂log π_θ(t) = −Â·s = −1, so grad = (0, −1/3, −1/3).
    # (Sequence-level GSPO would give (w_1 + w_2 + w_3)/3 · (−1/3) = −2/9 on every token,
    # IcePop's mask notwithstanding; check_behaviour rejects that combination.)
    lp = torch.full((1, 3), -1.0, requires_grad=True)
    mu = lp.detach() - torch.tensor([[math.log(10.0), 0.0, 0.0]])
    terms = PolicyTerms(lp, lp.detach(), mu, torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool))
    p = BehaviourParams(objective="gspo", corrections=("icepop",), gspo_token=True)
    j, _ = policy_loss(terms, p, KLParams())
    (grad,) = torch.autograd.grad(j.sum() / 3, lp)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -1 / 3, -1 / 3]]))


def _level_variants() -> list[Any]:
    """Every objective × correction, with each registered level switch on and off."""
    out = []
    for obj in registry.names():
        for name in corrections.names():
            variants = [({}, BehaviourParams(objective=obj, corrections=(name,)))]
            switch = registry.get(obj).token_switch
            if switch is not None:
                variants += [
                    ({switch: True}, dataclasses.replace(variants[0][1], **{switch: True}))
                ]
            level = corrections.get(name).level_switch
            if level is not None:
                variants += [
                    (k | {level: "sequence"}, dataclasses.replace(v, **{level: "sequence"}))
                    for k, v in variants
                ]
            for switched, p in variants:
                tag = ",".join(f"{k}={v}" for k, v in switched.items())
                out.append(pytest.param(p, id=f"{obj}+{name}" + (f"[{tag}]" if tag else "")))
    return out


@pytest.mark.parametrize("p", _level_variants())
def test_accepted_combinations_scale_each_tokens_gradient_by_its_weight(
    p: BehaviourParams,
) -> None:
    # FORMULAS §4: a correction is a detached per-token weight w on the objective, so the
    # gradient w.r.t. log π_θ(t) of the reduced loss must be w_t times the uncorrected one
    # (w_t = 0: no gradient). check_behaviour must accept exactly the combinations where
    # this holds on data with per-token κ; the composition is built by hand so the
    # rejected ones can be checked too. Here masked_is drops row 0 (geometric mean
    # 24^(1/4) = 2.21 > 2), staleness drops row 1 (lag 6 − 1 = 5 > 4), IcePop masks κ = 20
    # and 0.3, TIS caps κ = 20 and 3 at 2.
    g = torch.Generator().manual_seed(9)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]).bool()
    lp = (-torch.rand(3, 4, generator=g) - 0.5).requires_grad_(True)
    old = lp.detach() + 0.05 * torch.randn(3, 4, generator=g)
    kappa = torch.tensor([[20.0, 1.0, 1.5, 0.8], [0.3, 1.2, 1.0, 1.0], [3.0, 1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0], [-0.5], [2.0]]).expand(3, 4)
    terms = PolicyTerms(
        lp, old, old - kappa.log(), adv, mask, torch.tensor([[5] * 4, [1] * 4, [6] * 4]), 6
    )

    def grad_of(with_weight: bool) -> tuple[torch.Tensor, torch.Tensor]:
        j, _ = registry.get(p.objective).fn(terms, p)
        entry = corrections.get(p.corrections[0])
        w, _ = entry.fn(terms, p)
        if entry.minibatch is not None:  # m2po: the learner puts it in the pinned weights
            w = entry.minibatch(terms.log_kappa, terms.mask, p).float()
        j = j * w if with_weight else j
        m = mask.float()
        loss = ((j * m).sum(-1) / m.sum(-1)).mean()  # response_mean
        (grad,) = torch.autograd.grad(loss, lp)
        return grad, w

    corrected, w = grad_of(True)
    plain, _ = grad_of(False)
    holds = torch.allclose(torch.where(mask, corrected, 0.0), torch.where(mask, w * plain, 0.0))
    try:
        check_behaviour(p, KLParams())
        accepted = True
    except ConfigError:
        accepted = False
    assert accepted == holds
