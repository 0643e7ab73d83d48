"""Credit across segment boundaries (docs/formulas.md §2.5): hand cases, a reference loop,
the λ = 0 identity, and per-episode group statistics."""

from __future__ import annotations

import math

import pytest
import torch

from rlmap.core.batch import Batch, End, make_batch
from rlmap.estimators import CreditParams, registry
from rlmap.estimators.segments import (
    boundary_bootstrap,
    continued_returns,
    episode_view,
    next_segment_rows,
)

X = 7.0  # a value off the action mask: read by nothing

TRUNC, TERM = int(End.TRUNCATED), int(End.TERMINAL)


def _two_segments(values: list[float], rewards: list[float]) -> Batch:
    """One episode of four action steps a0 a1 | a2 a3 cut after a1 into two rows:
    segment 0 = [prompt, a0, a1, obs], segment 1 = [prompt, carried, a2, a3]. ``values`` and
    ``rewards`` are per step (a0..a3). Row 0's bootstrap value is a wrong 9.0 (the critic's
    value at its last real token): the boundary rule must replace it."""
    v, r = values, rewards
    return make_batch(
        torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]]),
        torch.tensor([r[0] + r[1], r[2] + r[3]]),
        group_id=torch.tensor([0, 0]),
        end=torch.tensor([TRUNC, TERM]),
        values=torch.tensor([[X, v[0], v[1], X], [X, X, v[2], v[3]]]),
        token_rewards=torch.tensor([[0.0, r[0], r[1], 0.0], [0.0, 0.0, r[2], r[3]]]),
        bootstrap_values=torch.tensor([9.0, 0.0]),
        episode_id=torch.tensor([0, 0]),
        segment=torch.tensor([0, 1]),
    )


def _unsegmented(values: list[float], rewards: list[float]) -> Batch:
    """The same four steps as one row [prompt, a0, a1, obs, a2, a3], terminal."""
    v, r = values, rewards
    return make_batch(
        torch.tensor([[0, 1, 1, 0, 1, 1]]),
        torch.tensor([sum(r)]),
        values=torch.tensor([[X, v[0], v[1], X, v[2], v[3]]]),
        token_rewards=torch.tensor([[0.0, r[0], r[1], 0.0, r[2], r[3]]]),
    )


def _steps(adv_BT: torch.Tensor, batch: Batch) -> list[float]:
    """The advantages at the action steps, row after row (segments in order)."""
    return adv_BT[batch.action_mask].tolist()


def reference_gae(
    rewards: list[float], values: list[float], *, gamma: float, lam: float, stop_after: int
) -> list[float]:
    """Unsegmented GAE, a plain loop, with the trace stopped after step ``stop_after``
    (c = 0 there) and b = 1: δ there still bootstraps from V of the next step."""
    n, adv, running = len(rewards), [0.0] * len(rewards), 0.0
    for t in reversed(range(n)):
        following = values[t + 1] if t + 1 < n else 0.0  # terminal after the last step
        delta = rewards[t] + gamma * following - values[t]
        running = delta + (0.0 if t == stop_after else gamma * lam * running)
        adv[t] = running
    return adv


def test_gae_on_two_segments_by_hand() -> None:
    # γ = 1, λ = 0.5; r = (0, 0, 0, 1) (the outcome on the last segment); V = (0.5, 0.5,
    # 0.25, 0.5), V(a2) = 0.25 being the critic's value at segment 1's first action token.
    # Segment 1 (terminal):  δ_3 = 1 − 0.5 = 0.5,            Â_3 = 0.5
    #                        δ_2 = 0 + 0.5 − 0.25 = 0.25,     Â_2 = 0.25 + 0.5·0.5 = 0.5
    # Segment 0 (boundary: b = 1 with V(s_0^1) = 0.25, not row 0's 9.0; c = 0):
    #                        δ_1 = 0 + 0.25 − 0.5 = −0.25,    Â_1 = −0.25 (the trace stops)
    #                        δ_0 = 0 + 0.5 − 0.5 = 0,         Â_0 = 0 + 0.5·(−0.25) = −0.125
    # Unsegmented, the trace runs on: Â_1 = −0.25 + 0.5·0.5 = 0, Â_0 = 0 + 0.5·0 = 0.
    # Critic targets Â + V: (0.375, 0.25 | 0.75, 1.0).
    values, rewards = [0.5, 0.5, 0.25, 0.5], [0.0, 0.0, 0.0, 1.0]
    params = CreditParams(estimator="gae", gamma=1.0, lam=0.5)
    segmented = _two_segments(values, rewards)
    credit = registry.get("gae").fn(segmented, params)
    assert _steps(credit.advantages, segmented) == [-0.125, -0.25, 0.5, 0.5]
    assert credit.returns is not None
    assert _steps(credit.returns, segmented) == [0.375, 0.25, 0.75, 1.0]
    whole = _unsegmented(values, rewards)
    assert _steps(registry.get("gae").fn(whole, params).advantages, whole) == [0, 0, 0.5, 0.5]
    # the unsegmented trajectory with the trace stopped after a1 and V(a2) kept
    assert _steps(credit.advantages, segmented) == reference_gae(
        rewards, values, gamma=1.0, lam=0.5, stop_after=1
    )


