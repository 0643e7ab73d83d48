"""``sampling.group_scope=branch`` (:mod:`rlmap.rollout.branch`): the G rows of a group start
from one state — token for token the root trajectory's prefix, and the same environment state
(its counters, and on slippery FrozenLake its cell and random stream) — on the calculator and
FrozenLake; the continuations differ; refusals; one training step end to end.

The engines here are scripted policies with a seeded random choice; the environment's state
is read through a recording wrapper, before each step, in every environment the sampler made.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from conftest import always_calling_model

from rlmap.core.batch import End, RewardStatus
from rlmap.core.errors import ConfigError
from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.embedded.warmstart import PRINTABLE
from rlmap.engines.engine import Completion
from rlmap.feedback.verifiers import exact_match
from rlmap.recipes import build_config
from rlmap.recipes.explain import composition
from rlmap.rollout.branch import BranchGroup, branch_groups, branch_turn
from rlmap.rollout.episodes import Episode, run_episodes
from rlmap.rollout.packing import Scored, to_batch
from rlmap.rollout.scoring import EpisodeReturn, trajectories
from rlmap.tasks import gym_text
from rlmap.tasks.arithmetic import Example, make_problem
from rlmap.tasks.calculator import END_CALL, TOOL_TOKENS, CalculatorEnv
from rlmap.tasks.env import AnswerEnv, EnvFactory, EnvStep
from rlmap.tasks.prompts import decode_response
from rlmap.tasks.replay import ReplayMismatch, context_at

CALC = build_tokenizer(extra_tokens=TOOL_TOKENS)
PROSE = build_tokenizer(characters=PRINTABLE)
LAKE = "gym:FrozenLake-v1"  # slippery: the next cell is drawn from the seeded np_random
Choose = Callable[[tuple[int, ...], random.Random], tuple[int, ...]]


def ids(tokenizer: Any, text: str, eos: bool = False) -> tuple[int, ...]:
    out = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    return (*out, tokenizer.eos_token_id) if eos else tuple(out)


class Policy:
    """A rollout engine: each context's turn is ``choose(context, rng)`` (log μ −0.5 per
    token, version 3: what a row's replayed prefix must not keep); it counts its calls."""

    def __init__(self, choose: Choose, seed: int = 0) -> None:
        self.choose, self.rng, self.calls = choose, random.Random(seed), 0

    def generate(self, prompts: Sequence[Sequence[int]], **_: Any) -> list[list[Completion]]:
        self.calls += 1
        out = []
        for p in prompts:
            turn = self.choose(tuple(p), self.rng)
            out.append([Completion(tuple(p), turn, (-0.5,) * len(turn), True, 3)])
        return out


class Recorded:
    """An environment that notes ``state_of`` itself before each step."""

    def __init__(self, env: Any, state_of: Callable[[Any], Any]) -> None:
        self.env, self.state_of, self.states = env, state_of, []
        self.replayable, self.waits = env.replayable, False

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return tuple(self.env.stop_token_ids)

    def reset(self) -> list[int]:
        return list(self.env.reset())

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        self.states.append(self.state_of(self.env))
        return self.env.step(action_ids)


def recording(make: EnvFactory, state_of: Callable[[Any], Any]) -> tuple[EnvFactory, list[Any]]:
    """A factory of :class:`Recorded` environments, and the list of them in making order."""
    made: list[Recorded] = []

    def factory(e: Example) -> Recorded:
        made.append(Recorded(make(e), state_of))
        return made[-1]

    return factory, made


def sample(
    engine: Policy, make: EnvFactory, examples: list[Example], g: int, turns: int, first: int = 0
) -> list[BranchGroup]:
    run = partial(run_episodes, engine, max_new_tokens=16, temperature=1.0, top_p=1.0)
    return branch_groups(partial(run, max_turns=turns), make, examples, first, g, 0, turns)


def lead(row: Episode) -> int:
    """Response ids before the row's first action: its replayed prefix."""
    return row.action.index(True) if True in row.action else len(row.action)


