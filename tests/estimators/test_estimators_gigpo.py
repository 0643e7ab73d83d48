"""GiGPO's group baselines over turns (``sampling.group_scope=turn``, docs/formulas.md §2.4).

The worked example of the design note (two episodes of one prompt, γ = 0.95), by hand in
each normalisation; a plain reference loop over dicts against the vectorised function;
the properties (singletons, equal returns, ω = 0 is the prompt-scope estimator); the
anchor key on hand-built token rows; the config's one-line errors; and a two-step
calculator run whose advantages, as they reach the policy update, are the reference's.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from rlmap.core.batch import Batch, RewardStatus, make_batch
from rlmap.core.errors import ConfigError
from rlmap.estimators import (
    CreditParams,
    TurnIndex,
    anchor_ids,
    dr_grpo_advantages,
    gigpo_advantages,
    grpo_advantages,
    registry,
    rloo_advantages,
    turn_groups,
)
from rlmap.estimators.gigpo import Baseline, anchor_diagnostics
from rlmap.recipes import build_config
from rlmap.recipes.explain import composition

EPS = 1e-6
BASELINES: dict[str, Baseline] = {
    "grpo": partial(grpo_advantages, eps=EPS),
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
}

# ------------------------------------------------------------------ the worked example

# Episode 1 succeeds at its 3rd turn (r = 0, 0, 1) through states s0, s1, s2; episode 2
# fails (r = 0, 0, 0) through s0, s1, s3. Anchor ids: s0 = 0, s1 = 1, s2 = 2, s3 = 3.
REWARDS = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
ANCHORS = torch.tensor([[0, 1, 2], [0, 1, 3]])
ONE_GROUP, BOTH_VALID = torch.tensor([0, 0]), torch.tensor([True, True])


def _example(baseline: Baseline, rewards: Tensor = REWARDS, anchors: Tensor = ANCHORS) -> Any:
    mask = torch.ones_like(anchors, dtype=torch.bool)
    return gigpo_advantages(
        rewards, mask, ONE_GROUP, BOTH_VALID, anchors, baseline=baseline, omega=1.0, gamma=0.95
    )


def test_the_worked_example_mean_only() -> None:
    out = _example(dr_grpo_advantages)
    # G_1 = (0.95², 0.95, 1) = (0.9025, 0.95, 1); G_2 = (0, 0, 0)
    torch.testing.assert_close(out.returns, torch.tensor([[0.9025, 0.95, 1.0], [0.0, 0.0, 0.0]]))
    # episode: R = (1, 0), mean 0.5 → A^E = ±0.5
    torch.testing.assert_close(out.episode, torch.tensor([0.5, -0.5]))
    # s0: G = {0.9025, 0}, mean 0.45125 → ±0.45125; s1: {0.95, 0}, mean 0.475 → ±0.475;
    # s2 and s3 hold one turn each → 0
    torch.testing.assert_close(
        out.step, torch.tensor([[0.45125, 0.475, 0.0], [-0.45125, -0.475, 0.0]])
    )
    # A = A^E + 1·A^S: (0.5 + 0.45125, 0.5 + 0.475, 0.5 + 0) = (0.95125, 0.975, 0.5)
    want = torch.tensor([[0.95125, 0.975, 0.5], [-0.95125, -0.975, -0.5]])
    torch.testing.assert_close(out.advantages, want)


def test_the_worked_example_mean_std() -> None:
    out = _example(BASELINES["grpo"])
    # episode: R = (1, 0), unbiased std √((0.5² + 0.5²)/1) = √0.5 = 0.70711, so
    # A^E = ±0.5/0.70711 = ±0.70711 (verl-agent's std over 6 step rows, √(6·0.25/5) = 0.54772,
    # gives ±0.91287: here each trajectory weighs one)
    half = 1 / math.sqrt(2)
    torch.testing.assert_close(out.episode, torch.tensor([half, -half]), atol=1e-5, rtol=0)
    # a two-member step group {x, 0}: centred ±x/2 over std x/√2 → ±1/√2 = ±0.70711
    torch.testing.assert_close(
        out.step, torch.tensor([[half, half, 0.0], [-half, -half, 0.0]]), atol=1e-5, rtol=0
    )
    # A_1 = (0.70711 + 0.70711, 0.70711 + 0.70711, 0.70711) = (1.41421, 1.41421, 0.70711)
    root2 = math.sqrt(2)
    want = torch.tensor([[root2, root2, half], [-root2, -root2, -half]])
    torch.testing.assert_close(out.advantages, want, atol=1e-5, rtol=0)


def test_the_worked_example_leave_one_out() -> None:
    out = _example(rloo_advantages)
    # leave-one-out over two members: R_i − R_j. A^E = ±1; s0: ±0.9025; s1: ±0.95
    # A_1 = (1 + 0.9025, 1 + 0.95, 1 + 0) = (1.9025, 1.95, 1)
    want = torch.tensor([[1.9025, 1.95, 1.0], [-1.9025, -1.95, -1.0]])
    torch.testing.assert_close(out.advantages, want)


def test_each_trajectory_weighs_one_in_the_episode_baseline() -> None:
    # The note's row-weighting case: episode 2 fails in 5 turns (s0, s1, s3, s4, s5).
    # verl-agent weighs rows = steps: baseline (3·1 + 5·0)/8 = 3/8, A^E = +0.625 / −0.375.
    # rlmap weighs trajectories: baseline (1 + 0)/2 = 1/2, A^E = ±0.5 as before.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    anchors = torch.tensor([[0, 1, 2, -1, -1], [0, 1, 3, 4, 5]])
    mask = torch.tensor([[True] * 3 + [False] * 2, [True] * 5])
    out = gigpo_advantages(
        rewards,
        mask,
        ONE_GROUP,
        BOTH_VALID,
        anchors,
        baseline=dr_grpo_advantages,
        omega=1.0,
        gamma=0.95,
    )
    torch.testing.assert_close(out.episode, torch.tensor([0.5, -0.5]))
    # the step level is as before for s0, s1; s3, s4, s5 are singletons: A = A^E = −0.5
    want = torch.tensor([[0.95125, 0.975, 0.5, 0.0, 0.0], [-0.95125, -0.975, -0.5, -0.5, -0.5]])
    torch.testing.assert_close(out.advantages, want)


# ------------------------------------------------------------------ the reference loop


@dataclass
class Row:
    """A trajectory for the reference loop: its group, validity, and per-turn (r, anchor)."""

    group: int
    valid: bool
    rewards: list[float]
    keys: list[Hashable]


def _centre(values: Sequence[float], kind: str) -> list[float]:
    """One group's baseline, by the definitions (docs/formulas.md §2): n < 2 gives 0."""
    n = len(values)
    if n < 2:
        return [0.0] * n
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    if kind == "grpo":
        return [(v - mean) / (std + EPS) for v in values]
    if kind == "rloo":
        return [v - (sum(values) - v) / (n - 1) for v in values]
    return [v - mean for v in values]