def test_turn_gae_bootstraps_from_the_next_segments_first_turn() -> None:
    # One turn per segment here (a0 a1 and a2 a3): turn values V(a0) = 0.5, V(a2) = 0.25,
    # turn rewards 0 and 1; γ = 1, λ = 0.5. Turn 1: Â = 1 − 0.25 = 0.75. Turn 0 (boundary):
    # δ = 0 + 0.25 − 0.5 = −0.25, the trace stopped: Â = −0.25, on both of its tokens.
    values, rewards = [0.5, 0.5, 0.25, 0.5], [0.0, 0.0, 0.0, 1.0]
    params = CreditParams(estimator="gae", gamma=1.0, lam=0.5, time_unit="turn")
    segmented = _two_segments(values, rewards)
    credit = registry.get("gae").fn(segmented, params)
    assert _steps(credit.advantages, segmented) == [-0.25, -0.25, 0.75, 0.75]


def test_vtrace_bootstraps_from_the_next_segment_with_the_trace_stopped() -> None:
    # π = μ (every ratio 1, so ρ = c = 1); γ = 1; the same steps as the GAE case.
    # Segment 1: v_3 = 1 (terminal), v_2 = V_2 + δ_2 + (v_3 − V_3) = 0.25 + 0.25 + 0.5 = 1;
    #   A_3 = 1 − 0.5 = 0.5, A_2 = 0 + v_3 − V_2 = 0.75.
    # Segment 0: after a1 v = V = V(s_0^1) = 0.25: v_1 = 0.5 + (0.25 − 0.5) = 0.25,
    #   v_0 = 0.5 + 0 + (v_1 − V_1) = 0.25; A_1 = 0.25 − 0.5 = −0.25, A_0 = v_1 − V_0 = −0.25.
    values, rewards = [0.5, 0.5, 0.25, 0.5], [0.0, 0.0, 0.0, 1.0]
    segmented = _two_segments(values, rewards)
    credit = registry.get("vtrace").fn(segmented, CreditParams(estimator="vtrace", gamma=1.0))
    assert _steps(credit.advantages, segmented) == [-0.25, -0.25, 0.75, 0.5]
    assert credit.returns is not None
    assert _steps(credit.returns, segmented) == [0.25, 0.25, 1.0, 1.0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_with_lambda_zero_segmented_and_unsegmented_advantages_are_identical(seed: int) -> None:
    # TD(0): Â_t = r_t + γ V_{t+1} − V_t, and the boundary's V_{t+1} is V(s_0^{k+1}):
    # nothing else crosses it, so the cut changes no advantage and no critic target
    g = torch.Generator().manual_seed(seed)
    values, rewards = torch.rand(4, generator=g).tolist(), torch.rand(4, generator=g).tolist()
    params = CreditParams(estimator="gae", gamma=0.9, lam=0.0)
    segmented, whole = _two_segments(values, rewards), _unsegmented(values, rewards)
    a, b = (registry.get("gae").fn(x, params) for x in (segmented, whole))
    torch.testing.assert_close(a.advantages[segmented.action_mask], b.advantages[whole.action_mask])
    assert a.returns is not None and b.returns is not None
    torch.testing.assert_close(a.returns[segmented.action_mask], b.returns[whole.action_mask])


def test_the_boundary_rule_links_rows_by_episode_and_index_not_by_row_order() -> None:
    # rows out of order: episode 5's segments 1, 0; episode 3's only row; episode 5's 2
    episode, segment = torch.tensor([5, 5, 3, 5]), torch.tensor([1, 0, 0, 2])
    assert next_segment_rows(episode, segment).tolist() == [3, 0, -1, -1]
    values = torch.tensor([[X, 0.1, 0.2], [X, 0.3, X], [0.4, X, X], [X, X, 0.6]])
    mask = values != X
    bootstrap, boundary = boundary_bootstrap(
        values, mask, episode, segment, torch.tensor([9.0, 9.0, 9.0, 9.0])
    )
    # row 0 (segment 1) → row 3's first value 0.6; row 1 (segment 0) → row 0's 0.1
    torch.testing.assert_close(bootstrap, torch.tensor([0.6, 0.1, 9.0, 9.0]))
    assert boundary.tolist() == [True, True, False, False]
    # select keeps the link: the same rows, reordered, give the same answers
    order = torch.tensor([3, 2, 1, 0])
    again, _ = boundary_bootstrap(
        values[order], mask[order], episode[order], segment[order], torch.full((4,), 9.0)
    )
    torch.testing.assert_close(again, bootstrap[order])


# --- per-episode statistics ---------------------------------------------------------------


def _three_and_one(estimator_rewards: list[float] | None = None) -> Batch:
    """One group of two episodes: X in three segments (rows 0-2), Y in one (row 3); one
    action token per row. X's rows earn 0.5, 0, 0.5 (R_X = 1); Y's earns 0 (R_Y = 0)."""
    r = estimator_rewards or [0.5, 0.0, 0.5, 0.0]
    return make_batch(
        torch.tensor([[1], [1], [1], [1]]),
        torch.tensor([1.0, 1.0, 1.0, 0.0]),  # the episode's reward on each of its rows
        group_id=torch.tensor([0, 0, 0, 0]),
        end=torch.tensor([TRUNC, TRUNC, TRUNC, TERM]),
        token_rewards=torch.tensor([[x] for x in r]),
        episode_id=torch.tensor([0, 0, 0, 1]),
        segment=torch.tensor([0, 1, 2, 0]),
    )


@pytest.mark.parametrize(
    ("name", "x", "y"),
    [
        # per episode: R = (1, 0), mean 0.5, unbiased std √((0.25 + 0.25)/1) = √0.5
        ("grpo", 0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)),  # ±0.70711
        ("dr_grpo", 0.5, -0.5),
        ("rloo", 1.0, -1.0),  # R_X − R_Y, R_Y − R_X
        ("reinforce", 0.5, -0.5),  # the batch mean over episodes is 0.5
    ],
)
def test_group_statistics_take_one_value_per_episode(name: str, x: float, y: float) -> None:
    # Counted per row instead, R = (1, 1, 1, 0) would give mean 0.75: grpo's X rows
    # 0.25/0.5 = 0.5 and Y's −1.5 (std √(0.75/3) = 0.5), rloo X 1 − 2/3 = 0.333…
    batch = _three_and_one()
    credit = registry.get(name).fn(batch, CreditParams(estimator=name, std_eps=0.0))
    torch.testing.assert_close(credit.advantages[:, 0], torch.tensor([x, x, x, y]))


