"""Gymnasium environments as multi-turn tasks, against gymnasium's own FrozenLake and a
text environment written to its API: actions from text, observations as tokens,
terminated and truncated carried through, a failing environment aborted (not scored 0)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlmap.assembly.data import load_data
from rlmap.assembly.embedded import fitted_context, warm_start_spec
from rlmap.assembly.environments import environment_factory
from rlmap.assembly.models import model_path
from rlmap.core.batch import End, RewardStatus
from rlmap.core.errors import ConfigError
from rlmap.embedded.tiny import TinySpec, build_tiny_model
from rlmap.embedded.tokenizer import build_tokenizer
from rlmap.embedded.warmstart import PRINTABLE, task_tokenizer
from rlmap.recipes import build_config
from rlmap.rollout.episodes import run_episodes
from rlmap.tasks import gym_text

gym = pytest.importorskip("gymnasium")

LAKE = ["data.task=gym:FrozenLake-v1", 'data.task_args={"is_slippery": false}']
TOKENIZER = task_tokenizer("gym:FrozenLake-v1")


def _env(*extra: str) -> Any:
    cfg = build_config("grpo", None, [*LAKE, *extra])
    train, _ = load_data(cfg)
    return environment_factory(cfg, TOKENIZER)(train[0])


def _act(env: Any, text: str) -> Any:
    return env.step([*TOKENIZER.encode(text, add_special_tokens=False), TOKENIZER.eos_token_id])


def test_the_shortest_path_reaches_the_goal_and_terminates() -> None:
    env = _env("data.max_turns=10")
    first = TOKENIZER.decode(env.reset(), skip_special_tokens=True)
    assert first.startswith("Act in FrozenLake-v1.") and "(0-3)" in first
    assert "state 0\n*FFF\nFHFH\nFFFH\nHFFG" in first  # the agent's cell highlighted as *
    # 4x4 map, actions 0 left, 1 down, 2 right, 3 up: right right down down down right
    steps = [_act(env, a) for a in "221112"]
    assert [s.reward for s in steps] == [0, 0, 0, 0, 0, 1.0]
    assert [s.terminated for s in steps] == [False] * 5 + [True]
    assert not any(s.truncated for s in steps)
    assert "state 15" in TOKENIZER.decode(steps[-1].observation)


def test_a_hole_terminates_with_no_reward_and_a_bad_action_does_not_step() -> None:
    env = _env()
    env.reset()
    bad = _act(env, "go left!")
    assert bad.tool_error and not bad.terminated and bad.reward == 0
    assert "invalid action" in TOKENIZER.decode(bad.observation)
    assert "state 0" in TOKENIZER.decode(_act(env, "0").observation)  # still at the start
    hole = _act(env, "the answer is 1 then 2")  # down: state 4, safe; the first integer counts
    assert "state 4" in TOKENIZER.decode(hole.observation)
    fell = _act(env, "2")  # right from 4 is the hole at 5
    assert (fell.reward, fell.terminated, fell.truncated) == (0.0, True, False)


def test_gymnasium_time_limit_and_the_turn_budget_both_truncate() -> None:
    env = _env('data.task_args={"is_slippery": false, "max_episode_steps": 2}', "data.max_turns=5")
    env.reset()
    a, b = _act(env, "0"), _act(env, "0")
    assert not a.truncated and b.truncated and not b.terminated  # gymnasium's TimeLimit
    env = _env("data.max_turns=2")
    env.reset()
    a, b = _act(env, "0"), _act(env, "0")
    assert not a.truncated and b.truncated and not b.terminated  # rlmap's turn budget


def test_train_and_heldout_episodes_never_share_a_seed() -> None:
    cfg = build_config("grpo", None, [*LAKE, "data.train_size=50", "data.eval_size=10"])
    train, heldout = load_data(cfg)
    assert len(train) == 50 and len(heldout) == 10
    assert not {e.reference for e in train} & {e.reference for e in heldout}


def test_a_bad_environment_is_one_line_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^data.task: gymnasium has no environment"):
        build_config("grpo", None, ["data.task=gym:FrozenLake-v9"])
    with pytest.raises(ConfigError, match=r"^data.task_args: gymnasium's FrozenLake-v1 refuses"):
        build_config("grpo", None, ["data.task=gym:FrozenLake-v1", "data.task_args={bogus: 1}"])


class Echo(gym.Env):  # type: ignore[misc]
    """A text environment on gymnasium's API: say the word back; raises on 'boom'."""

    observation_space = gym.spaces.Text(64)
    action_space = gym.spaces.Text(64)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        return "say ab\n", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if "boom" in action:
            raise RuntimeError("the environment broke")
        return "ok\n", float(action.strip() == "ab"), True, False, {}