def reference(rows: Sequence[Row], kind: str, *, omega: float, gamma: float) -> list[list[float]]:
    """GiGPO turn by turn with Python lists and dicts (0 for every turn of an invalid row)."""
    episodes: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        if row.valid:
            episodes.setdefault(row.group, []).append(i)
    a_e = [0.0] * len(rows)
    for trajectories in episodes.values():
        totals = [sum(rows[i].rewards) for i in trajectories]
        for i, a in zip(trajectories, _centre(totals, kind), strict=True):
            a_e[i] = a
    returns: list[list[float]] = []
    for row in rows:
        out, running = [], 0.0
        for r in reversed(row.rewards):
            running = r + gamma * running
            out.append(running)
        returns.append(out[::-1])
    steps: dict[tuple[int, Hashable], list[tuple[int, int]]] = {}
    for i, row in enumerate(rows):
        for k, key in enumerate(row.keys):
            if row.valid:
                steps.setdefault((row.group, key), []).append((i, k))
    a_s: dict[tuple[int, int], float] = {}
    for members in steps.values():
        centred = _centre([returns[i][k] for i, k in members], kind)
        a_s.update(zip(members, centred, strict=True))
    return [
        [a_e[i] + omega * a_s[(i, k)] if row.valid else 0.0 for k in range(len(row.keys))]
        for i, row in enumerate(rows)
    ]


def _random_rows(seed: int) -> list[Row]:
    """4 groups of 4 trajectories, 1-4 turns each, anchors from a small set (so states repeat
    within a group and the same anchor number appears in other groups), some invalid rows."""
    rng = random.Random(seed)
    rows = []
    for g in range(4):
        for _ in range(4):
            n = rng.randint(1, 4)
            rewards = [rng.choice([0.0, 0.0, 0.5, 1.0, -1.0]) for _ in range(n)]
            keys: list[Hashable] = [rng.randint(0, 2) for _ in range(n)]
            rows.append(Row(g, rng.random() > 0.15, rewards, keys))
    return rows


