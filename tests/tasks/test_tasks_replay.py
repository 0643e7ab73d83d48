"""Replaying a trajectory to turn k (the ``branch`` group scope's states): token-for-token
the trajectory's prefix and the same environment state, on the calculator and on slippery
FrozenLake; independent branches; refusal of an environment that cannot be replayed.

The original trajectories are real episodes (:func:`rlmap.rollout.episodes.run_episodes`,
an engine that plays a fixed script); the state is compared through what the environment
shows: the observation, reward and flags of the same next action.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import gymnasium
import pytest

from rlmap.core.batch import End
from rlmap.core.errors import ConfigError
from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.embedded.warmstart import PRINTABLE, chat_tokenizer
from rlmap.engines.engine import Completion
from rlmap.feedback.verifiers import exact_match
from rlmap.rollout.episodes import Episode, run_episodes
from rlmap.tasks import gym_text
from rlmap.tasks import kv_recall as kv
from rlmap.tasks.arithmetic import Example, make_problem
from rlmap.tasks.calculator import TOOL_TOKENS, TOOLS, CalculatorEnv, tool_call_text
from rlmap.tasks.env import AnswerEnv, EnvFactory, EnvStep, is_replayable
from rlmap.tasks.kind import Scoring
from rlmap.tasks.replay import ReplayMismatch, branches, context_at, replay, turn_actions
from rlmap.tasks.sources.builtin import calculator_environment
from rlmap.tasks.tool_calls import ToolEnv

CALC = build_tokenizer(extra_tokens=TOOL_TOKENS)
PROSE = build_tokenizer(characters=PRINTABLE)  # a gym task's embedded tokenizer
LAKE = "gym:FrozenLake-v1"  # slippery: the next cell is drawn from the seeded np_random


def ids(tokenizer: Any, text: str, eos: bool = False) -> tuple[int, ...]:
    out = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    return (*out, tokenizer.eos_token_id) if eos else tuple(out)


class Script:
    """A rollout engine that plays one episode's turns, in order."""

    def __init__(self, turns: Sequence[tuple[int, ...]]) -> None:
        self.turns = list(turns)

    def generate(self, prompts: Sequence[Sequence[int]], **_: Any) -> list[list[Completion]]:
        (prompt,) = prompts
        turn = self.turns.pop(0)
        return [[Completion(tuple(prompt), turn, (0.0,) * len(turn), True, 0)]]


def episode(make: EnvFactory, example: Example, turns: Sequence[tuple[int, ...]]) -> Episode:
    (e,) = run_episodes(
        Script(turns), [make(example)], max_new_tokens=64, temperature=1.0, top_p=1.0
    )
    return e


def observation_after(e: Episode, turn: int) -> tuple[int, ...]:
    """The observation ids that follow turn ``turn`` in a recorded episode."""
    last = max(i for i, t in enumerate(e.turn_ids) if t == turn)
    rest = e.response_ids[last + 1 :]
    after = e.turn_ids[last + 1 :]
    return tuple(rest[: next((i for i, t in enumerate(after) if t >= 0), len(rest))])


def assert_same_state(make: EnvFactory, example: Example, e: Episode, turn: int) -> None:
    """Replayed to ``turn``: the recorded prefix, and the recorded reaction to the next action."""
    actions = turn_actions(e.response_ids, e.turn_ids)
    branch = replay(make, example, actions, turn, expected=context_at(*fields(e), turn))
    prefix = e.prompt_ids + e.response_ids[: e.turn_ids.index(turn)]
    assert branch.context == prefix  # token for token
    assert branch.prompt_len == len(e.prompt_ids)
    assert branch.turn_ids == e.turn_ids[: len(prefix) - len(e.prompt_ids)]
    nxt = branch.env.step(actions[turn])
    assert nxt.observation == observation_after(e, turn) and nxt.reward == e.rewards[turn]
    ended = turn == e.turns - 1  # the recorded episode's end came with this step
    assert (nxt.terminated, nxt.truncated) == (
        ended and e.end == End.TERMINAL,
        ended and e.end == End.TRUNCATED,
    )


def fields(e: Episode) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    return e.prompt_ids, e.response_ids, e.turn_ids


# --- the calculator ------------------------------------------------------------------------

PROBLEM = make_problem(37, "*", 85)  # 37*85 = 3145


def calc(e: Example) -> CalculatorEnv:
    return CalculatorEnv(CALC, e, exact_match, max_turns=4)


CALC_TURNS = [
    ids(CALC, "<calc>37*85</calc>"),  # → <result>3145</result>
    ids(CALC, "<calc>37*</calc>"),  # → <result>error</result> (a tool error)
    ids(CALC, "<calc>3145+0</calc>"),  # → <result>3145</result>
    ids(CALC, "3145", eos=True),  # the answer: reward 1, terminal
]