def assert_same_start(groups: list[BranchGroup], made: list[Recorded], g: int) -> None:
    """Each row is the root's c_k token for token, then its own turns; each continuation's
    environment stood where the root's did before turn k (and through the replay)."""
    n = len(groups)
    for i, x in enumerate(groups):
        root, k = x.root, x.turn
        c_k = context_at(root.prompt_ids, root.response_ids, root.turn_ids, k)
        p = len(root.prompt_ids)
        for row, env in zip(x.rows, made[n + i * g : n + (i + 1) * g], strict=True):
            m = lead(row)
            assert row.prompt_ids == root.prompt_ids and row.carried == m
            assert row.prompt_ids + row.response_ids[:m] == c_k
            assert row.turn_ids[:m] == (-1,) * m and row.turn_ids[m] == 0
            assert row.logprobs[:m] == (0.0,) * m and row.versions[:m] == (0,) * m
            assert row.logprobs[m] == -0.5 and row.versions[m] == 3
            assert len(row.rewards) == row.turns  # its own steps' rewards only
            assert env.states[: k + 1] == made[i].states[: k + 1]  # replay, then s_k
        assert len(c_k) - p == lead(x.rows[0])  # (the prefix is the root's first k turns)
        assert c_k == root.prompt_ids + root.response_ids[: root.turn_ids.index(k)]


# --- the calculator ------------------------------------------------------------------------


def calculating(context: tuple[int, ...], rng: random.Random) -> tuple[int, ...]:
    """Two tool calls of random sums, then a random answer (one of 20)."""
    if sum(t == CALC.convert_tokens_to_ids("<result>") for t in context) < 2:
        return ids(CALC, f"<calc>{rng.randrange(10)}+{rng.randrange(10)}</calc>")
    return ids(CALC, str(rng.choice([*range(19), 3145])), eos=True)


def calc() -> tuple[EnvFactory, list[Recorded]]:
    def make(e: Example) -> CalculatorEnv:
        return CalculatorEnv(CALC, e, exact_match, max_turns=4)

    return recording(make, lambda env: (env.turns, env.example))


PROBLEMS = [make_problem(37, "*", 85), make_problem(12, "+", 7), make_problem(9, "-", 4)] * 2


def test_calculator_groups_start_from_the_roots_state_and_differ_after() -> None:
    make, made = calc()
    groups = sample(Policy(calculating), make, PROBLEMS, 4, turns=4)
    assert [r.turns for r in (x.root for x in groups)] == [3] * 6  # call, call, answer
    assert {x.turn for x in groups} == {0, 1, 2}  # every state of the root drawn here
    assert len(made) == 6 + 6 * 4 and all(len(x.rows) == 4 for x in groups)
    assert_same_start(groups, made, 4)
    for x in groups:
        assert len({row.response_ids for row in x.rows}) > 1  # the continuations differ
        assert all(row.turns == 3 - x.turn for row in x.rows)  # the policy's rule, from s_k
        # the root is generated, not trained on: its tokens are spent by its rows, whole
        assert sum(row.spent for row in x.rows) == x.root.action_tokens > 0
        assert max(r.spent for r in x.rows) - min(r.spent for r in x.rows) <= 1


def test_in_the_batch_a_groups_rows_share_their_prefix_column_for_column() -> None:
    make, _ = calc()
    groups = sample(Policy(calculating), make, PROBLEMS, 4, turns=4, first=10)
    scored = [
        Scored(row, 10 + i, row.outcome, row.outcome, row.status)
        for i, x in enumerate(groups)
        for row in x.rows
    ]
    batch = to_batch(scored, pad_token_id=int(CALC.pad_token_id))
    assert batch.group_id.tolist() == [10 + i for i in range(6) for _ in range(4)]
    width = max(len(x.root.prompt_ids) for x in groups)  # the prompt columns end here
    assert {x.turn for x in groups} == {0, 1, 2}
    for i, x in enumerate(groups):
        rows, actions = batch.tokens[4 * i : 4 * (i + 1)], batch.action_mask[4 * i : 4 * (i + 1)]
        end = width + lead(x.rows[0])  # padding, prompt, replayed turns: one state
        assert (rows[:, :end] == rows[0, :end]).all() and not actions[:, :end].any()
        assert actions[:, end].all()  # where every row's own first turn starts


def test_a_reward_reads_the_replayed_turns_as_the_rows_prompt() -> None:
    make, _ = calc()
    groups = sample(Policy(calculating), make, PROBLEMS, 2, turns=4)
    # a group whose rows answer after two replayed calls: one own turn each
    i, x = next((i, x) for i, x in enumerate(groups) if x.turn == 2)
    root, answer = x.root, PROBLEMS[i].answer
    c_k = context_at(root.prompt_ids, root.response_ids, root.turn_ids, 2)
    for row, seen in zip(x.rows, trajectories(CALC, x.rows, [answer] * 2, 64), strict=True):
        assert seen.prompt == decode_response(CALC, c_k) and seen.observations == ()
        assert seen.turns == (decode_response(CALC, row.response_ids[lead(row) :]),)
        (score,) = EpisodeReturn()([seen])
        assert score.value == row.outcome == float(seen.turns[0].removesuffix("<eos>") == answer)