def _tensors(rows: Sequence[Row]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    k = max(len(r.keys) for r in rows) + 1  # one slot no row uses: a missing turn everywhere
    rewards, anchors = torch.zeros(len(rows), k), torch.full((len(rows), k), -1)
    mask = torch.zeros(len(rows), k, dtype=torch.bool)
    for i, row in enumerate(rows):
        n = len(row.keys)
        rewards[i, :n] = torch.tensor(row.rewards)
        anchors[i, :n] = torch.tensor([int(key) for key in row.keys])  # type: ignore[call-overload]
        mask[i, :n] = True
    if not rows[0].valid:
        rewards[0] = float("nan")  # an invalid row's rewards may be garbage
    group = torch.tensor([r.group for r in rows])
    valid = torch.tensor([r.valid for r in rows])
    return rewards, mask, group, valid, anchors


@pytest.mark.parametrize("kind", sorted(BASELINES))
@pytest.mark.parametrize("seed", range(5))
def test_the_vectorised_function_equals_the_reference_loop(kind: str, seed: int) -> None:
    rows = _random_rows(seed)
    rows[0].valid = seed % 2 == 0  # and an invalid row with NaN rewards on odd seeds
    rewards, mask, group, valid, anchors = _tensors(rows)
    out = gigpo_advantages(
        rewards, mask, group, valid, anchors, baseline=BASELINES[kind], omega=0.7, gamma=0.9
    )
    want = reference(rows, kind, omega=0.7, gamma=0.9)
    for i, row in enumerate(rows):
        n = len(row.keys)
        torch.testing.assert_close(
            out.advantages[i, :n], torch.tensor(want[i]), atol=1e-4, rtol=1e-4, msg=f"row {i}"
        )
        assert torch.all(out.advantages[i, n:] == 0)
    assert torch.isfinite(out.advantages).all()


# ------------------------------------------------------------------ properties


def test_a_singleton_step_group_and_equal_returns_give_no_step_advantage() -> None:
    rows = _random_rows(7)
    rewards, mask, group, valid, anchors = _tensors(rows)
    valid[:] = True
    unique = torch.arange(anchors.numel()).view_as(anchors)  # every turn its own state
    out = gigpo_advantages(rewards, mask, group, valid, unique, baseline=BASELINES["grpo"])
    assert torch.all(out.step == 0)
    torch.testing.assert_close(out.advantages, torch.where(mask, out.episode[:, None], 0.0))
    # one shared state per group, every return the same (r = 0.25 on the last turn, γ = 1)
    last = mask & ~torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1)
    equal = torch.where(last, 0.25, 0.0)
    out = gigpo_advantages(
        equal, mask, group, valid, torch.zeros_like(anchors), baseline=BASELINES["grpo"]
    )
    assert torch.all(out.step == 0) and torch.all(out.advantages == 0)
    d = anchor_diagnostics(out.returns, mask, group, torch.zeros_like(anchors))
    assert d["group/anchor_groups"] == 4  # one per group
    assert d["group/anchor_zero_adv_frac"] == 1.0 and d["group/anchor_turn_frac"] == 1.0


def test_an_anchor_never_joins_two_prompts() -> None:
    # the same anchor id in two groups of two: group 0 returns (1, 0), group 1 (0, 0)
    rewards = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    out = gigpo_advantages(
        rewards,
        torch.ones(4, 1, dtype=torch.bool),
        torch.tensor([0, 0, 1, 1]),
        torch.ones(4, dtype=torch.bool),
        torch.zeros(4, 1, dtype=torch.long),
        baseline=dr_grpo_advantages,
    )
    # within group 0: ±0.5 (not 1 − 0.25 = 0.75 as one pooled group of four would give)
    torch.testing.assert_close(out.step[:, 0], torch.tensor([0.5, -0.5, 0.0, 0.0]))