def test_the_recorded_calculator_episode_is_the_one_worked_here() -> None:
    e = episode(calc, PROBLEM, CALC_TURNS)
    assert CALC.decode(list(e.response_ids)) == (
        "<calc>37*85</calc><result>3145</result><calc>37*</calc><result>error</result>"
        "<calc>3145+0</calc><result>3145</result>3145<eos>"
    )
    assert e.rewards == (0.0, 0.0, 0.0, 1.0) and turn_actions(*fields(e)[1:]) == CALC_TURNS


@pytest.mark.parametrize("turn", [0, 1, 2, 3])
def test_replaying_the_calculator_to_turn_k_gives_its_prefix_and_state(turn: int) -> None:
    e = episode(calc, PROBLEM, CALC_TURNS)
    assert_same_state(calc, PROBLEM, e, turn)


def test_turn_zero_is_the_prompt() -> None:
    branch = replay(calc, PROBLEM, CALC_TURNS, 0)
    assert CALC.decode(list(branch.context)) == "<bos>37*85=" and branch.steps == ()


def test_branches_start_identical_and_do_not_share_state() -> None:
    e = episode(calc, PROBLEM, CALC_TURNS)
    prefix = context_at(*fields(e), 2)
    b = branches(calc, PROBLEM, CALC_TURNS, 2, 3, expected=prefix)
    assert len({x.context for x in b}) == 1 and len({id(x.env) for x in b}) == 3
    answer = b[0].env.step(ids(CALC, "3145", eos=True))  # ends branch 0 only
    other = b[1].env.step(ids(CALC, "<calc>2*3</calc>"))
    same = b[2].env.step(CALC_TURNS[2])
    assert answer.terminated and answer.reward == 1.0
    assert CALC.decode(list(other.observation)) == "<result>6</result>" and not other.truncated
    # max_turns=4: branch 2 is at its third turn whatever branches 0 and 1 did
    assert same == EnvStep(
        observation=ids(CALC, "<result>3145</result>"), tool_call=True, tool_result="3145"
    )


def test_the_chat_calculator_replays_too() -> None:
    tokenizer = chat_tokenizer()
    scoring = Scoring(verify=exact_match, items=False, encode=lambda t: [], waits=False)

    class D:
        max_turns = 3

    make = calculator_environment(tokenizer, D(), scoring)  # type: ignore[arg-type]
    assert isinstance(make(PROBLEM), ToolEnv) and is_replayable(make(PROBLEM))
    call = ids(tokenizer, tool_call_text("37*85"))  # <tool_call>{"name": "calculator", …}
    e = episode(make, PROBLEM, [call, ids(tokenizer, "3145", eos=True)])
    assert e.rewards == (0.0, 1.0)
    assert_same_state(make, PROBLEM, e, 1)


# --- slippery FrozenLake -----------------------------------------------------------------------


def lake() -> tuple[EnvFactory, Example]:
    make = gym_text.factory(PROSE, LAKE, None, max_turns=6)  # the sixth turn truncates
    train, _ = gym_text.splits(LAKE, 0, 1, 0)
    return make, train[0]  # reset seed 0


LAKE_TURNS = [ids(PROSE, a, eos=True) for a in ("1", "2", "x", "1", "2", "1", "2")]
"""Down, right, an invalid action (the lake is not stepped), then down, right, …"""


def test_the_recorded_lake_episode_runs_past_the_branch_points() -> None:
    make, start = lake()
    e = episode(make, start, LAKE_TURNS[:6])
    # seed 0 slides (down) 0, (right) 4, (x: not stepped), (down) 4, (right) 0, (down) 1:
    # six turns, no hole, no goal; the sixth truncates (max_turns=6)
    assert e.turns == 6 and e.tool_errors == 1 and e.rewards == (0.0,) * 6
    assert e.end == End.TRUNCATED


@pytest.mark.parametrize("turn", [1, 2, 3, 4, 5])
def test_replaying_frozenlake_to_turn_k_gives_its_prefix_and_state(turn: int) -> None:
    make, start = lake()
    e = episode(make, start, LAKE_TURNS[:6])
    assert_same_state(make, start, e, turn)


