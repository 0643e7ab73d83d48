"""Behaviour and KL parameter records: defaults match FORMULAS.md, records are frozen."""

from __future__ import annotations

import dataclasses

import pytest

from rlmap.correction import BehaviourParams, KLParams


def test_behaviour_defaults() -> None:
    p = BehaviourParams()
    assert (p.objective, p.mode, p.clip_low, p.clip_high, p.dual_clip) == (
        "ppo_clip",
        "decoupled",
        0.2,
        0.2,
        None,
    )
    assert (p.sapo_tau_pos, p.sapo_tau_neg, p.gate_low, p.gate_high) == (1.0, 1.05, 0.3, 5.0)
    assert (p.tis_cap, p.tis_level, p.icepop_low, p.icepop_high) == (2.0, "token", 0.5, 5.0)
    assert (p.masked_is_low, p.masked_is_high, p.max_staleness, p.decoupled_cap) == (
        0.5,
        2.0,
        4,
        2.0,
    )
    assert p.corrections == () and p.positive_nll == 0.0 and p.gspo_token is False


def test_kl_defaults() -> None:
    assert dataclasses.astuple(KLParams()) == ("none", "k3", 0.0, None, 10000)


def test_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        BehaviourParams().clip_low = 0.3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        KLParams().beta = 1.0  # type: ignore[misc]
