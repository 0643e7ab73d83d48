"""Segments (``data.context_policy``): the runner cuts an episode that outgrows the context
into rows whose contexts are the prompt plus the newest whole turns; ``fail`` keeps the
runner as it was.

A fake engine and a scripted environment with ids chosen so that every token says where it
came from: the prompt is (100, 101); turn k is (10k + 1, 10k + 2), its observation (10k + 5,).
Each (turn + observation) pair is 3 tokens, a turn at most 2 (``max_new_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from rlmap.core.batch import End, RewardStatus
from rlmap.engines.engine import Completion
from rlmap.rollout.columns import row_rewards
from rlmap.rollout.episode_stats import segment_metrics
from rlmap.rollout.episodes import Episode, run_episodes
from rlmap.rollout.packing import Scored, to_batch
from rlmap.rollout.segments import context_builder, newest_turns, turn_pairs
from rlmap.system.snapshots import scored_from_record, scored_record
from rlmap.tasks.env import EnvStep

PROMPT = (100, 101)
LOGPROB = -0.5
VERSION = 3


class Counting:
    """An engine that answers turn k of an episode with (10k + 1, 10k + 2), stopped, and
    keeps every context it was given; ``max_len`` is the model's context."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.contexts: list[tuple[int, ...]] = []

    @property
    def version(self) -> int:
        return VERSION

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int,
        max_new_tokens: int,
        kept_sets: int = 0,
        **_: object,
    ) -> list[list[Completion]]:
        out = []
        for p in prompts:
            self.contexts.append(tuple(p))
            k = (p[-1] - 5) // 10 + 1 if p[-1] % 10 == 5 else 0  # after observation k − 1
            turn = (10 * k + 1, 10 * k + 2)[:max_new_tokens]
            # top-p replay: each token's kept set is (the token, -1)
            kept = torch.tensor([[t, -1] for t in turn], dtype=torch.int32) if kept_sets else None
            completion = Completion(tuple(p), turn, (LOGPROB,) * len(turn), True, VERSION)
            out.append([replace(completion, kept=kept)])
        return out


class Scripted:
    """An environment whose step k answers (10k + 5,), reward 0, and whose step ``last``
    terminates with reward 1; counts its resets and steps."""

    stop_token_ids: tuple[int, ...] = ()
    waits = False

    def __init__(self, last: int = 3) -> None:
        self.last, self.resets, self.steps = last, 0, 0

    def reset(self) -> list[int]:
        self.resets += 1
        return list(PROMPT)

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        k, self.steps = self.steps, self.steps + 1
        if k == self.last:
            return EnvStep(observation=(), reward=1.0, terminated=True)
        return EnvStep(observation=(10 * k + 5,))


def run(max_len: int, policy: str, env: Scripted | None = None) -> tuple[Episode, Counting]:
    engine = Counting(max_len)
    (e,) = run_episodes(
        engine,
        [env or Scripted()],
        max_new_tokens=2,
        temperature=1.0,
        top_p=1.0,
        max_turns=10,
        next_context=context_builder(policy),
    )
    return e, engine