class Scripted:
    """An engine that answers round r's k-th running context with ``rounds[r][k]``."""

    def __init__(self, *rounds: list[str]) -> None:
        self.rounds = list(rounds)

    def generate(self, contexts: list[tuple[int, ...]], **_: Any) -> list[list[Any]]:
        from rlmap.engines.engine import Completion

        replies, out = self.rounds.pop(0), []
        for k, context in enumerate(contexts):
            ids = [*TOKENIZER.encode(replies[k], add_special_tokens=False), TOKENIZER.eos_token_id]
            done = Completion(
                prompt_ids=tuple(context),
                response_ids=tuple(ids),
                logprobs=(0.0,) * len(ids),
                stopped=True,
                version=0,
            )
            out.append([done])
        return out


def test_a_text_environment_gets_text_and_a_failure_aborts_the_episode() -> None:
    gym.register("rlmap-test/Echo-v0", entry_point=Echo)
    cfg = build_config("grpo", None, ["data.task=gym:rlmap-test/Echo-v0"])
    train, _ = load_data(cfg)
    make = environment_factory(cfg, TOKENIZER)
    envs = [make(train[0]) for _ in range(3)]
    episodes = run_episodes(
        Scripted(["ab", "xy", "boom"]),
        envs,
        max_new_tokens=8,  # type: ignore[arg-type]
        temperature=1.0,
        top_p=1.0,
        max_turns=3,
    )
    right, wrong, broken = episodes
    assert (right.outcome, right.end, right.status) == (1.0, End.TERMINAL, RewardStatus.OK)
    assert (wrong.outcome, wrong.end) == (0.0, End.TERMINAL)
    assert broken.end == End.ABORTED and broken.status == RewardStatus.INFRA_ERROR


def test_frozen_lake_episodes_through_the_runner() -> None:
    # episode 0 walks the shortest path; episode 1 falls in the hole at 5 on its second
    # turn; episode 2 keeps walking into the west wall and meets the turn budget (6)
    cfg = build_config("grpo", None, [*LAKE, "data.max_turns=6"])
    train, _ = load_data(cfg)
    make = environment_factory(cfg, TOKENIZER)
    rounds = [["2", "1", "0"], ["2", "2", "0"], ["1", "0"], ["1", "0"], ["1", "0"], ["2", "0"]]
    engine = Scripted(*rounds)
    walk, hole, wander = run_episodes(
        engine,
        [make(train[0]) for _ in range(3)],  # type: ignore[arg-type]
        max_new_tokens=4,
        temperature=1.0,
        top_p=1.0,
        max_turns=6,
    )
    assert (walk.outcome, walk.end, walk.turns) == (1.0, End.TERMINAL, 6)
    assert (hole.outcome, hole.end, hole.turns) == (0.0, End.TERMINAL, 2)
    assert (wander.outcome, wander.end, wander.turns) == (0.0, End.TRUNCATED, 6)
    assert not engine.rounds  # every scripted round was asked for