def _multi_turn_batch(seed: int) -> Batch:
    """Groups of 3 rows: prompt (2 tokens, left-padded), then action/observation runs with
    tokens from a tiny vocabulary (so observation histories repeat), per-turn rewards."""
    gen = torch.Generator().manual_seed(seed)
    b, t = 9, 14
    pos = torch.arange(t).expand(b, t)
    start = 2 - torch.randint(0, 2, (b, 1), generator=gen)  # 0 or 1 pad tokens in front
    tokens = torch.randint(1, 3, (b, t), generator=gen)
    tokens[:, :2] = (torch.arange(b) // 3 + 5).unsqueeze(-1)  # the group's prompt
    tokens = torch.where(pos < start - 1, 0, tokens)
    runs = (pos >= 2) & (((pos - 2) // 3) % 2 == 0)  # action runs of 3, observations between
    cut = torch.randint(6, t + 1, (b, 1), generator=gen)
    action = runs & (pos < cut)
    turn_id = torch.where(action, (pos - 2) // 6, -1)
    token_rewards = torch.where(action, torch.randn(b, t, generator=gen), 0.0)
    batch = make_batch(
        action,
        token_rewards.sum(-1),
        group_id=torch.arange(b) // 3,
        turn_id=turn_id,
        token_rewards=token_rewards,
        attention_mask=pos >= start - 1,
    )
    return batch.replace(tokens=tokens)


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_omega_zero_is_the_prompt_scope_estimator(name: str) -> None:
    batch = _multi_turn_batch(0)
    scoped = batch.replace(turn_group=turn_groups(batch))
    fn = registry.get(name).fn
    got = fn(scoped, CreditParams(estimator=name, step_advantage_weight=0.0))
    want = fn(batch, CreditParams(estimator=name))
    torch.testing.assert_close(got.advantages, want.advantages)
    assert (
        "group/anchor_groups" in got.diagnostics and "group/anchor_groups" not in want.diagnostics
    )
    # and ω = 1 does change them (the step level is there)
    moved = fn(scoped, CreditParams(estimator=name))
    assert not torch.allclose(moved.advantages, want.advantages)


def test_one_turn_episodes_get_twice_the_episode_advantage() -> None:
    # Every episode one turn: its state is the prompt, shared by its group, and with γ = 1
    # G_{i,0} = R_i, so A^S = A^E and A = A^E + 1·A^E = 2·A^E.
    batch = make_batch(
        torch.ones(6, 3, dtype=torch.bool),
        torch.tensor([1.0, 0, 0, 1, 1, 0]),
        group_id=torch.tensor([0, 0, 0, 1, 1, 1]),
    )
    scoped = batch.replace(turn_group=turn_groups(batch))
    got = registry.get("grpo").fn(scoped, CreditParams())
    want = registry.get("grpo").fn(batch, CreditParams())
    torch.testing.assert_close(got.advantages, 2 * want.advantages)


def test_invalid_rows_get_zero_and_do_not_move_the_others() -> None:
    batch = _multi_turn_batch(1)
    bad = torch.tensor([False, True, False, False, False, False, True, False, False])
    assert batch.token_rewards is not None
    spoiled = batch.replace(
        reward_status=torch.where(bad, int(RewardStatus.INFRA_ERROR), batch.reward_status),
        token_rewards=torch.where(bad.unsqueeze(-1), float("nan"), batch.token_rewards),
    )
    params = CreditParams(gamma=0.9, time_unit="turn")
    got = registry.get("grpo").fn(spoiled.replace(turn_group=turn_groups(spoiled)), params)
    alone = batch.select(~bad)
    want = registry.get("grpo").fn(alone.replace(turn_group=turn_groups(alone)), params)
    assert torch.all(got.advantages[bad] == 0)
    torch.testing.assert_close(got.advantages[~bad], want.advantages)
    for key, value in want.diagnostics.items():
        torch.testing.assert_close(got.diagnostics[key], value, msg=key)


# ------------------------------------------------------------------ the anchor key


def test_equal_observation_histories_share_an_id_within_a_prompt_only() -> None:
    # P = prompt token, a/b = action tokens, o/q = observation tokens, 0 = padding.
    #            0  1  2  3  4  5  6
    # row 0:     P  a  a  o  a  0  0     turn 1 after observation o
    # row 1:     P  b  o  b  b  0  0     other actions, the same observation o
    # row 2:     P  a  a  q  a  0  0     the same actions, another observation q
    # row 3:     P  a  a  o  a  0  0     row 0's tokens exactly, in another group
    # row 4:     0  P  a  a  o  a  0     row 0 left-padded by one, in row 0's group
    P, a, b, o, q = 7, 1, 2, 3, 4
    tokens = torch.tensor(
        [
            [P, a, a, o, a, 0, 0],
            [P, b, o, b, b, 0, 0],
            [P, a, a, q, a, 0, 0],
            [P, a, a, o, a, 0, 0],
            [0, P, a, a, o, a, 0],
        ]
    )
    action = torch.tensor(
        [
            [0, 1, 1, 0, 1, 0, 0],
            [0, 1, 0, 1, 1, 0, 0],
            [0, 1, 1, 0, 1, 0, 0],
            [0, 1, 1, 0, 1, 0, 0],
            [0, 0, 1, 1, 0, 1, 0],
        ]
    ).bool()
    turns = torch.where(
        action,
        torch.tensor(
            [
                [-1, 0, 0, -1, 1, -1, -1],
                [-1, 0, -1, 1, 1, -1, -1],
                [-1, 0, 0, -1, 1, -1, -1],
                [-1, 0, 0, -1, 1, -1, -1],
                [-1, -1, 0, 0, -1, 1, -1],
            ]
        ),
        -1,
    )
    real = tokens != 0
    group = torch.tensor([0, 0, 0, 1, 0])
    index = TurnIndex.build(turns, action)
    ids = anchor_ids(tokens, real & ~action, index, group)
    first, second = ids[:, 0], ids[:, 1]
    # turn 0: the prompt alone; groups 0 share it, group 1 has its own
    assert first[0] == first[1] == first[2] == first[4] and first[3] != first[0]
    # turn 1: (P, o) for rows 0, 1 and 4 whatever the actions and padding; (P, q) differs;
    # row 3 has row 0's tokens but another prompt's group
    assert second[0] == second[1] == second[4]
    assert len({int(second[0]), int(second[2]), int(second[3]), int(first[0]), int(first[3])}) == 5
    assert torch.all(ids[:, 2:] == -1)  # no third turn
    # the batch-level wrapper puts the ids on the turns' action tokens, −1 elsewhere
    batch = make_batch(
        action, torch.zeros(5), group_id=group, turn_id=turns, attention_mask=real
    ).replace(tokens=tokens)
    per_token = turn_groups(batch)
    assert torch.equal(per_token[action], ids.gather(1, index.slot_BT)[action])
    assert torch.all(per_token[~action] == -1)


# ------------------------------------------------------------------ config

CALC = ["data.task=calculator", "sampling.group_scope=turn"]


def test_the_scope_is_accepted_where_it_means_something_and_shown() -> None:
    cfg = build_config(
        "grpo",
        None,
        [*CALC, "credit.gamma=0.95", "credit.time_unit=turn", "credit.step_advantage_weight=0.5"],
    )
    assert (cfg.sampling.group_scope, cfg.credit.step_advantage_weight) == ("turn", 0.5)
    line = composition(cfg)
    assert "turn groups" in line and "A_episode + 0.5·A_step (γ=0.95 per turn)" in line
    assert build_config("grpo", None, []).sampling.group_scope == "prompt"
    assert "turn groups" not in composition(build_config("grpo", None, []))
    for name in ("dr_grpo", "rloo"):
        build_config("grpo", None, [*CALC, f"credit.estimator={name}"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([*CALC, "sampling.group_size=1"], r"^sampling\.group_size: .*G >= 2"),
        (["sampling.group_scope=turn"], r"^sampling\.group_scope: turn groups .*'arithmetic'"),
        ([*CALC, "data.max_turns=1"], r"^sampling\.group_scope: .*data\.max_turns=1"),
        (
            [*CALC, "credit.estimator=reinforce_pp_baseline"],
            r"^sampling\.group_scope: .*'reinforce_pp_baseline' has none "
            r"\(use rloo, grpo, dr_grpo\)",
        ),
        ([*CALC, "credit.estimator=reinforce"], r"^sampling\.group_scope: .*'reinforce'"),
        (
            ["credit.step_advantage_weight=0.5"],
            r"^credit\.step_advantage_weight: only sampling\.group_scope=turn",
        ),
        ([*CALC, "credit.step_advantage_weight=-1"], r"^credit\.step_advantage_weight: must be >="),
        ([*CALC, "credit.gamma=0.9"], r"^credit\.time_unit: .*per turn"),
        (["sampling.group_scope=episode"], r"^sampling\.group_scope: "),
    ],
)
def test_a_scope_that_cannot_work_is_refused_in_one_line(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        build_config("grpo", None, overrides)
    assert "\n" not in str(caught.value)


# ------------------------------------------------------------------ a training run


def _rows_of(batch: Batch) -> tuple[list[Row], list[list[list[int]]]]:
    """The batch as reference rows (keys read token by token: the real non-action tokens
    before each turn's first action token) and each turn's token positions."""
    rows, places = [], []
    attention = batch.attention_mask
    assert attention is not None
    for i in range(batch.size):
        turns: dict[int, list[int]] = {}
        for t in range(batch.tokens.shape[1]):
            if batch.action_mask[i, t]:
                turns.setdefault(int(batch.turns[i, t]), []).append(t)
        keys: list[Hashable] = []
        rewards: list[float] = []
        for k in sorted(turns):
            first = turns[k][0]
            keys.append(
                tuple(
                    int(batch.tokens[i, t])
                    for t in range(first)
                    if attention[i, t] and not batch.action_mask[i, t]
                )
            )
            rewards.append(float(sum(batch.step_rewards[i, t] for t in turns[k])))
        rows.append(Row(int(batch.group_id[i]), bool(batch.valid[i]), rewards, keys))
        places.append([turns[k] for k in sorted(turns)])
    return rows, places


def _reference_on_batch(batch: Batch) -> Tensor:
    """(B, T): the reference loop's GiGPO advantages (grpo, γ = 1, ω = 1) on a batch."""
    rows, places = _rows_of(batch)
    want = reference(rows, "grpo", omega=1.0, gamma=1.0)
    out = torch.zeros(batch.tokens.shape)
    for i, row_places in enumerate(places):
        for k, positions in enumerate(row_places):
            out[i, positions] = want[i][k]
    return out


def _anchor_counts(batch: Batch) -> tuple[int, float]:
    """Anchor groups of two or more valid turns, and the share of valid turns in them."""
    members: dict[tuple[int, Hashable], int] = {}
    for row in _rows_of(batch)[0]:
        for key in row.keys if row.valid else []:
            members[(row.group, key)] = members.get((row.group, key), 0) + 1
    shared = [n for n in members.values() if n >= 2]
    return len(shared), sum(shared) / sum(members.values())


def test_a_calculator_run_trains_on_the_turn_scope_advantages(
    tiny_calc_model_dir: Path,
    tmp_path: Path,
    toy: Callable[..., list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlmap.experiments.train import run_training
    from rlmap.system import learner_step, rounds

    seen: list[tuple[Batch, Tensor]] = []
    real = learner_step.update_policy

    def spy(
        model: Any,
        optimizer: Any,
        scheduler: Any,
        batch: Batch,
        advantages: Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        seen.append((batch, advantages.detach().cpu()))
        return real(model, optimizer, scheduler, batch, advantages, *args, **kwargs)

    monkeypatch.setattr(learner_step, "update_policy", spy)
    # The random model never answers right; a reward of the first turn's length parity gives
    # the groups rewards that differ, so the advantages are not all 0.
    score = rounds.score_episodes

    def parity(base: Any, shaping: Any, trajectories: Sequence[Any]) -> list[Any]:
        return [
            replace(v, reward=float(len(t.turns[0]) % 2), per_turn=None)
            for t, v in zip(trajectories, score(base, shaping, trajectories), strict=True)
        ]

    monkeypatch.setattr(rounds, "score_episodes", parity)
    overrides = [
        *toy(tiny_calc_model_dir),
        *CALC,
        "data.max_turns=2",
        "generation.max_new_tokens=6",
    ]
    run_training(build_config("grpo", None, overrides), tmp_path / "run")
    assert seen, "no policy update ran"
    for batch, advantages in seen:
        assert batch.turn_group is not None  # the scope put its groups in the batch
        torch.testing.assert_close(advantages, _reference_on_batch(batch), atol=1e-4, rtol=1e-4)
        prompt_scope = registry.get("grpo").fn(batch.replace(turn_group=None), CreditParams())
        assert advantages.abs().sum() > 0
        assert not torch.allclose(advantages, prompt_scope.advantages)  # the step level is in
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if "loss/policy" in r]
    assert steps
    assert len(steps) == len(seen)
    for record, (batch, _) in zip(steps, seen, strict=True):
        # 2 prompts × G = 4: each prompt's first turns share its state (one anchor group each),
        # and a later turn joins a group only where two samples saw the same observations
        groups, frac = _anchor_counts(batch)
        assert groups >= 2 and frac > 0
        assert record["group/anchor_groups"] == groups
        assert record["group/anchor_turn_frac"] == pytest.approx(frac)
