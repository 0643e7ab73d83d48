"""The reward interface: statuses, failure isolation, async, and composition."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmap.core.batch import RewardStatus
from rlmap.feedback.isolation import IsolatedVerifier
from rlmap.feedback.reward import (
    InvalidOutput,
    Reward,
    Score,
    Trajectory,
    ascore_batch,
    score_batch,
    worst,
)
from rlmap.feedback.reward_terms import (
    AsyncReward,
    FormatReward,
    LengthReward,
    OverlongPunishment,
    ProcessReward,
    VerifierReward,
    Weighted,
    compose,
)
from rlmap.feedback.verifiers import exact_match

OK, INVALID = RewardStatus.OK, RewardStatus.INVALID
INFRA, TIMEOUT = RewardStatus.INFRA_ERROR, RewardStatus.TIMEOUT


def traj(
    response: str = "42", *, reference: str = "42", length: int = 10, max_length: int = 20
) -> Trajectory:
    return Trajectory(
        prompt="q", turns=(response,), reference=reference, length=length, max_length=max_length
    )


def multi(turns: tuple[str, ...], length: int = 10) -> Trajectory:
    observations = ("obs",) * (len(turns) - 1)
    return Trajectory(
        prompt="q",
        turns=turns,
        observations=observations,
        reference="42",
        length=length,
        max_length=100,
    )


class Fixed:
    """A reward that returns what it is told, counting its calls."""

    def __init__(self, scores: Sequence[object], name: str = "fixed") -> None:
        self.scores, self.name, self.calls = scores, name, 0

    def __call__(self, batch: Sequence[Trajectory]) -> Sequence[Score]:
        self.calls += 1
        return self.scores  # type: ignore[return-value]  # garbage on purpose in some tests


class Raises:
    name = "raises"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def __call__(self, batch: Sequence[Trajectory]) -> Sequence[Score]:
        raise self.exc


class ByLength:
    """value = length of each trajectory: shows which score went to which trajectory."""

    name = "by_length"

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        return [Score(float(t.length)) for t in batch]


def values(scores: Sequence[Score]) -> list[float]:
    return [s.value for s in scores]


def statuses(scores: Sequence[Score]) -> list[RewardStatus]:
    return [s.status for s in scores]


# --- the records ---------------------------------------------------------------


def test_trajectory_response_is_the_last_turn() -> None:
    assert multi(("call tool", "the answer is 42")).response == "the answer is 42"
    empty = Trajectory(prompt="q", turns=(), reference="", length=0, max_length=1)
    assert empty.response == ""
    assert dict(empty.metadata) == {}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"length": -1, "max_length": 5},
        {"length": 0, "max_length": 0},
        {"length": 0, "max_length": 5, "observations": ("a", "b")},
    ],
)
def test_trajectory_rejects_impossible_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="Trajectory"):
        Trajectory(prompt="q", turns=("x",), reference="", **kwargs)  # type: ignore[arg-type]


def test_score_per_turn_must_sum_to_value() -> None:
    Score(0.6, per_turn=(0.1, 0.2, 0.3))  # 0.1 + 0.2 + 0.3 = 0.6 (up to rounding)
    with pytest.raises(ValueError, match="per_turn sums to"):
        Score(1.0, per_turn=(0.1, 0.2))


def test_building_blocks_are_rewards() -> None:
    # What a Reward is: a name (in logs and failure reasons) and a call on a batch. Each
    # block on one trajectory, "42" against "42", length 10 of at most 20:
    blocks: list[tuple[Reward, str, float]] = [
        (VerifierReward(exact_match), "verifier", 1.0),  # exact match
        (FormatReward(r"\d+"), "format", 1.0),  # "42" matches \d+
        (OverlongPunishment(4), "overlong", 0.0),  # 10 <= 20 − 4: within the budget
        (LengthReward(10, 5.0), "length", 0.0),  # −|10 − 10| / 5
        (Weighted(((1.0, FormatReward("x")),)), "1*format", 0.0),  # 1 · (no "x" in "42")
        (AsyncReward(_echo), "async", 10.0),  # awaited: the echoed length
        (ProcessReward(lambda t: [0.5] * len(t.turns)), "process", 0.5),  # one turn of 0.5
    ]
    for reward, name, value in blocks:
        assert reward.name == name
        (score,) = score_batch(reward, [traj()])
        assert (score.value, score.status) == (value, OK), name


# --- the building blocks -------------------------------------------------------


def test_weighted_hand_case() -> None:
    # R = 1·verifier + 0.5·format(\d+) + 1·overlong(L_max = 20, L_c = 4: free up to 16)
    #   "42", length 18: 1·1 + 0.5·1 + (16 − 18)/4 = 1 + 0.5 − 0.5  = 1.0
    #   "41", length 10: 1·0 + 0.5·1 + 0            = 0.5
    #   "x",  length 10: 1·0 + 0.5·0 + 0            = 0.0  (format miss: OK, not INVALID)
    #   "42", length 25: 1·1 + 0.5·1 − 1 (beyond)   = 0.5
    batch = [traj(length=18), traj("41"), traj("x"), traj(length=25)]
    reward = Weighted(
        (
            (1.0, VerifierReward(exact_match, "exact_match")),
            (0.5, FormatReward(r"\d+")),
            (1.0, OverlongPunishment(cache=4)),
        )
    )
    got = score_batch(reward, batch)
    assert values(got) == pytest.approx([1.0, 0.5, 0.0, 0.5])
    assert statuses(got) == [OK] * 4
    assert reward.name == "1*exact_match+0.5*format+1*overlong"
    # compose builds the same sum from config values
    same = compose(
        VerifierReward(exact_match, "exact_match"),
        format_pattern=r"\d+",
        format_weight=0.5,
        overlong_cache=4,
    )
    assert values(score_batch(same, batch)) == pytest.approx([1.0, 0.5, 0.0, 0.5])


def test_length_reward_hand_case() -> None:
    # target 100, scale 50: −|150 − 100|/50 = −1; −|75 − 100|/50 = −0.5; at target 0
    reward = LengthReward(target=100, scale=50.0)
    batch = [traj(length=150, max_length=200), traj(length=75), traj(length=100, max_length=200)]
    assert values(score_batch(reward, batch)) == [-1.0, -0.5, 0.0]


def test_overlong_per_trajectory_limit() -> None:
    # L_c = 4. L_max = 20: length 18 → (16 − 18)/4 = −0.5. L_max = 10: length 9 → (6 − 9)/4 = −0.75
    batch = [traj(length=18, max_length=20), traj(length=9, max_length=10), traj(length=3)]
    assert values(score_batch(OverlongPunishment(4), batch)) == [-0.5, -0.75, 0.0]


def test_overlong_cache_above_limit_fails_the_batch_with_reason() -> None:
    got = score_batch(OverlongPunishment(8), [traj(max_length=20), traj(max_length=5)])
    assert statuses(got) == [INFRA, INFRA]
    assert "cache <= max_len" in got[0].reason


def test_format_miss_is_ok_not_invalid() -> None:
    got = score_batch(
        FormatReward(r"<answer>\d+</answer>"), [traj(" <answer>7</answer>\n"), traj()]
    )
    assert values(got) == [1.0, 0.0]
    assert statuses(got) == [OK, OK]
    with pytest.raises(Exception, match="unterminated"):
        FormatReward("(")


def test_verifier_failures_cost_one_trajectory() -> None:
    def verify(response: str, reference: str) -> float:
        if response == "slow":
            raise TimeoutError
        if response == "garbled":
            raise InvalidOutput("promised JSON, got prose")
        if response == "crash":
            raise RuntimeError("sandbox down")
        return exact_match(response, reference)

    batch = [traj("slow"), traj("garbled"), traj("crash"), traj("42"), traj("41")]
    got = score_batch(VerifierReward(verify, "v"), batch)
    assert statuses(got) == [TIMEOUT, INVALID, INFRA, OK, OK]
    assert values(got) == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert "promised JSON" in got[1].reason


def test_isolated_verifier_timeout_is_timeout() -> None:
    def hangs(response: str, reference: str) -> float:
        time.sleep(30)
        return 1.0

    isolated = IsolatedVerifier(hangs, timeout_s=0.2)
    assert statuses(score_batch(VerifierReward(isolated), [traj()])) == [TIMEOUT]


def test_process_reward_and_per_turn_sums() -> None:
    # process r_t = (0.1, 0.2, 0.3); verifier 1 on the last turn ("42" is right)
    # 1·process + 2·verifier: per turn (0.1, 0.2, 0.3 + 2·1) = (0.1, 0.2, 2.3), value 2.6
    steps = {"a": 0.1, "b": 0.2, "42": 0.3}
    process = ProcessReward(lambda t: [steps[x] for x in t.turns])
    reward = Weighted(((1.0, process), (2.0, VerifierReward(exact_match))))
    (got,) = score_batch(reward, [multi(("a", "b", "42"))])
    assert got.per_turn == pytest.approx((0.1, 0.2, 2.3))
    assert got.value == pytest.approx(2.6)
    # a term without a per-turn split: the sum has none either
    plain = Weighted(((1.0, process), (1.0, Fixed([Score(1.0)]))))
    (got,) = score_batch(plain, [multi(("a", "b", "42"))])
    assert got.per_turn is None
    assert got.value == pytest.approx(1.6)  # 0.1 + 0.2 + 0.3 + 1


def test_outcome_rewards_sit_on_the_last_turn() -> None:
    (got,) = score_batch(VerifierReward(exact_match), [multi(("call", "x", "42"))])
    assert got.per_turn == (0.0, 0.0, 1.0)


def test_process_reward_wrong_number_of_turns_is_infra_error() -> None:
    process = ProcessReward(lambda t: [1.0])
    got = score_batch(process, [multi(("a",)), multi(("a", "b"))])
    assert statuses(got) == [OK, INFRA]
    assert "1 per-turn scores for 2 turns" in got[1].reason


# --- status precedence ---------------------------------------------------------


def test_worst_status_order() -> None:
    assert worst([]) == OK
    assert worst([OK, INVALID]) == INVALID
    assert worst([INVALID, TIMEOUT, OK]) == TIMEOUT
    assert worst([TIMEOUT, INFRA]) == INFRA


def test_weighted_status_precedence() -> None:
    invalid = Fixed([Score(0.0, INVALID), Score(0.0, INVALID), Score(0.0, INVALID)], "inv")
    other = Fixed([Score(1.0), Score.failed(TIMEOUT), Score.failed(INFRA)], "other")
    got = score_batch(Weighted(((1.0, invalid), (0.5, other))), [traj()] * 3)
    assert statuses(got) == [INVALID, TIMEOUT, INFRA]
    # INVALID keeps the sum (the invalid term's 0 + 0.5·1); a failure's value is 0
    assert values(got) == [0.5, 0.0, 0.0]


def test_failed_score_value_is_zeroed() -> None:
    (got,) = score_batch(Fixed([Score(0.7, INFRA, reason="down")]), [traj()])
    assert (got.value, got.status, got.reason) == (0.0, INFRA, "down")


# --- failure isolation ---------------------------------------------------------


def test_raising_reward_fails_the_whole_batch() -> None:
    got = score_batch(Raises(RuntimeError("server down")), [traj(), traj()])
    assert statuses(got) == [INFRA, INFRA]
    assert values(got) == [0.0, 0.0]
    assert "server down" in got[0].reason
    assert statuses(score_batch(Raises(TimeoutError()), [traj()])) == [TIMEOUT]


def test_wrong_length_result_is_infra_error_for_all() -> None:
    got = score_batch(Fixed([Score(1.0)]), [traj(), traj()])
    assert statuses(got) == [INFRA, INFRA]
    assert "returned 1 scores for 2 trajectories" in got[0].reason
    assert statuses(score_batch(Fixed(None), [traj()])) == [INFRA]  # type: ignore[arg-type]


def test_non_finite_or_non_score_item_fails_alone() -> None:
    scores = [Score(1.0), Score(math.nan), Score(-math.inf), 1.0, Score(0.5, per_turn=(math.nan,))]
    got = score_batch(Fixed(scores), [traj()] * 5)
    assert statuses(got) == [OK, INFRA, INFRA, INFRA, INFRA]
    assert values(got) == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_a_failing_term_fails_the_sum_not_the_other_batches() -> None:
    reward = Weighted(((1.0, VerifierReward(exact_match)), (1.0, Raises(RuntimeError("x")))))
    got = score_batch(reward, [traj(), traj("41")])
    assert statuses(got) == [INFRA, INFRA]
    assert values(got) == [0.0, 0.0]


def test_empty_batch_does_not_call_the_reward() -> None:
    reward = Fixed([])
    assert score_batch(reward, []) == []
    assert reward.calls == 0


def test_weighted_calls_each_term_once_per_batch() -> None:
    a, b = Fixed([Score(1.0)] * 3, "a"), Fixed([Score(2.0)] * 3, "b")
    # 1·1 + 3·2 = 7
    assert values(score_batch(Weighted(((1.0, a), (3.0, b))), [traj()] * 3)) == [7.0] * 3
    assert (a.calls, b.calls) == (1, 1)


# --- async ---------------------------------------------------------------------


async def _echo(batch: Sequence[Trajectory]) -> list[Score]:
    await asyncio.sleep(0)  # really suspends: the result must be awaited
    return [Score(float(t.length)) for t in batch]


async def _hang(batch: Sequence[Trajectory]) -> list[Score]:
    await asyncio.sleep(30)
    return [Score(1.0) for _ in batch]


def test_async_reward_is_awaited() -> None:
    got = score_batch(AsyncReward(_echo), [traj(length=3), traj(length=5)])
    assert values(got) == [3.0, 5.0]


def test_async_timeout_is_timeout_for_the_batch() -> None:
    start = time.monotonic()
    got = score_batch(AsyncReward(_hang, timeout_s=0.05), [traj(), traj()])
    assert statuses(got) == [TIMEOUT, TIMEOUT]
    assert time.monotonic() - start < 5


def test_weighted_with_an_async_term() -> None:
    # 1·length (async) + 2·verifier: length 3, right → 3 + 2 = 5; length 4, wrong → 4
    reward = Weighted(((1.0, AsyncReward(_echo)), (2.0, VerifierReward(exact_match))))
    assert values(score_batch(reward, [traj(length=3), traj("41", length=4)])) == [5.0, 4.0]


def test_score_batch_inside_a_running_loop() -> None:
    async def main() -> tuple[list[Score], list[Score]]:
        in_thread = score_batch(AsyncReward(_echo), [traj(length=2)])  # worker thread
        awaited = await ascore_batch(AsyncReward(_echo), [traj(length=7)])
        return in_thread, awaited

    in_thread, awaited = asyncio.run(main())
    assert values(in_thread) == [2.0]
    assert values(awaited) == [7.0]


# --- compose -------------------------------------------------------------------


def test_compose_alone_is_the_verifier() -> None:
    verifier = VerifierReward(exact_match)
    assert compose(verifier) is verifier


def test_compose_length_term() -> None:
    # R = verifier + 0.2·(−|150 − 100|/100) = 1 − 0.1 = 0.9
    reward = compose(VerifierReward(exact_match), length_target=100, length_weight=0.2)
    assert values(score_batch(reward, [traj(length=150, max_length=200)])) == pytest.approx([0.9])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"format_pattern": r"\d+"}, "format_pattern"),
        ({"format_weight": 0.5}, "format_pattern"),
        ({"length_target": 10}, "length_target"),
        ({"length_weight": 1.0}, "length_target"),
    ],
)
def test_compose_rejects_half_configured_terms(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        compose(VerifierReward(exact_match), **kwargs)  # type: ignore[arg-type]


# --- properties ----------------------------------------------------------------

finite = st.floats(-1e6, 1e6, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(w=finite, per_turn=st.lists(finite, min_size=1, max_size=4))
def test_weighted_one_term_is_w_times_term(w: float, per_turn: list[float]) -> None:
    term = Fixed([Score(math.fsum(per_turn), per_turn=tuple(per_turn))])
    (got,) = score_batch(Weighted(((w, term),)), [multi(tuple("t" * len(per_turn)))])
    assert got.value == w * math.fsum(per_turn)
    assert got.per_turn == tuple(w * r for r in per_turn)


@settings(max_examples=50, deadline=None)
@given(lengths=st.lists(st.integers(0, 1000), max_size=12))
def test_batch_order_is_preserved(lengths: list[int]) -> None:
    batch = [traj(length=n, max_length=1000) for n in lengths]
    expected = [float(n) for n in lengths]
    assert values(score_batch(ByLength(), batch)) == expected
    assert values(score_batch(AsyncReward(_echo), batch)) == expected
    mixed = Weighted(((1.0, ByLength()), (1.0, AsyncReward(_echo))))
    assert values(score_batch(mixed, batch)) == [2 * x for x in expected]