def test_a_short_run_on_frozen_lake_completes(tmp_path: Path) -> None:
    tokenizer = build_tokenizer(characters=PRINTABLE)
    spec = TinySpec(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
    )
    model = tmp_path / "model"
    build_tiny_model(tokenizer, spec, seed=0).save_pretrained(model)
    tokenizer.save_pretrained(model)
    out = tmp_path / "run"
    args = [
        "--out",
        str(out),
        *LAKE,
        f"model.path={model}",
        "optim.steps=2",
        "data.max_turns=4",
        "sampling.prompts_per_step=2",
        "sampling.group_size=2",
        "generation.max_new_tokens=3",
        "generation.eval_samples=2",
        "data.train_size=8",
        "data.eval_size=2",
        "run.progress=false",
        "optim.micro_batch_size=4",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "rlmap.cli", "train", *args], text=True, capture_output=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("eval/turns" in r and "eval/aborted_frac" in r for r in rows if "eval/pass@1" in r)


@pytest.mark.parametrize("turns", [1, 3, 8])
def test_the_longest_episode_fits_the_context(turns: int) -> None:
    # the longest episode: every turn the whole response budget (its last token EOS), each
    # an action that keeps the episode going (left, into the wall), every observation kept
    extra = [f"data.max_turns={turns}", "generation.max_new_tokens=16"]
    cfg = build_config("grpo", None, [*LAKE, *extra])
    context = fitted_context(cfg)
    env = _env(*extra)
    length = len(env.reset())
    for _ in range(turns):
        turn = [*TOKENIZER.encode("0" + " " * 14, add_special_tokens=False), TOKENIZER.eos_token_id]
        length += len(turn) + len(env.step(turn).observation)
    assert context % 64 == 0 and length <= context
    assert gym_text.is_gym("gym:FrozenLake-v1")


def test_the_data_fingerprint_sees_the_environment_settings_and_item_keys() -> None:
    import hashlib

    from rlmap.experiments.fingerprint import DIGITS, data_fingerprint
    from rlmap.tasks.arithmetic import Example

    plain = [Example("1+1=", "2")]
    # examples without keys or messages hash as before the keys existed
    old = hashlib.sha256(json.dumps([[["1+1=", "2"]], [["1+1=", "2"]]]).encode()).hexdigest()
    assert data_fingerprint(plain, plain) == old[:DIGITS]
    cfg = build_config("grpo", None, [*LAKE, "data.train_size=4", "data.eval_size=2"])
    train, heldout = load_data(cfg)
    slippery = data_fingerprint(train, heldout, {"is_slippery": True})
    assert slippery != data_fingerprint(train, heldout, {"is_slippery": False})
    keyed = [Example("1+1=", "2", reference='{"index": 0}')]
    assert data_fingerprint(keyed, plain) != data_fingerprint(plain, plain)


def test_the_embedded_model_starts_a_gym_task_from_its_initialisation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing to imitate: the warm start takes no step (it once failed to build its
    schedule for zero steps), and the checkpoint is the initialisation itself."""
    import torch
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("RLMAP_CACHE", str(tmp_path))
    cfg = build_config("grpo", None, [*LAKE, "data.max_turns=8"])
    spec = warm_start_spec(cfg)
    assert (spec.steps, spec.blur_steps) == (0, 0)
    loaded = AutoModelForCausalLM.from_pretrained(model_path(cfg))
    fresh = build_tiny_model(TOKENIZER, spec.model, spec.seed)
    for (name, a), (_, b) in zip(
        loaded.state_dict().items(), fresh.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_a_prose_tasks_character_checkpoint_reads_back_with_its_spaces(tmp_path: Path) -> None:
    # transformers 5 loads a qwen2 checkpoint's tokenizer as Qwen2Tokenizer, rebuilding its
    # byte-level rules from the vocabulary: a word-level character tokenizer lost every
    # space and newline that way
    from transformers import AutoTokenizer

    spec = TinySpec(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    build_tiny_model(TOKENIZER, spec, seed=0).save_pretrained(tmp_path)
    TOKENIZER.save_pretrained(tmp_path)
    text = "Act in FrozenLake-v1.\nstate 0"
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    ids = TOKENIZER(text)["input_ids"]
    assert loaded(text)["input_ids"] == ids
    assert loaded.decode(ids, skip_special_tokens=True) == text
