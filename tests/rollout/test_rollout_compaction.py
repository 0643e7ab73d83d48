"""Learned compaction (``data.context_policy=compact``): at a boundary the policy writes a
summary after the task's lead, and the next segment goes on from the prompt, the lead, the
summary and the newest observation; the summary is a turn (actions) of the closing segment.

The fake engine and scripted environment of ``test_rollout_segments``: prompt (100, 101),
turn k (10k + 1, 10k + 2), its observation (10k + 5,); a context ending with the lead
(90, 91) is answered with a summary (77, 78, 79; or up to 81), cut at the budget it is given.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from test_rollout_segments import LOGPROB, PROMPT, VERSION, Counting, Scripted

from rlmap.core.batch import End, RewardStatus
from rlmap.core.errors import ConfigError
from rlmap.embedded.warmstart import chat_tokenizer
from rlmap.engines.engine import Completion
from rlmap.recipes.build import build_config
from rlmap.rollout.episode_stats import segment_metrics
from rlmap.rollout.episodes import Episode, run_episodes
from rlmap.rollout.packing import Scored, to_batch
from rlmap.rollout.segments import Compaction, run_context_policy
from rlmap.tasks.env import SUMMARY_LEAD

LEAD = (90, 91)
WHOLE = (77, 78, 79, 80, 81)
SUMMARY = WHOLE[:3]
"""The engine's summary unless a test asks for a longer one."""


class Summarizing(Counting):
    """:class:`Counting`, and after the lead a summary ``length`` long (of ``WHOLE``),
    stopped if it fit its budget; keeps each call's ``max_new_tokens``."""

    def __init__(self, max_len: int, length: int = 3) -> None:
        super().__init__(max_len)
        self.length = length
        self.budgets: list[int] = []

    def generate(
        self, prompts: Sequence[Sequence[int]], *, n: int, max_new_tokens: int, **kw: object
    ) -> list[list[Completion]]:
        self.budgets.append(max_new_tokens)
        if not all(tuple(p[-2:]) == LEAD for p in prompts):
            return super().generate(prompts, n=n, max_new_tokens=max_new_tokens, **kw)
        self.contexts += [tuple(p) for p in prompts]
        s = WHOLE[: self.length][:max_new_tokens]
        done = len(s) == self.length
        return [[Completion(tuple(p), s, (LOGPROB,) * len(s), done, VERSION)] for p in prompts]


def run(
    max_len: int, summary: int = 3, last: int = 3, length: int = 3
) -> tuple[Episode, Summarizing, Scripted]:
    engine, env = Summarizing(max_len, length), Scripted(last)
    (e,) = run_episodes(
        engine,
        [env],
        max_new_tokens=2,
        temperature=1.0,
        top_p=1.0,
        max_turns=10,
        next_context=Compaction(LEAD, summary),
    )
    return e, engine, env


def test_the_policy_writes_the_next_segments_context_after_the_lead() -> None:
    # reserve = a turn 2 + the lead 2 + a summary 3 = 7; max_len 16: a segment closes when
    # its context is over 16 − 7 = 9 positions. Contexts 2 → 5 → 8 → 11 (> 9): the summary,
    # budget min(3, 16 − 11 − 2) = 3, sampled after the lead. The next segment: the prompt,
    # the lead, the summary and the newest observation (25): 2 + 6 = 8 ≤ 9, a turn, the end.
    e, engine, env = run(16)
    assert engine.contexts == [
        PROMPT,
        (*PROMPT, 1, 2, 5),
        (*PROMPT, 1, 2, 5, 11, 12, 15),
        (*PROMPT, 1, 2, 5, 11, 12, 15, 21, 22, 25, *LEAD),  # asked for the summary
        (*PROMPT, *LEAD, *SUMMARY, 25),  # the next segment: turn 3 answers observation 25
    ]
    assert engine.budgets == [2, 2, 2, 3, 2]
    assert (env.resets, env.steps) == (1, 4)  # the environment never sees the summary
    seg0, seg1 = e.segments
    assert seg0.response_ids == (1, 2, 5, 11, 12, 15, 21, 22, 25, *LEAD, *SUMMARY)
    # the summary is a turn of the closing segment: actions, after the lead (context)
    assert seg0.action == (True, True, False) * 3 + (False, False) + (True,) * 3
    assert seg0.turn_ids == (0, 0, -1, 1, 1, -1, 2, 2, -1, -1, -1, 3, 3, 3)
    assert seg0.logprobs[-3:] == (LOGPROB,) * 3 and seg0.versions[-3:] == (VERSION,) * 3
    assert seg0.rewards == (0.0, 0.0, 0.0, 0.0)  # three steps, and the summary's 0
    assert (seg0.summaries, seg1.summaries) == ((3,), ())  # numbered within its segment
    assert (seg0.end, seg0.eos) == (End.TRUNCATED, True)  # a boundary, not a terminal
    assert seg1.response_ids == (*LEAD, *SUMMARY, 25, 31, 32) and seg1.carried == 6
    assert seg1.action == (False,) * 6 + (True, True)
    assert (seg1.end, seg1.rewards) == (End.TERMINAL, (1.0,))
    # the whole episode: every token in order, the summary turn among its turns
    assert e.summaries == (3,) and e.summary_tokens == 3
    assert (e.turns, e.outcome, e.end) == (5, 1.0, End.TERMINAL)
    assert e.dropped_tokens == 14 - 6  # all of segment 0 but what it carried over
    assert segment_metrics([e]) == {
        "segments": 2.0,
        "summary_tokens": 3.0,
        "context_dropped_tokens": 8.0,
    }