# --- slippery FrozenLake -------------------------------------------------------------------


def wandering(context: tuple[int, ...], rng: random.Random) -> tuple[int, ...]:
    return ids(PROSE, str(rng.randrange(4)), eos=True)


def lake_state(env: gym_text.GymTextEnv) -> tuple[int, int, str]:
    """The counter, the lake's cell and its random stream's state."""
    lake = env.env.unwrapped
    return env.turns, int(lake.s), json.dumps(lake.np_random.bit_generator.state)


def test_frozenlake_groups_start_from_the_roots_cell_and_random_stream() -> None:
    make, made = recording(gym_text.factory(PROSE, LAKE, None, max_turns=6), lake_state)
    starts, _ = gym_text.splits(LAKE, 0, 8, 0)
    groups = sample(Policy(wandering, seed=1), make, starts, 4, turns=6)
    assert sum(x.turn >= 1 for x in groups) >= 3  # branch points past the prompt
    assert_same_start(groups, made, 4)
    # the same action from one state slides the same way: the random streams were equal
    repeated = 0
    for x in groups:
        seen: dict[tuple[int, ...], tuple[int, ...]] = {}
        for action, shown in map(first_turn, x.rows):
            repeated += action in seen
            assert seen.setdefault(action, shown) == shown
    assert repeated >= 3
    assert any(len({row.response_ids for row in x.rows}) > 1 for x in groups)


def first_turn(row: Episode) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A row's own first action and the observation after it."""
    m, n = lead(row), row.turn_ids.count(0)
    rest = row.turn_ids[m + n :]
    end = m + n + (rest.index(1) if 1 in rest else len(rest))
    return row.response_ids[m : m + n], row.response_ids[m + n : end]


# --- refusals and failures -----------------------------------------------------------------


def test_an_environment_that_cannot_be_replayed_is_refused_before_any_sampling() -> None:
    engine = Policy(calculating)

    def answer(e: Example) -> AnswerEnv:
        return AnswerEnv(CALC, e, exact_match)

    with pytest.raises(ConfigError) as refused:
        sample(engine, answer, PROBLEMS, 4, turns=4)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("sampling.group_scope: branch")
    assert "AnswerEnv does not declare itself replayable" in message and engine.calls == 0


class Echo:
    """Replayable, never ends: each step shows (7,); ``fail`` makes a step raise."""

    stop_token_ids: tuple[int, ...] = ()
    replayable, waits = True, False

    def __init__(self, e: Example, fail: Callable[[], bool] = lambda: False) -> None:
        self.fail = fail
        self.rng = random.Random()

    def reset(self) -> list[int]:
        return [1, 2]

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        if self.fail():
            raise RuntimeError("the service is down")
        return EnvStep(observation=(7,))


class Liar(Echo):
    """Says it is replayable; its observations come from an unseeded stream."""

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        return EnvStep(observation=(self.rng.randrange(10**9),))


def fives(context: tuple[int, ...], rng: random.Random) -> tuple[int, ...]:
    return (5,)


LATE = next(g for g in range(100) if branch_turn(3, 0, g) == 2)
"""A group whose branch point is the root's turn 2 (of 3)."""


def test_a_replay_that_does_not_reproduce_the_root_stops_the_run() -> None:
    with pytest.raises(ReplayMismatch, match="differs from the trajectory's"):
        sample(Policy(fives), Liar, [PROBLEMS[0]], 2, turns=3, first=LATE)


def test_a_continuation_has_the_episodes_turns_left() -> None:
    # Echo never ends: the root takes the whole budget, 3 turns; a continuation from turn
    # 2 has 3 − 2 = 1 turn left, and ends truncated after it (run_episodes' own cap is 3)
    (x,) = sample(Policy(fives), Echo, [PROBLEMS[0]], 2, turns=3, first=LATE)
    assert x.root.turns == 3 and x.turn == 2
    for row in x.rows:
        assert row.turns == 1 and row.end == End.TRUNCATED and row.eos
        assert row.response_ids == (5, 7, 5, 7, 5, 7) and row.carried == 4