def test_group_diagnostics_count_episodes() -> None:
    # one group: X in two segments earning 0.5 + 0.5, Y whole earning 1: every episode's
    # return is 1, so the group's advantage is zero (per row it would look mixed: 0.5, 1)
    batch = make_batch(
        torch.tensor([[1], [1], [1]]),
        torch.tensor([1.0, 1.0, 1.0]),
        group_id=torch.tensor([0, 0, 0]),
        end=torch.tensor([TRUNC, TERM, TERM]),
        token_rewards=torch.tensor([[0.5], [0.5], [1.0]]),
        episode_id=torch.tensor([0, 0, 1]),
        segment=torch.tensor([0, 1, 0]),
    )
    credit = registry.get("grpo").fn(batch, CreditParams())
    assert float(credit.diagnostics["group/zero_adv_frac"]) == 1.0
    assert float(credit.diagnostics["group/all_correct_frac"]) == 1.0
    assert credit.advantages.abs().sum() == 0


def test_reinforce_pp_returns_run_on_through_later_segments() -> None:
    # γ = 1: G(X, segment 0) = 0.5 + 0 + 0.5 = 1, G(segment 1) = 0 + 0.5 = 0.5,
    # G(segment 2) = 0.5; G(Y) = 0. Whitened over the four tokens: mean 0.5, biased
    # std √((0.25 + 0 + 0 + 0.25)/4) = √0.125: (±0.5/√0.125 = ±1.41421, 0, 0)
    credit = registry.get("reinforce_pp").fn(
        _three_and_one(), CreditParams(estimator="reinforce_pp", std_eps=0.0)
    )
    s = 0.5 / math.sqrt(0.125)
    torch.testing.assert_close(credit.advantages[:, 0], torch.tensor([s, 0.0, 0.0, -s]))


def test_continued_returns_discount_across_the_boundary_by_hand() -> None:
    # γ = 0.5, rows [a, a] → [a]: r = (0, 0 | 1); G = (0.25, 0.5 | 1): one step per action
    # token, on through the boundary
    rewards = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    g = continued_returns(rewards, mask, torch.tensor([1, -1]), gamma=0.5, segments=2)
    torch.testing.assert_close(g, torch.tensor([[0.25, 0.5], [1.0, 0.0]]))


def test_reinforce_pp_baseline_centres_per_episode() -> None:
    # centred per episode: X +0.5 (three tokens), Y −0.5 (one); whitened over the four
    # tokens: mean (1.5 − 0.5)/4 = 0.25, biased std √((3·0.0625 + 0.5625)/4) = √0.1875
    credit = registry.get("reinforce_pp_baseline").fn(
        _three_and_one(), CreditParams(estimator="reinforce_pp_baseline", std_eps=0.0)
    )
    hi, lo = 0.25 / math.sqrt(0.1875), -0.75 / math.sqrt(0.1875)
    torch.testing.assert_close(credit.advantages[:, 0], torch.tensor([hi, hi, hi, lo]))


def test_an_episode_with_an_invalid_row_is_left_out_whole() -> None:
    view = episode_view(
        torch.tensor([0.5, 0.5, 0.0]), torch.tensor([True, False, True]), torch.tensor([0, 0, 1])
    )
    assert view.counted_B.tolist() == [False, False, True]
    assert view.first_B.tolist() == [0, 0, 2]
    torch.testing.assert_close(view.returns_B, torch.tensor([0.5, 0.5, 0.0]))
