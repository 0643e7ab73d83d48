"""Behaviour corrections (FORMULAS §4): hand cases, reference loops, detached weights."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import Tensor

from rlmap.core.batch import make_batch
from rlmap.core.errors import ConfigError
from rlmap.correction import BehaviourParams, PolicyTerms, corrections, terms_from_batch
from rlmap.correction.weights import (
    decoupled_weight,
    icepop_weight,
    masked_is_weight,
    staleness_weight,
    tis_weight,
    version_lag,
)

NAMES = ("tis", "icepop", "masked_is", "staleness", "decoupled", "m2po", "opsm")


def kappa_terms(kappa: list[list[float]], mask: list[list[bool]] | None = None) -> PolicyTerms:
    """Terms whose κ = π_old/μ_old is ``kappa``; π_old has grad to check the weights detach."""
    log_k = torch.tensor([[math.log(k) for k in row] for row in kappa])
    old = torch.full_like(log_k, -1.0).requires_grad_(True)
    m = torch.ones_like(log_k, dtype=torch.bool) if mask is None else torch.tensor(mask)
    lp = old.detach().clone().requires_grad_(True)
    return PolicyTerms(lp, old, old.detach() - log_k, torch.ones_like(log_k), m)


def weight(name: str, terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict]:
    w, diag = corrections.get(name).fn(terms, p)
    assert not w.requires_grad
    assert all(v.dim() == 0 and not v.requires_grad for v in diag.values())
    return w, diag


def test_registry_names_and_needs_kappa() -> None:
    assert corrections.names() == NAMES
    needs = {n: corrections.get(n).needs_kappa for n in NAMES}
    assert needs == {
        "tis": True,
        "icepop": True,
        "masked_is": True,
        "staleness": False,
        "decoupled": True,
        "m2po": True,
        "opsm": False,
    }


def test_registry_levels() -> None:
    # token-level: the weight may differ between tokens of one trajectory
    levels = {n: corrections.get(n).token_level for n in NAMES}
    assert levels == {
        "tis": True,
        "icepop": True,
        "masked_is": False,
        "staleness": False,
        "decoupled": True,
        "m2po": True,
        "opsm": False,
    }
    switches = {n: corrections.get(n).level_switch for n in NAMES}
    assert switches == dict.fromkeys(NAMES) | {"tis": "tis_level"}
    fields = {f.name for f in dataclasses.fields(BehaviourParams)}
    assert {s for s in switches.values() if s is not None} <= fields
    assert corrections.get("tis").is_token_level(BehaviourParams(tis_level="token"))
    assert not corrections.get("tis").is_token_level(BehaviourParams(tis_level="sequence"))
    assert corrections.get("icepop").is_token_level(BehaviourParams(tis_level="sequence"))
    assert not corrections.get("masked_is").is_token_level(BehaviourParams())


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_sequence_level_weights_are_constant_along_each_row(level: str) -> None:
    # what token_level=False promises, checked on the weights themselves
    g = torch.Generator().manual_seed(5)
    kappa = torch.exp(0.7 * torch.randn(5, 6, generator=g)).tolist()
    mask = (torch.rand(5, 6, generator=g) > 0.2).tolist()
    terms = kappa_terms(kappa, mask)
    versions = torch.randint(0, 9, (5, 6), generator=g)
    terms = dataclasses.replace(terms, policy_version=versions, learner_version=10)
    p = BehaviourParams(tis_level=level)
    for name in NAMES:
        if corrections.get(name).is_token_level(p):
            continue
        w, _ = weight(name, terms, p)
        assert torch.equal(w, w[:, :1].expand_as(w)), name


# ---------------------------------------------------------------- tis


def test_tis_token_hand_case() -> None:
    # C = 2: κ = 0.5 → 0.5; κ = 3 → min(3, 2) = 2; κ = 1.5 → 1.5
    terms = kappa_terms([[0.5, 3.0, 1.5]])
    w, diag = weight("tis", terms, BehaviourParams(corrections=("tis",)))
    torch.testing.assert_close(w, torch.tensor([[0.5, 2.0, 1.5]]))
    assert diag["ratio/kappa/capped_frac"].item() == pytest.approx(1 / 3)


def test_tis_sequence_hand_case() -> None:
    # row 0: κ = (1.5, 2), κ_seq = 1.5·2 = 3 → min(3, 2) = 2 on both tokens
    # row 1: κ = (0.5, 1.2), third token off the mask → κ_seq = 0.6 → 0.6
    terms = kappa_terms(
        [[1.5, 2.0, 1.0], [0.5, 1.2, 9.0]], [[True, True, True], [True, True, False]]
    )
    p = BehaviourParams(corrections=("tis",), tis_level="sequence")
    w, _ = weight("tis", terms, p)
    torch.testing.assert_close(w[0], torch.tensor([2.0, 2.0, 2.0]))
    torch.testing.assert_close(w[1, :2], torch.tensor([0.6, 0.6]))


def test_tis_reference_loop_both_levels() -> None:
    g = torch.Generator().manual_seed(0)
    log_k = 0.6 * torch.randn(4, 5, generator=g)
    mask = torch.rand(4, 5, generator=g) > 0.3
    tok = tis_weight(log_k, mask, cap=2.0, level="token")
    seq = tis_weight(log_k, mask, cap=2.0, level="sequence")
    for i in range(4):
        total = sum(float(log_k[i, t]) for t in range(5) if mask[i, t])
        for t in range(5):
            assert tok[i, t].item() == pytest.approx(
                min(math.exp(float(log_k[i, t])), 2.0), rel=1e-5
            )
            assert seq[i, t].item() == pytest.approx(min(math.exp(total), 2.0), rel=1e-5)
    with pytest.raises(ConfigError, match=r"^behaviour.tis_level"):
        tis_weight(log_k, mask, cap=2.0, level="turn")


def test_tis_is_identity_in_bypass_mode() -> None:
    # bypass: π_old := μ_old → κ ≡ 1 → w ≡ 1
    lp = torch.randn(2, 3)
    terms = PolicyTerms(lp, lp, lp, torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool))
    w, _ = weight("tis", terms, BehaviourParams(mode="bypass"))
    assert torch.equal(w, torch.ones(2, 3))


# ---------------------------------------------------------------- icepop


def test_icepop_hand_case() -> None:
    # α = 0.5, β = 5: κ = 0.4 → 0 (below); 0.5 → 0.5 (edge kept); 2 → 2; 5 → 5 (edge); 6 → 0
    terms = kappa_terms([[0.4, 0.5, 2.0, 5.0, 6.0]])
    w, diag = weight("icepop", terms, BehaviourParams())
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.5, 2.0, 5.0, 0.0]]))
    assert diag["ratio/kappa/masked_frac"].item() == pytest.approx(2 / 5)


def test_icepop_reference_loop() -> None:
    g = torch.Generator().manual_seed(1)
    log_k = torch.randn(3, 7, generator=g)
    w = icepop_weight(log_k, low=0.5, high=5.0)
    for i in range(3):
        for t in range(7):
            k = math.exp(float(log_k[i, t]))
            assert w[i, t].item() == pytest.approx(k if 0.5 <= k <= 5.0 else 0.0, rel=1e-5)


# ---------------------------------------------------------------- masked_is


def test_masked_is_hand_case() -> None:
    # α = 0.5, β = 2, geometric mean g = (Π κ)^(1/n):
    # (4, 0.9): √3.6 = 1.897 keep; (4, 2): √8 = 2.828 drop; (0.25, 1.2): √0.3 = 0.548 keep;
    # (0.2, 1): √0.2 = 0.447 drop; (1, [50 off the mask]): 1 keep
    kappa = [[4.0, 0.9], [4.0, 2.0], [0.25, 1.2], [0.2, 1.0], [1.0, 50.0]]
    mask = [[True, True]] * 4 + [[True, False]]
    terms = kappa_terms(kappa, mask)
    w, diag = weight("masked_is", terms, BehaviourParams())
    assert w[:, 0].tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert torch.equal(w[:, 0], w[:, 1])  # the whole trajectory, not single tokens
    assert diag["ratio/kappa/seq_masked_frac"].item() == pytest.approx(2 / 5)


def test_masked_is_reference_loop() -> None:
    g = torch.Generator().manual_seed(2)
    log_k = 0.8 * torch.randn(6, 4, generator=g)
    mask = torch.rand(6, 4, generator=g) > 0.3
    mask[:, 0] = True
    w = masked_is_weight(log_k, mask, low=0.5, high=2.0)
    for i in range(6):
        logs = [float(log_k[i, t]) for t in range(4) if mask[i, t]]
        geo = math.exp(sum(logs) / len(logs))
        assert w[i].tolist() == [1.0 if 0.5 <= geo <= 2.0 else 0.0] * 4
    # both branches occur (row 0: g = 0.40 < α, dropped; the others kept), so a constant
    # weight, all kept or all dropped, cannot pass
    assert 0 < w[:, 0].sum() < 6


# ---------------------------------------------------------------- staleness


def test_staleness_hand_case() -> None:
    # learner version 10, η = 4. Oldest action token decides:
    # (6, 7) → lag 4, keep; (5, 9) → lag 5, drop; ([0 off the mask], 8) → lag 2, keep
    versions = torch.tensor([[6, 7], [5, 9], [0, 8]])
    mask = torch.tensor([[True, True], [True, True], [False, True]])
    terms = PolicyTerms(
        torch.zeros(3, 2),
        torch.zeros(3, 2),
        torch.zeros(3, 2),
        torch.ones(3, 2),
        mask,
        policy_version=versions,
        learner_version=10,
    )
    w, diag = weight("staleness", terms, BehaviourParams(max_staleness=4))
    assert w.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]
    assert diag["system/stale_frac"].item() == pytest.approx(1 / 3)
    assert diag["system/max_version_lag"].item() == 5.0


def test_staleness_reference_loop() -> None:
    g = torch.Generator().manual_seed(3)
    versions = torch.randint(0, 12, (8, 5), generator=g)
    mask = torch.rand(8, 5, generator=g) > 0.3
    w = staleness_weight(versions, mask, learner_version=12, max_staleness=4)
    lag = version_lag(versions, mask, 12)
    for i in range(8):
        vs = [int(versions[i, t]) for t in range(5) if mask[i, t]]
        want_lag = 12 - min(vs) if vs else 0
        assert lag[i].item() == want_lag
        assert w[i].tolist() == [1.0 if want_lag <= 4 else 0.0] * 5


def test_staleness_needs_policy_version() -> None:
    terms = kappa_terms([[1.0]])
    with pytest.raises(ConfigError, match=r"^behaviour.corrections: 'staleness'"):
        corrections.get("staleness").fn(terms, BehaviourParams())


def test_staleness_needs_learner_version() -> None:
    # a learner version defaulting to 0 would turn version 100 into lag −100: never stale
    terms = dataclasses.replace(
        kappa_terms([[1.0, 1.0]]), policy_version=torch.tensor([[100, 100]])
    )
    assert terms.learner_version is None
    with pytest.raises(
        ConfigError, match=r"^behaviour.corrections: 'staleness' needs learner_version"
    ):
        corrections.get("staleness").fn(terms, BehaviourParams())


def test_terms_from_batch_leaves_the_learner_version_unset() -> None:
    mask = torch.ones(1, 2, dtype=torch.bool)
    batch = make_batch(mask, torch.ones(1), policy_version=torch.tensor([[100, 100]]))
    terms = terms_from_batch(batch, torch.zeros(1, 2), torch.ones(1, 2), mode="bypass")
    with pytest.raises(ConfigError, match=r"needs learner_version"):
        corrections.get("staleness").fn(terms, BehaviourParams())
    ok = terms_from_batch(
        batch, torch.zeros(1, 2), torch.ones(1, 2), mode="bypass", learner_version=105
    )
    w, diag = weight("staleness", ok, BehaviourParams(max_staleness=4))  # lag 5 > 4
    assert w.tolist() == [[0.0, 0.0]] and diag["system/stale_frac"].item() == 1.0


def test_staleness_rejects_a_policy_version_from_the_future() -> None:
    # learner version 5; a masked token from version 7 is a bookkeeping bug,
    # while version 9 off the mask is ignored
    base = kappa_terms([[1.0, 1.0], [1.0, 1.0]], [[True, True], [True, False]])
    future = dataclasses.replace(
        base, policy_version=torch.tensor([[4, 7], [5, 5]]), learner_version=5
    )
    with pytest.raises(
        ConfigError,
        match=r"^behaviour.corrections: 'staleness' got policy_version 7 > learner_version 5",
    ):
        corrections.get("staleness").fn(future, BehaviourParams())
    off_mask = dataclasses.replace(future, policy_version=torch.tensor([[4, 5], [5, 9]]))
    w, _ = weight("staleness", off_mask, BehaviourParams())
    assert w.tolist() == [[1.0, 1.0], [1.0, 1.0]]


# ---------------------------------------------------------------- decoupled


def test_decoupled_hand_case_equals_token_tis() -> None:
    # cap 2: κ = π_prox/μ = (0.5, 3) → (0.5, 2)
    terms = kappa_terms([[0.5, 3.0]])
    w, diag = weight("decoupled", terms, BehaviourParams())
    torch.testing.assert_close(w, torch.tensor([[0.5, 2.0]]))
    assert diag["ratio/kappa/decoupled_capped_frac"].item() == pytest.approx(0.5)
    g = torch.Generator().manual_seed(4)
    log_k = torch.randn(3, 4, generator=g)
    mask = torch.ones(3, 4, dtype=torch.bool)
    torch.testing.assert_close(
        decoupled_weight(log_k, cap=1.7), tis_weight(log_k, mask, cap=1.7, level="token")
    )


@pytest.mark.parametrize("name", ["tis", "icepop", "masked_is", "decoupled"])
def test_kappa_weights_ignore_theta(name: str) -> None:
    # the weights depend on π_old/μ_old only; changing π_θ does not change them
    terms = kappa_terms([[0.3, 1.1, 4.0], [2.5, 0.8, 1.0]])
    w1, _ = weight(name, terms, BehaviourParams())
    moved = PolicyTerms(
        terms.logprobs + 3.0,
        terms.old_logprobs,
        terms.behavior_logprobs,
        terms.advantages,
        terms.mask,
    )
    w2, _ = weight(name, moved, BehaviourParams())
    assert torch.equal(w1, w2)
