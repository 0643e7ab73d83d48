"""The estimator registry: names, metadata, one call signature, invalid rows, errors."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest
import torch

from rlmap.core.batch import Batch, End, RewardStatus, make_batch
from rlmap.core.errors import ConfigError, UnknownComponentError
from rlmap.estimators import Credit, CreditParams, CriticParams, registry

NAMES = (
    "reinforce",
    "rloo",
    "grpo",
    "dr_grpo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "gae",
    "vtrace",
)
CRITIC = ("gae", "vtrace")
GROUP = ("rloo", "grpo", "dr_grpo", "reinforce_pp_baseline")


def test_registry_has_exactly_the_estimators() -> None:
    assert registry.names() == NAMES
    for name in NAMES:
        entry = registry.get(name)
        assert entry.needs_group == (name in GROUP)
        assert entry.needs_critic == (name in CRITIC)
        assert entry.summary and "\n" not in entry.summary and entry.paper
    with pytest.raises(UnknownComponentError, match="grpo"):
        registry.get("gpro")


def random_batch(seed: int, *, b: int = 8, t: int = 10, group: int = 2) -> Batch:
    """Groups of ``group`` rows; prompt, action/observation tokens, padding; critic fields."""
    gen = torch.Generator().manual_seed(seed)
    pos = torch.arange(t).expand(b, t)
    start = torch.randint(1, 3, (b, 1), generator=gen)
    stop = torch.randint(5, t + 1, (b, 1), generator=gen)
    mask = (pos >= start) & (pos < stop) & (torch.rand(b, t, generator=gen) < 0.75)
    mask[:, 1] = True  # at least one action token per row
    turn_id = torch.where(mask, (pos >= 5).long(), -1)  # two turns split at position 5
    return make_batch(
        mask,
        torch.randint(0, 2, (b,), generator=gen).float(),
        group_id=torch.arange(b) // group,
        end=torch.randint(0, 2, (b,), generator=gen),
        token_rewards=torch.randn(b, t, generator=gen) * mask,
        turn_id=turn_id,
        values=torch.randn(b, t, generator=gen),
        bootstrap_values=torch.randn(b, generator=gen),
        old_logprobs=-torch.rand(b, t, generator=gen),
        behavior_logprobs=-torch.rand(b, t, generator=gen),
    )


def _params(name: str, time_unit: Literal["token", "turn"] = "token") -> CreditParams:
    return CreditParams(estimator=name, gamma=0.95, lam=0.9, time_unit=time_unit)


CASES: list[tuple[str, Literal["token", "turn"]]] = [(n, "token") for n in NAMES] + [
    ("gae", "turn"),
    ("vtrace", "turn"),
]


@pytest.mark.parametrize(("name", "unit"), CASES)
def test_every_entry_same_signature_shapes_and_diagnostics(
    name: str, unit: Literal["token", "turn"]
) -> None:
    batch = random_batch(0)
    credit = registry.get(name).fn(batch, _params(name, unit))
    assert isinstance(credit, Credit)
    assert credit.advantages.shape == batch.action_mask.shape
    assert torch.all(credit.advantages[~batch.action_mask] == 0)
    assert not credit.advantages.requires_grad
    keys = {"adv/mean", "adv/std"}
    if name in GROUP:
        keys |= {"group/all_correct_frac", "group/all_wrong_frac", "group/zero_adv_frac"}
    if name in CRITIC:
        keys |= {"critic/explained_variance", "critic/value_error_first", "critic/value_error_last"}
        assert credit.returns is not None and credit.returns.shape == batch.action_mask.shape
    else:
        assert credit.returns is None
    assert set(credit.diagnostics) == keys
    assert all(v.dim() == 0 and not v.requires_grad for v in credit.diagnostics.values())


def _spoil(batch: Batch, bad: torch.Tensor) -> Batch:
    """Rows ``bad`` become invalid two ways (infra error, aborted) with garbage content."""
    nan_rows = bad.unsqueeze(-1)
    status = torch.where(bad, int(RewardStatus.INFRA_ERROR), batch.reward_status)
    end = batch.end.clone()
    end[bad.nonzero().flatten()[::2]] = int(End.ABORTED)
    nan = float("nan")
    assert batch.token_rewards is not None and batch.values is not None
    assert batch.bootstrap_values is not None and batch.old_logprobs is not None
    return batch.replace(
        rewards=torch.where(bad, nan, batch.rewards),
        reward_status=status,
        end=end,
        token_rewards=torch.where(nan_rows, nan, batch.token_rewards),
        values=torch.where(nan_rows, nan, batch.values),
        bootstrap_values=torch.where(bad, nan, batch.bootstrap_values),
        old_logprobs=torch.where(nan_rows, nan, batch.old_logprobs),
    )


@pytest.mark.parametrize(("name", "unit"), CASES)
def test_invalid_rows_get_zero_and_do_not_influence_other_rows(
    name: str, unit: Literal["token", "turn"]
) -> None:
    # Groups of 3 so that each group keeps >= 2 valid members when one row is spoiled.
    batch = random_batch(1, b=9, group=3)
    bad = torch.tensor([True, False, False, False, False, True, False, False, False])
    spoiled = _spoil(batch, bad)
    credit = registry.get(name).fn(spoiled, _params(name, unit))
    assert torch.all(credit.advantages[bad] == 0)
    assert torch.isfinite(credit.advantages).all()
    # The valid rows alone give the same advantages: the invalid rows influenced nothing.
    alone = registry.get(name).fn(batch.select(~bad), _params(name, unit))
    torch.testing.assert_close(credit.advantages[~bad], alone.advantages)
    for key, value in credit.diagnostics.items():
        torch.testing.assert_close(value, alone.diagnostics[key], equal_nan=True, msg=key)
    if credit.returns is not None:
        assert alone.returns is not None
        assert torch.all(credit.returns[bad] == 0)
        torch.testing.assert_close(credit.returns[~bad], alone.returns)


@pytest.mark.parametrize("name", CRITIC)
def test_critic_estimators_without_values_raise_config_error(name: str) -> None:
    batch = random_batch(2).replace(values=None)
    with pytest.raises(ConfigError, match=rf"critic\.enabled: estimator '{name}'.*values"):
        registry.get(name).fn(batch, _params(name))


@pytest.mark.parametrize("name", CRITIC)
def test_truncated_rows_without_bootstrap_values_raise_config_error(name: str) -> None:
    batch = random_batch(3).replace(bootstrap_values=None, end=torch.full((8,), int(End.TRUNCATED)))
    with pytest.raises(ConfigError, match="bootstrap_values"):
        registry.get(name).fn(batch, _params(name))
    terminal = batch.replace(end=torch.full((8,), int(End.TERMINAL)))
    registry.get(name).fn(terminal, _params(name))  # no bootstrap needed: no error


def test_params_defaults_and_derived_values() -> None:
    p = CreditParams()
    assert (p.estimator, p.gamma, p.lam, p.std_eps) == ("grpo", 1.0, 0.95, 1e-6)
    assert (p.rho_bar, p.c_bar, p.rho_bar_pg, p.time_unit) == (1.0, 1.0, 1.0, "token")
    assert p.resolved_lam_critic == p.resolved_lam_policy == 0.95
    assert p.resolved_length_unit == "token"
    q = CreditParams(lam_critic=1.0, lam_policy=0.9, time_unit="turn")
    assert (q.resolved_lam_critic, q.resolved_lam_policy, q.resolved_length_unit) == (
        1.0,
        0.9,
        "turn",
    )
    c = CriticParams()
    assert (c.enabled, c.value_clip, c.updates_per_step, c.warmup_steps, c.pretrain_mc) == (
        False,
        0.5,
        1,
        0,
        False,
    )
    assert dataclasses.is_dataclass(p) and dataclasses.fields(p)[0].name == "estimator"