def test_truncate_oldest_cuts_segments_with_the_prompt_and_the_newest_whole_turns() -> None:
    # max_len 9: 2 → turn 0 → 5 (5 + 2 ≤ 9) → turn 1 → 8: 8 + 2 > 9, a new segment. Room for
    # the carried turns: 9 − 2 − 2 = 5, the newest pair (3) fits, two (6) do not. So each
    # later segment starts from the prompt and the previous turn with its observation.
    env = Scripted()
    e, engine = run(9, "truncate_oldest", env)
    assert engine.contexts == [
        PROMPT,
        (*PROMPT, 1, 2, 5),
        (*PROMPT, 11, 12, 15),  # segment 1: turn 0 and its observation dropped
        (*PROMPT, 21, 22, 25),  # segment 2
    ]
    assert (env.resets, env.steps) == (1, 4)  # one environment, never reset
    seg0, seg1, seg2 = e.segments
    assert seg0.response_ids == (1, 2, 5, 11, 12, 15)
    assert seg0.action == (True, True, False, True, True, False)
    assert seg0.turn_ids == (0, 0, -1, 1, 1, -1) and seg0.carried == 0
    assert seg1.response_ids == (11, 12, 15, 21, 22, 25)
    assert seg1.action == (False, False, False, True, True, False)
    assert seg1.turn_ids == (-1, -1, -1, 0, 0, -1) and seg1.carried == 3
    assert seg1.logprobs == (0.0,) * 3 + (LOGPROB, LOGPROB, 0.0)
    assert seg1.versions == (0,) * 3 + (VERSION, VERSION, 0)
    assert seg2.response_ids == (21, 22, 25, 31, 32) and seg2.turn_ids == (-1, -1, -1, 0, 0)
    assert all(s.prompt_ids == PROMPT for s in e.segments)
    # a boundary is a truncation after a whole turn (EOS) with a final observation
    assert [(s.end, s.eos) for s in e.segments] == [
        (End.TRUNCATED, True),
        (End.TRUNCATED, True),
        (End.TERMINAL, True),
    ]
    assert [s.rewards for s in e.segments] == [(0.0, 0.0), (0.0,), (1.0,)]
    # the episode itself is whole: every turn and observation, its return, its end
    assert e.response_ids == (1, 2, 5, 11, 12, 15, 21, 22, 25, 31, 32)
    assert (e.turns, e.outcome, e.end, e.rows) == (4, 1.0, End.TERMINAL, e.segments)
    assert e.dropped_tokens == 3 + 3  # one pair left behind at each boundary


def test_segments_become_linked_rows_of_the_batch() -> None:
    cut, _ = run(9, "truncate_oldest")
    whole, _ = run(64, "truncate_oldest", Scripted(last=0))  # one turn: never cut
    batch = to_batch(
        [Scored(cut, 0, 1.0, 1.0, RewardStatus.OK), Scored(whole, 0, 1.0, 1.0, RewardStatus.OK)],
        pad_token_id=0,
    )
    assert batch.episode_id is not None and batch.segment is not None
    assert batch.episode_id.tolist() == [0, 0, 0, 1] and batch.segment.tolist() == [0, 1, 2, 0]
    assert batch.end.tolist() == [End.TRUNCATED, End.TRUNCATED, End.TERMINAL, End.TERMINAL]
    assert batch.rewards.tolist() == [1.0] * 4  # the episode's reward on each of its rows
    assert batch.attention_mask is not None
    real = [batch.tokens[i][batch.attention_mask[i]].tolist() for i in range(4)]
    assert real == [
        [100, 101, 1, 2, 5, 11, 12, 15],
        [100, 101, 11, 12, 15, 21, 22, 25],
        [100, 101, 21, 22, 25, 31, 32],
        [100, 101, 1, 2],
    ]
    # the outcome sits on the last segment's last action token only
    assert batch.token_rewards is not None
    assert batch.token_rewards.sum(-1).tolist() == [0.0, 0.0, 1.0, 1.0]
    assert batch.token_rewards[2, 6].item() == 1.0  # row 2: [p p 21 22 25 31 32] → column 6
    # carried tokens are context, not actions
    assert batch.action_mask.sum(-1).tolist() == [4, 2, 2, 2]


def test_per_turn_rewards_are_split_among_the_segments() -> None:
    cut, _ = run(9, "truncate_oldest")  # turns per segment: 2, 1, 1
    scored = Scored(cut, 0, 1.0, 1.75, RewardStatus.OK, per_turn=(0.25, 0.0, 0.5, 1.0))
    turns = [e.turns for e in cut.segments]
    assert turns == [2, 1, 1]
    assert row_rewards(1.75, scored.per_turn, turns) == [
        (0.0, (0.25, 0.0)),
        (0.0, (0.5,)),
        (0.0, (1.0,)),
    ]
    assert row_rewards(1.75, None, turns) == [(0.0, (0.0, 0.0)), (0.0, (0.0,)), (1.75, None)]
    batch = to_batch([scored], pad_token_id=0)
    assert batch.token_rewards is not None
    assert batch.token_rewards.sum(-1).tolist() == [0.25, 0.5, 1.0]