def test_an_environment_failing_in_a_replay_aborts_that_continuation_only() -> None:
    made = Counter[str]()

    def flaky(e: Example) -> Echo:
        made["envs"] += 1
        n = made["envs"]  # the root (1) and the second replay (3) work; the first fails
        return Echo(e, fail=lambda: n == 2)

    with pytest.warns(RuntimeWarning, match="the service is down"):
        (x,) = sample(Policy(fives), flaky, [PROBLEMS[0]], 2, turns=3, first=LATE)
    broken, fine = x.rows
    assert broken.end == End.ABORTED and broken.status == RewardStatus.INFRA_ERROR
    assert fine.status == RewardStatus.OK and fine.turns == 1


def test_the_branch_turn_is_uniform_over_the_roots_turns_and_seeded() -> None:
    draws = Counter(branch_turn(4, 0, g) for g in range(4000))
    # 1000 expected each; sd √(4000·¼·¾) ≈ 27, so ±120 is 4.4 sd
    assert sorted(draws) == [0, 1, 2, 3] and all(abs(n - 1000) < 120 for n in draws.values())
    assert {branch_turn(1, 0, g) for g in range(50)} == {0} == {branch_turn(0, 3, 7)}
    same = [branch_turn(5, 2, g) for g in range(20)]
    assert same == [branch_turn(5, 2, g) for g in range(20)]
    assert same != [branch_turn(5, 3, g) for g in range(20)]


# --- the configuration -----------------------------------------------------------------------

TOOL = ["data.task=calculator", "sampling.group_scope=branch"]


@pytest.mark.parametrize("recipe", ["grpo", "ppo"])
def test_branch_is_accepted_on_the_calculator_and_shown(recipe: str) -> None:
    line = composition(build_config(recipe, None, [*TOOL, "sampling.group_size=4"]))
    assert "branch groups" in line and "turn groups" not in line


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (["sampling.group_scope=branch"], r"^sampling\.group_scope: branch .*'arithmetic'"),
        ([*TOOL, "data.max_turns=1"], r"^sampling\.group_scope: branch .*data\.max_turns=1"),
        (
            [*TOOL, "data.context_policy=truncate_oldest"],
            r"^sampling\.group_scope: branch .*data\.context_policy=truncate_oldest",
        ),
        ([*TOOL, "sampling.group_size=1"], r"^sampling\.group_size: .*G >= 2"),
    ],
)
def test_branch_where_it_cannot_work_is_refused_in_one_line(
    overrides: list[str], pattern: str
) -> None:
    recipe = "ppo" if "sampling.group_size=1" in overrides else "grpo"  # G=1 passes _group
    with pytest.raises(ConfigError, match=pattern) as refused:
        build_config(recipe, None, overrides)
    assert "\n" not in str(refused.value)


# --- one training step -----------------------------------------------------------------------


def test_grpo_trains_a_step_on_branch_groups_of_the_calculator(
    tmp_path: Path, toy: Callable[..., list[str]], policy_batches: list[Any]
) -> None:
    from rlmap.experiments.train import run_training

    overrides = [*toy(always_calling_model(tmp_path / "model"), steps=1), *TOOL]
    run_training(build_config("grpo", None, [*overrides, "data.max_turns=4"]), tmp_path / "run")
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "loss/policy" in last
    # the budget counts the roots: 2 roots of 3 one-token turns, beside the 8 rows' own
    (batch,) = policy_batches
    assert last["sampling/generated_tokens"] == int(batch.action_mask.sum()) + 2 * 3
    close = int(CALC.convert_tokens_to_ids(END_CALL))
    # every episode: prompt P ≤ 7, then turns of 1 token + 7 of result; turn t starts at
    # P + 8t and fits while P + 8t + 4 ≤ 32: 3 turns, each row's replayed ones and its own
    prefixes, replayed, own = [], [], []
    for i in range(batch.size):
        real = batch.attention_mask[i]
        tokens, actions = batch.tokens[i][real], batch.action_mask[i][real]
        prefixes.append(tuple(tokens[: int(actions.nonzero()[0])].tolist()))
        replayed.append(prefixes[-1].count(close))
        own.append(int(actions.sum()))
    assert [r + o for r, o in zip(replayed, own, strict=True)] == [3] * batch.size
    # groups 0 and 1 of seed 0 branch at turns 0 and 1 (branch_turn(3, 0, ·) above); each
    # group's four rows have one prefix: the prompt, and for group 1 the first turn
    assert batch.group_id.tolist() == [0] * 4 + [1] * 4
    assert replayed == [0] * 4 + [1] * 4
    assert len(set(prefixes[:4])) == len(set(prefixes[4:])) == 1
    assert [branch_turn(3, 0, g) for g in (0, 1)] == [0, 1]