def test_a_branch_of_frozenlake_draws_the_slides_the_trajectory_drew() -> None:
    # after the replay the lake's random stream is where the trajectory's was: the rest of
    # the episode, stepped on the branch, is the recorded rest, slide for slide
    make, start = lake()
    e = episode(make, start, LAKE_TURNS[:6])
    branch = replay(make, start, LAKE_TURNS, 2)
    rest = [branch.env.step(a) for a in LAKE_TURNS[2:6]]
    assert [s.observation for s in rest] == [observation_after(e, k) for k in range(2, 6)]
    cells = [int(b.env.env.unwrapped.s) for b in branches(make, start, LAKE_TURNS, 4, 3)]
    shown = PROSE.decode(list(observation_after(e, 3)))  # "state 4\n  (Down)\n…"
    assert cells == [int(shown.split()[1])] * 3 == [4] * 3  # the lake's own state, each branch


def test_another_seed_is_another_state_and_the_check_says_so() -> None:
    make, start = lake()
    e = episode(make, start, LAKE_TURNS[:6])
    other = Example(prompt="FrozenLake-v1 episode 9", answer="", reference="9")
    with pytest.raises(ReplayMismatch, match="differs from the trajectory's at id"):
        replay(make, other, LAKE_TURNS, 4, expected=context_at(*fields(e), 4))


def test_a_gym_environment_marked_nondeterministic_is_not_replayable() -> None:
    gymnasium.register(
        id="RlmapNondeterministicLake-v0",
        entry_point="gymnasium.envs.toy_text.frozen_lake:FrozenLakeEnv",
        nondeterministic=True,
    )
    try:
        task = "gym:RlmapNondeterministicLake-v0"
        assert gym_text.deterministic(LAKE) and not gym_text.deterministic(task)
        make = gym_text.factory(PROSE, task, None, max_turns=8)
        start = gym_text.splits(task, 0, 1, 0)[0][0]
        with pytest.raises(ConfigError, match="GymTextEnv does not declare itself replayable"):
            replay(make, start, LAKE_TURNS, 1)
    finally:
        del gymnasium.registry["RlmapNondeterministicLake-v0"]


# --- refusals and guards -------------------------------------------------------------------------


def test_an_environment_that_cannot_be_replayed_is_refused_in_one_line() -> None:
    def answer(e: Example) -> AnswerEnv:
        return AnswerEnv(CALC, e, exact_match)

    with pytest.raises(ConfigError) as refused:
        replay(answer, PROBLEM, [ids(CALC, "3145", eos=True)], 0)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("sampling.group_scope: branch")
    assert "AnswerEnv does not declare itself replayable" in message


def test_a_tool_environment_is_replayable_only_when_its_factory_says_so() -> None:
    tokenizer = chat_tokenizer()
    tools = TOOLS
    assert not is_replayable(ToolEnv(tokenizer, PROBLEM, exact_match, tools, max_turns=2))
    assert is_replayable(
        ToolEnv(tokenizer, PROBLEM, exact_match, tools, max_turns=2, replayable=True)
    )


class Liar:
    """Says it is replayable; its observations come from an unseeded stream."""

    stop_token_ids: tuple[int, ...] = ()
    replayable = True

    def __init__(self, e: Example) -> None:
        self.rng = random.Random()

    def reset(self) -> list[int]:
        return [1]

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        return EnvStep(observation=(self.rng.randrange(10**9),))


def test_a_replay_that_does_not_reproduce_the_record_raises() -> None:
    record = replay(Liar, PROBLEM, [(5,), (6,)], 2).context
    with pytest.raises(ReplayMismatch, match=r"at id 2 \(5 ids replayed, 5 recorded\)"):
        replay(Liar, PROBLEM, [(5,), (6,)], 2, expected=record)


def test_a_branch_point_must_be_a_state_of_the_trajectory() -> None:
    with pytest.raises(ValueError, match=r"turn: must be in 0\.\.4"):
        replay(calc, PROBLEM, CALC_TURNS, 5)
    with pytest.raises(ValueError, match="turn 3 ended the replayed episode"):
        replay(calc, PROBLEM, CALC_TURNS, 4)  # the answer terminated it: nothing follows


def test_the_key_value_task_replays() -> None:
    recall = kv.draw(7, kv.RecallSettings(pairs=3))

    def make(e: Example) -> kv.RecallEnv:
        return kv.RecallEnv(CALC, recall, exact_match)

    turns = [ids(CALC, "ok", eos=True)] * 4 + [ids(CALC, recall.answer, eos=True)]
    e = episode(make, PROBLEM, turns)
    assert e.outcome == 1.0
    for turn in range(5):
        assert_same_state(make, PROBLEM, e, turn)


def test_which_environments_declare_themselves_replayable() -> None:
    make, start = lake()
    assert is_replayable(calc(PROBLEM)) and is_replayable(make(start))
    assert is_replayable(kv.RecallEnv(CALC, kv.draw(0, kv.RecallSettings()), exact_match))
    assert not is_replayable(AnswerEnv(CALC, PROBLEM, exact_match))