def test_a_summary_gets_the_room_the_context_has_left_and_must_stop_within_it() -> None:
    # summary budget 5: reserve 2 + 2 + 5 = 9, max_len 20: close over 11. Contexts 2 → 5 →
    # 8 → 11 (11 + 9 = 20 fits) → 14: a round grew it by 3 > a turn's 2, so the room left
    # for the summary is 20 − 14 − 2 = 4 < 5. The engine's summary is 5 long: cut at 4, it
    # did not stop, and the episode ends there as a turn cut at the length limit does
    # (eos False) — a summary never stopped would leave its turn open in the next context.
    e, engine, _ = run(20, summary=5, last=5, length=5)
    assert engine.budgets == [2, 2, 2, 2, 4]
    assert e.segments == () and e.summaries == (4,)
    assert (e.end, e.eos) == (End.TRUNCATED, False)
    assert e.response_ids[-6:] == (*LEAD, 77, 78, 79, 80)
    # max_len 22 (close over 13): at 14 the room is 22 − 14 − 2 = 6, the budget 5: it
    # stops, and the next segment carries it and the newest observation (35)
    e, engine, _ = run(22, summary=5, last=5, length=5)
    assert engine.budgets[4] == 5 and e.segments
    assert e.segments[1].response_ids[:8] == (*LEAD, *WHOLE, 35)


def test_no_summary_is_asked_for_when_even_one_token_would_leave_no_room() -> None:
    # max_len 12: close over 12 − 7 = 5. Contexts 2 → 5 → 8: the carried context would be
    # at least the lead 2 + a token + the newest observation 1 = 4, and the next segment has
    # 12 − 7 − 2 = 3 for it: the episode ends truncated, no summary sampled
    e, engine, env = run(12)
    assert e.summaries == () and e.segments == () and (e.end, e.eos) == (End.TRUNCATED, True)
    assert engine.budgets == [2, 2] and env.steps == 2


def test_an_episode_ends_truncated_when_its_summary_leaves_no_room_for_a_turn() -> None:
    # max_len 13: close over 13 − 7 = 6. Contexts 2 → 5 → 8: summary (budget min(3, 3)).
    # Carried 6 + the prompt 2 + the reserve 7 = 15 > 13: the next segment would close
    # before its first turn, so the episode ends here, truncated after its summary.
    e, engine, env = run(13)
    assert e.segments == () and e.summaries == (2,)
    assert (e.end, e.eos) == (End.TRUNCATED, True)
    assert e.response_ids == (1, 2, 5, 11, 12, 15, *LEAD, *SUMMARY)
    assert env.steps == 2 and len(engine.contexts) == 3


def test_the_turn_budget_counts_the_environments_turns_not_the_summaries() -> None:
    # max_turns 4 and the environment ending at step 3 (its 4th turn): with a summary among
    # the turns the episode still reaches its end (5 policy turns, 4 of them stepped).
    engine, env = Summarizing(16, 3), Scripted(3)
    (e,) = run_episodes(
        engine,
        [env],
        max_new_tokens=2,
        temperature=1.0,
        top_p=1.0,
        max_turns=4,
        next_context=Compaction(LEAD, 3),
    )
    assert (e.end, e.outcome, e.turns, env.steps) == (End.TERMINAL, 1.0, 5, 4)


def test_the_summary_trains_with_the_credit_of_what_follows() -> None:
    # an outcome task: R sits at the last segment's last action token; the summary's turn
    # is an action of segment 0 (trained), its reward 0
    e, _, _ = run(16)
    batch = to_batch([Scored(e, 0, 1.0, 1.0, RewardStatus.OK)], pad_token_id=0)
    assert batch.episode_id is not None and batch.segment is not None
    assert batch.segment.tolist() == [0, 1]
    prompt = 2
    summary_cols = range(prompt + 11, prompt + 14)
    assert all(bool(batch.action_mask[0, c]) for c in summary_cols)
    assert batch.token_rewards is not None
    assert float(batch.token_rewards[0].sum()) == 0.0 and float(batch.token_rewards[1].sum()) == 1.0


def test_a_run_compacts_with_its_tasks_lead_in_its_own_ids() -> None:
    tokenizer = chat_tokenizer()
    cfg = build_config(
        "grpo", None, ["data.task=kv_recall", "data.max_turns=12", "data.context_policy=compact"]
    )
    how = run_context_policy(cfg.data, tokenizer)
    assert isinstance(how, Compaction) and how.max_tokens == 16  # data.summary_tokens
    assert tokenizer.decode(list(how.lead)) == SUMMARY_LEAD == "summary: "
    assert run_context_policy(cfg.data.__class__(task="calculator"), tokenizer) is None  # fail
    with pytest.raises(ConfigError, match=r"data\.summary_tokens"):
        build_config(
            "grpo",
            None,
            [
                "data.task=kv_recall",
                "data.max_turns=12",
                "data.context_policy=compact",
                "data.summary_tokens=0",
            ],
        )


def test_a_summary_is_neither_the_answer_nor_the_length_a_penalty_reads() -> None:
    from rlmap.rollout.evaluate import final_answer
    from rlmap.rollout.scoring import trajectory
    from rlmap.tasks.prompts import decode_response

    tokenizer = chat_tokenizer()
    e, _, _ = run(13)  # ends truncated right after its summary (turn 2)
    assert e.summaries == (2,) and max(e.turn_ids) == 2
    assert final_answer(tokenizer, e) == decode_response(tokenizer, [11, 12])  # turn 1
    seen = trajectory(tokenizer, e, "ref", max_length=64)
    assert seen.length == 2 + 2  # two turns of 2 tokens; the summary's 3 have their own budget
    assert len(seen.turns) == 3 == len(seen.metadata["rewards"])  # one reward per turn
