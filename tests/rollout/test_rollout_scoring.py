"""Scoring episodes through the reward interface: base + shaping, per-turn, process rewards."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlmap.core.batch import Batch, End, RewardStatus
from rlmap.core.errors import ConfigError
from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.experiments.train import run_training
from rlmap.feedback.process import TOOL_STEP_BONUS, calculator_steps
from rlmap.feedback.reward import Trajectory
from rlmap.feedback.reward_terms import OverlongPunishment, Weighted
from rlmap.recipes import build_config
from rlmap.rollout.episodes import Episode
from rlmap.rollout.scoring import EpisodeReturn, score_episodes, trajectories, trajectory
from rlmap.system import sync
from rlmap.tasks.calculator import TOOL_TOKENS

TOKENIZER = build_tokenizer(extra_tokens=TOOL_TOKENS)
Toy = Callable[..., list[str]]


def ids(text: str) -> tuple[int, ...]:
    return tuple(int(i) for i in TOKENIZER.encode(text, add_special_tokens=False))


def tool_episode(answer: str = "12", *, status: RewardStatus = RewardStatus.OK) -> Episode:
    call, obs, final = ids("<calc>3*4</calc>"), ids("<result>12</result>"), ids(answer)
    n = len(call) + len(obs) + len(final)
    return Episode(
        prompt_ids=ids("3*4="),
        response_ids=call + obs + final,
        action=(True,) * len(call) + (False,) * len(obs) + (True,) * len(final),
        logprobs=(0.0,) * n,
        versions=(0,) * n,
        turn_ids=(0,) * len(call) + (-1,) * len(obs) + (1,) * len(final),
        end=End.TERMINAL,
        eos=True,
        rewards=(0.0, float(answer == "12")),
        status=status,
        tool_calls=1,
        tool_results=("12", None),
    )


def test_an_episode_reads_as_decoded_turns_and_observations() -> None:
    t = trajectory(TOKENIZER, tool_episode(), "12", max_length=32)
    assert t.prompt == "3*4="
    assert t.turns == ("<calc>3*4</calc>", "12") and t.observations == ("<result>12</result>",)
    assert t.response == "12" and t.length == len(ids("<calc>3*4</calc>12"))
    assert dict(t.metadata) == {"rewards": (0.0, 1.0), "status": 0, "tool_results": ("12", None)}


def test_trajectories_of_a_group_decode_each_distinct_sequence_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlmap.rollout import scoring

    group = [tool_episode("12"), tool_episode("12"), tool_episode("13")]
    one_by_one = [trajectory(TOKENIZER, e, "12", max_length=32) for e in group]
    decoded: list[tuple[int, ...]] = []
    real = scoring.decode_response

    def counted(tokenizer: Any, token_ids: tuple[int, ...]) -> str:
        decoded.append(token_ids)
        return real(tokenizer, token_ids)

    monkeypatch.setattr(scoring, "decode_response", counted)
    assert trajectories(TOKENIZER, group, ["12"] * 3, 32) == one_by_one
    # the prompt, the call, the observation and the answer "12" once; then the answer "13"
    assert len(decoded) == len(set(decoded)) == 5


def test_base_plus_shaping_by_hand() -> None:
    # 7 generated tokens (<calc> 3 * 4 </calc>, then 1 2) of L_max 9 with L_c 4:
    # overlong = −(7 − (9 − 4)) / 4 = −0.5
    e = tool_episode()
    t = trajectory(TOKENIZER, e, "12", max_length=9)
    assert t.length == 7
    (v,) = score_episodes(EpisodeReturn(), Weighted(((1.0, OverlongPunishment(4)),)), [t])
    assert v.outcome == 1.0 and v.reward == pytest.approx(0.5) and v.status == RewardStatus.OK
    assert v.per_turn == pytest.approx((0.0, 0.5))  # the shaping in the last turn


def test_a_failed_environment_status_survives_any_base() -> None:
    t = trajectory(TOKENIZER, tool_episode(status=RewardStatus.TIMEOUT), "12", max_length=32)
    from rlmap.feedback.reward_terms import ProcessReward

    (v,) = score_episodes(ProcessReward(calculator_steps), None, [t])
    assert v.status == RewardStatus.TIMEOUT  # the process scorer cannot launder it


def _traj(
    turns: tuple[str, ...], observations: tuple[str, ...], truncated: bool = False
) -> Trajectory:
    """The calculator's records of each step: a call's result (the text inside
    ``<result>``), None for an answer."""
    results = tuple(o.removeprefix("<result>").removesuffix("</result>") for o in observations)
    return Trajectory(
        prompt="3*4=",
        turns=turns,
        observations=observations,
        reference="12",
        metadata={"tool_results": results + (None,) * (len(turns) - len(results))},
        length=10,
        max_length=32,
        truncated=truncated,
    )


@pytest.mark.parametrize(
    ("turns", "observations", "truncated", "expected"),
    [
        # a useful call, then the right answer: 0.1 + 1 on the turns where they happen
        (("<calc>3*4</calc>", "12"), ("<result>12</result>",), False, [TOOL_STEP_BONUS, 1.0]),
        # two useful calls: only the first earns the bonus
        (
            ("<calc>3*4</calc>", "<calc>4*3</calc>", "12"),
            ("<result>12</result>", "<result>12</result>"),
            False,
            [TOOL_STEP_BONUS, 0.0, 1.0],
        ),
        # a useless call, then a wrong answer
        (("<calc>3+4</calc>", "13"), ("<result>7</result>",), False, [0.0, 0.0]),
        # answered directly
        (("12",), (), False, [1.0]),
        # truncated by the turn budget after a useful call: the bonus, no answer
        (("<calc>3*4</calc>",), ("<result>12</result>",), True, [TOOL_STEP_BONUS]),
    ],
)
def test_calculator_process_reward_by_hand(
    turns: tuple[str, ...], observations: tuple[str, ...], truncated: bool, expected: list[float]
) -> None:
    assert calculator_steps(_traj(turns, observations, truncated)) == pytest.approx(expected)


def test_the_process_reward_reads_the_environments_records_not_the_observations_text() -> None:
    # A chat model's observation is the template's tool message, not <result>12</result>:
    # the bonus comes from the environment's record of what the tool returned (before, the
    # scorer matched the text and a chat model never earned it).
    chat = Trajectory(
        prompt="3*4=",
        turns=('<tool_call>{"name": "calculator"}</tool_call>', "12"),
        observations=("<|im_end|>\n<|im_start|>tool\n12<|im_end|>\n",),
        reference="12",
        metadata={"tool_results": ("12", None)},
        length=10,
        max_length=32,
    )
    assert calculator_steps(chat) == pytest.approx([TOOL_STEP_BONUS, 1.0])
    unrecorded = Trajectory(
        prompt="3*4=",
        turns=("<calc>3*4</calc>", "12"),
        observations=("<result>12</result>",),
        reference="12",
        length=10,
        max_length=32,
    )
    assert calculator_steps(unrecorded) == pytest.approx([0.0, 1.0])  # no record, no bonus


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["feedback.format_weight=0.5"], "feedback.format_weight:"),
        (
            ["feedback.source=process_reward", "feedback.process_reward=calculator_steps"],
            "feedback.process_reward: 'calculator_steps' reads records that only "
            "data.task=calculator",
        ),
        (["feedback.length_target=8"], "feedback.length_weight:"),
        (["feedback.format_pattern=[", "feedback.format_weight=1"], "feedback.format_pattern:"),
        (["feedback.source=process_reward"], "feedback.process_reward:"),
        (
            ["feedback.source=process_reward", "feedback.process_reward=nope"],
            "feedback.process_reward:",
        ),
    ],
)
def test_bad_reward_terms_are_one_line_errors(overrides: list[str], field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field}") as info:
        build_config("grpo", None, overrides)
    assert "\n" not in str(info.value)


def test_process_rewards_land_on_turn_ends_and_turn_gae_credits_each_turn() -> None:
    import torch

    from rlmap.estimators import CreditParams, registry
    from rlmap.feedback.reward_terms import ProcessReward
    from rlmap.rollout.packing import Scored, to_batch

    e = tool_episode()
    (v,) = score_episodes(
        ProcessReward(calculator_steps), None, [trajectory(TOKENIZER, e, "12", max_length=32)]
    )
    assert v.per_turn == pytest.approx((TOOL_STEP_BONUS, 1.0))
    batch = to_batch([Scored(e, 0, v.outcome, v.reward, v.status, v.per_turn)], pad_token_id=0)
    assert batch.token_rewards is not None and batch.turn_id is not None
    ends = [int(torch.nonzero(batch.turn_id[0] == k).max()) for k in (0, 1)]
    assert batch.token_rewards[0, ends].tolist() == pytest.approx([TOOL_STEP_BONUS, 1.0])
    # zero values, γ = λ = 1 (Monte Carlo over turns): Â_turn0 = 0.1 + 1.0, Â_turn1 = 1.0
    batch = batch.replace(values=torch.zeros(batch.tokens.shape), bootstrap_values=torch.zeros(1))
    params = CreditParams(estimator="gae", gamma=1.0, lam=1.0, time_unit="turn")
    adv = registry.get("gae").fn(batch, params).advantages[0]
    assert adv[ends].tolist() == pytest.approx([TOOL_STEP_BONUS + 1.0, 1.0])


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[Batch]:
    batches: list[Batch] = []
    real = sync.learn

    def spy(p: Any, batch: Batch, state: Any, *rest: Any) -> dict[str, float]:
        batches.append(batch)
        return real(p, batch, state, *rest)

    monkeypatch.setattr(sync, "learn", spy)
    return batches


def test_a_format_reward_adds_to_the_trained_reward(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = _spy(monkeypatch)
    # every response matches ".*": +0.5 on top of the verifier's 0/1 for each trajectory
    overrides = [
        *toy(tiny_model_dir),
        "feedback.format_pattern=(?s).*",
        "feedback.format_weight=0.5",
    ]
    run_training(build_config("grpo", None, overrides), tmp_path / "run")
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for r in records[1:]:
        assert r["reward/mean"] == pytest.approx(r["reward/outcome_mean"] + 0.5)
    assert batches and all(b.token_rewards is None for b in batches)  # one turn: an outcome


def test_a_process_reward_run_trains_end_to_end(
    tmp_path: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The scripted chat model (tests/chat_model.py) calls the calculator on 37*85 and then
    # answers 3145, whatever the product asked; the task here is that product alone, so
    # every episode makes one useful call: the process reward reaches the batch as 0.1 at
    # turn 0's last action token and 1 at turn 1's, and turn-level GAE trains on them.
    import torch
    from chat_model import QUESTION, chat_tokenizer, scripted_model

    from rlmap.tasks.arithmetic import make_problem

    model_dir = tmp_path / "chat-model"
    scripted_model(steps=100, questions=(QUESTION,)).save_pretrained(model_dir)  # by heart
    chat_tokenizer().save_pretrained(model_dir)
    problem = make_problem(37, "*", 85)
    assert problem.prompt == QUESTION
    monkeypatch.setattr(
        "rlmap.tasks.sources.builtin.make_splits", lambda *_, **__: ([problem] * 40, [problem] * 4)
    )
    batches = _spy(monkeypatch)
    overrides = [
        *toy(model_dir, steps=2),
        "data.task=calculator",
        "data.max_turns=2",
        "generation.max_new_tokens=40",
        "generation.temperature=0.2",
        "feedback.source=process_reward",
        "feedback.process_reward=calculator_steps",
        "credit.time_unit=turn",
    ]
    run_training(build_config("ppo", None, overrides), tmp_path / "run")
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(batches) == 2
    for batch in batches:
        assert batch.token_rewards is not None and batch.turn_id is not None
        for row in range(batch.tokens.shape[0]):
            ends = [int(torch.nonzero(batch.turn_id[row] == k).max()) for k in (0, 1)]
            assert batch.token_rewards[row, ends].tolist() == pytest.approx([TOOL_STEP_BONUS, 1.0])
            assert float(batch.token_rewards[row].sum()) == pytest.approx(TOOL_STEP_BONUS + 1.0)
        assert batch.rewards.tolist() == pytest.approx([TOOL_STEP_BONUS + 1.0] * 8)  # R = Σ r_t
    assert all("loss/policy" in r and "critic/value_loss" in r for r in records[1:])


class Scripted:
    """An engine that answers every turn with the next of ``turns`` (ids), stopped."""

    version = 0

    def __init__(self, turns: list[list[int]]) -> None:
        self.turns = iter(turns)

    def generate(self, prompts: Any, **_: Any) -> list[list[Any]]:
        from rlmap.engines.engine import Completion

        ids = tuple(next(self.turns))
        return [[Completion(tuple(p), ids, (-0.1,) * len(ids), True, 0)] for p in prompts]


@pytest.mark.parametrize("model", ["embedded:tiny", "embedded:tiny-chat"])
def test_a_useful_call_earns_the_bonus_in_either_tool_format(model: str) -> None:
    # The calculator task's own environment, in the embedded model's <calc> format and in a
    # chat model's JSON <tool_call> format: the demonstration's call (37*85, useful) and
    # its answer, played through the episode runner, score 0.1 then 1 in both.
    from chat_model import chat_tokenizer

    from rlmap.assembly.environments import environment_factory
    from rlmap.rollout.episodes import run_episodes
    from rlmap.tasks.arithmetic import make_problem
    from rlmap.tasks.calculator import demonstration

    tokenizer = chat_tokenizer() if model.endswith("chat") else TOKENIZER
    cfg = build_config(
        "ppo",
        None,
        [
            "data.task=calculator",
            f"model.path={model}",
            "feedback.source=process_reward",
            "feedback.process_reward=calculator_steps",
        ],
    )
    example = make_problem(37, "*", 85)
    env = environment_factory(cfg, tokenizer)(example)
    acted = [
        ids for ids, trained in demonstration(tokenizer, example, "3145", use_tool=True) if trained
    ]
    (episode,) = run_episodes(
        Scripted(acted),
        [env],
        max_new_tokens=64,
        temperature=1.0,  # type: ignore[arg-type]
        top_p=1.0,
    )
    assert episode.tool_calls == 1 and episode.tool_results == ("3145", None)
    t = trajectory(tokenizer, episode, "3145", max_length=128)
    assert calculator_steps(t) == pytest.approx([TOOL_STEP_BONUS, 1.0])