def test_fail_ends_the_episode_truncated_as_before() -> None:
    # the behaviour of the runner before segments, spelled out: at 8 + 2 > 9 the episode
    # ends TRUNCATED (after a whole turn: EOS), keeping its final observation
    e, engine = run(9, "fail")
    assert engine.contexts == [PROMPT, (*PROMPT, 1, 2, 5)]
    assert e == Episode(
        prompt_ids=PROMPT,
        response_ids=(1, 2, 5, 11, 12, 15),
        action=(True, True, False, True, True, False),
        logprobs=(LOGPROB, LOGPROB, 0.0, LOGPROB, LOGPROB, 0.0),
        versions=(VERSION, VERSION, 0, VERSION, VERSION, 0),
        turn_ids=(0, 0, -1, 1, 1, -1),
        end=End.TRUNCATED,
        eos=True,
        rewards=(0.0, 0.0),
        status=RewardStatus.OK,
        tool_results=(None, None),
    )
    assert e.segments == () and e.rows == (e,) and e.dropped_tokens == 0
    batch = to_batch([Scored(e, 0, 0.0, 0.0, RewardStatus.OK)], pad_token_id=0)
    assert batch.episode_id is None and batch.segment is None and batch.token_rewards is None
    # truncate_oldest's first segment is that very episode: the same tokens up to the cut
    cut, _ = run(9, "truncate_oldest")
    assert cut.segments[0] == e


def test_an_episode_that_fits_is_the_same_under_either_policy() -> None:
    fail, _ = run(64, "fail")
    kept, _ = run(64, "truncate_oldest")
    assert fail == kept and kept.segments == ()


def test_without_room_for_the_prompt_and_a_turn_the_episode_ends_truncated() -> None:
    # max_len 3: the prompt (2) and a turn (2) do not fit, so nothing can be carried: the
    # episode ends as under fail rather than cutting segments for ever
    e, _ = run(3, "truncate_oldest")
    assert e.segments == () and e.end == End.TRUNCATED and e.turns == 1


def test_newest_turns_keeps_whole_pairs_only() -> None:
    pairs = [(1, 2, 5), (11, 12, 15), (21, 22, 25)]
    assert newest_turns(pairs, 6) == (11, 12, 15, 21, 22, 25)
    assert newest_turns(pairs, 5) == (21, 22, 25)  # never half a pair
    assert newest_turns(pairs, 2) == ()
    assert turn_pairs((1, 2, 5, 11, 12, 15, 21), (0, 0, -1, 1, 1, -1, 2)) == [
        (1, 2, 5),
        (11, 12, 15),
        (21,),
    ]


def test_segment_metrics_by_hand() -> None:
    cut, _ = run(9, "truncate_oldest")  # 3 segments, 6 tokens dropped
    whole, _ = run(64, "fail")  # 1 row, nothing dropped
    assert segment_metrics([cut, whole]) == {
        "segments": 2.0,
        "summary_tokens": 0.0,  # truncate_oldest writes none
        "context_dropped_tokens": 3.0,
    }


def test_a_segmented_episode_survives_the_async_snapshot() -> None:
    cut, _ = run(9, "truncate_oldest")
    scored = Scored(cut, 4, 1.0, 1.0, RewardStatus.OK, per_turn=(0.0, 0.0, 0.0, 1.0))
    record = scored_record(scored)
    assert all(isinstance(x, dict) for x in record["episode"]["segments"])  # plain values
    assert scored_from_record(record) == scored
    assert torch.equal(
        to_batch([scored_from_record(record)], pad_token_id=0).tokens,
        to_batch([scored], pad_token_id=0).tokens,
    )


def test_a_segments_kept_sets_are_its_own_tokens_and_none_for_its_context() -> None:
    engine = Counting(9)
    (e,) = run_episodes(
        engine,
        [Scripted()],
        max_new_tokens=2,
        temperature=1.0,
        top_p=1.0,
        max_turns=10,
        kept_sets=4,
        next_context=context_builder("truncate_oldest"),
    )
    seg1 = e.segments[1]  # response (11, 12, 15 | 21, 22, 25): carried, then its own
    assert seg1.kept is not None
    assert seg1.kept[:, 0].tolist() == [-1, -1, -1, 21, 22, -1]
    batch = to_batch([Scored(e, 0, 1.0, 1.0, RewardStatus.OK)], pad_token_id=0)
    assert batch.sampling_set is not None
    # every action token of every row finds its own id in its kept set
    assert torch.equal(
        batch.sampling_set[..., 0][batch.action_mask], batch.tokens[batch.action_mask]
    )
