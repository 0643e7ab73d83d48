"""verifiers environments as rlmap tasks: the package's own ToolEnv and ReasoningGymEnv,
token in and token out, their failures as infrastructure, and a short training run."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verifiers", reason="verifiers is not installed (make test installs it)")

from chat_model import (
    bytewise,
    chat_tokenizer,
    check_token_in_token_out,
    conversation,
    scripted_model,
)

from rlmap.assembly.data import load_data, task_tools
from rlmap.assembly.embedded import (
    CONTEXT_BLOCK,
    embedded_tokenizer,
    fitted_context,
    warm_start_spec,
)
from rlmap.core.batch import End, RewardStatus
from rlmap.core.errors import ConfigError
from rlmap.engines.engine import Completion
from rlmap.engines.hf import HFEngine
from rlmap.recipes import build_config
from rlmap.rollout.episodes import run_episodes
from rlmap.tasks import verifiers_env, verifiers_episode
from rlmap.tasks.prompts import encode_prompt
from rlmap.tasks.tool_calls import CLOSE, observation_ids, tail_ids

ROOT = Path(__file__).parents[2]
CALCULATOR = "verifiers:verifiers_calculator"
RG = "verifiers:verifiers.envs.integrations.reasoninggym_env:ReasoningGymEnv"
RG_ARGS = {"gym": "chain_sum", "num_train_examples": 30, "num_eval_examples": 20, "seed": 3}


@pytest.fixture(autouse=True)
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example environment (examples/) and the misbehaving ones (tests/) import by name."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.syspath_prepend(str(ROOT / "tests"))


def make_env(
    task: str, args: dict[str, Any] | None = None, row: int = 0, max_turns: int = 3
) -> Any:
    """The episode of held-out row ``row`` (``QUESTION`` is row 0 of verifiers_envs), in
    rlmap's budget of ``max_turns`` turns."""
    tokenizer = chat_tokenizer()
    _, heldout = verifiers_env.splits(task, args, 10, 2)
    return verifiers_episode.factory(tokenizer, task, args, max_turns)(heldout[row])


class Scripted:
    """An engine that answers every episode's k-th turn with ``turns[k]``."""

    version = 0

    def __init__(self, turns: Sequence[Sequence[int]]) -> None:
        self.turns, self.k = turns, 0

    def generate(self, prompts: Sequence[Sequence[int]], **_: Any) -> list[list[Completion]]:
        turn = tuple(self.turns[min(self.k, len(self.turns) - 1)])
        self.k += 1
        return [[Completion(tuple(p), turn, (-0.1,) * len(turn), True, 0)] for p in prompts]


def run(env: Any, turns: Sequence[Sequence[int]]) -> Any:
    (episode,) = run_episodes(
        Scripted(turns),
        [env],
        max_new_tokens=64,
        temperature=1.0,  # type: ignore[arg-type]
        top_p=1.0,
    )
    return episode


def test_the_tail_after_a_turn_is_the_templates_rendering_of_all_its_messages() -> None:
    tokenizer = chat_tokenizer()
    # one tool message: the same ids as the calculator's observation
    assert tail_ids(tokenizer, [("tool", "3145")]) == observation_ids(tokenizer, "3145")
    # two messages: ChatML closes the assistant turn, then each message, then the generation
    # prompt; the ids are those of the template's text for the three messages at once
    ids = tail_ids(tokenizer, [("tool", "3145"), ("user", "again")])
    expected = (
        "<|im_end|>\n<|im_start|>tool\n3145<|im_end|>\n"
        "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.decode(ids) == expected


def test_a_verifiers_tool_env_trains_on_exactly_the_ids_the_engine_sampled() -> None:
    # the example's ToolEnv (verifiers' own tool dispatch and rubric) on the scripted model:
    # the same token-for-token check as rlmap's own ToolEnv passes
    tokenizer = chat_tokenizer()
    engine = HFEngine(
        scripted_model(),
        pad_token_id=int(tokenizer.pad_token_id),
        eos_token_id=int(tokenizer.eos_token_id),
    )
    env = make_env("verifiers:verifiers_envs:tool_env")
    with torch.no_grad():
        check_token_in_token_out(engine, env)


def test_a_call_reaches_the_environment_and_its_answer_is_scored_by_its_rubric() -> None:
    tokenizer = chat_tokenizer()
    prompt, (turn0, observation, turn1) = conversation(tokenizer)
    env = make_env("verifiers:verifiers_envs:tool_env")
    assert env.reset() == prompt  # the row's messages through the chat template
    call = env.step(turn0)
    assert call.tool_call and not call.tool_error and not (call.terminated or call.truncated)
    assert list(call.observation) == observation  # verifiers' tool message, rendered
    answer = env.step(turn1)
    assert answer.terminated and answer.reward == 1.0 and answer.status == RewardStatus.OK
    # a wrong answer: the rubric's 0.0, trusted
    env = make_env("verifiers:verifiers_envs:tool_env")
    env.reset()
    env.step(turn0)
    wrong = env.step([*tokenizer.encode("3146", add_special_tokens=False), tokenizer.eos_token_id])
    assert wrong.terminated and wrong.reward == 0.0 and wrong.status == RewardStatus.OK


def test_a_malformed_call_is_a_tool_error_answered_by_the_environment() -> None:
    tokenizer = chat_tokenizer()
    env = make_env("verifiers:verifiers_envs:tool_env")
    env.reset()
    bad = [
        *tokenizer.encode('<tool_call>{"name": calculator', add_special_tokens=False),
        *bytewise(tokenizer, CLOSE),
    ]
    step = env.step(bad)
    assert step.tool_call and step.tool_error and not (step.terminated or step.truncated)
    shown = tokenizer.decode(list(step.observation))
    assert shown.startswith("<|im_end|>\n<|im_start|>tool\n") and "Expecting" in shown  # json's


def test_the_turn_budget_of_the_environment_truncates() -> None:
    tokenizer = chat_tokenizer()
    _, (turn0, _, _) = conversation(tokenizer)
    episode = run(make_env("verifiers:verifiers_envs:tool_env"), [turn0])  # calls, 3 times
    assert episode.end == End.TRUNCATED and episode.tool_calls == 3 and episode.turns == 3
    assert episode.status == RewardStatus.OK


def test_a_plain_multi_turn_env_speaks_after_the_sampled_ids_with_one_end_of_turn() -> None:
    # a turn that ends at EOS (<|im_end|>) already holds the template's first token after the
    # answer: the environment's user turn follows it, and the episode's text is the template's
    # rendering of the conversation, with one <|im_end|> after each turn
    tokenizer = chat_tokenizer()
    eos = tokenizer.eos_token_id
    wrong = [*tokenizer.encode("3146", add_special_tokens=False), eos]
    right = [*tokenizer.encode("3145", add_special_tokens=False), eos]
    episode = run(make_env("verifiers:verifiers_envs:retrying_env"), [wrong, right])
    assert episode.end == End.TERMINAL and episode.turns == 2 and episode.rewards[-1] == 1.0
    assert episode.status == RewardStatus.OK
    messages = [
        {"role": "user", "content": "37*85="},
        {"role": "assistant", "content": "3146"},
        {"role": "user", "content": "try again"},
        {"role": "assistant", "content": "3145"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    text = tokenizer.decode(list(episode.prompt_ids + episode.response_ids))
    assert text.count("<|im_end|>") == 4 and rendered.removesuffix("\n") == text
    # the learner trains on the sampled ids of both turns, the user's turn between them
    start = len(episode.prompt_ids)
    assert list(episode.response_ids[: len(wrong)]) == wrong
    assert list(episode.response_ids[-len(right) :]) == right
    assert episode.action[: len(wrong)] == (True,) * len(wrong) and not episode.action[len(wrong)]
    assert start > 0


def test_an_answer_on_the_last_turn_allowed_ends_the_episode_not_the_budget() -> None:
    # verifiers would name max_turns_reached before no_tools_called: a finished episode read
    # as truncated would be bootstrapped from its final state
    tokenizer = chat_tokenizer()
    _, (turn0, _, turn1) = conversation(tokenizer)
    episode = run(make_env("verifiers:verifiers_envs:tool_env"), [turn0, turn0, turn1])
    assert episode.end == End.TERMINAL and episode.turns == 3 and episode.tool_calls == 2
    assert episode.rewards == (0.0, 0.0, 1.0) and episode.status == RewardStatus.OK


def test_an_environment_without_a_turn_budget_gets_rlmaps() -> None:
    # verifiers' max_turns=-1 would ask a wrong answerer again and again; rlmap's budget stops
    # it through the environment's own max_turns_reached, so its rubric scores the episode
    tokenizer = chat_tokenizer()
    wrong = [*tokenizer.encode("3146", add_special_tokens=False), tokenizer.eos_token_id]
    task = "verifiers:verifiers_envs:unbounded_env"
    episode = run(make_env(task, max_turns=2), [wrong])
    assert episode.end == End.TRUNCATED and episode.turns == 2
    assert episode.status == RewardStatus.OK and episode.rewards == (0.0, 0.0)
    # the environment is made once per process: a later run's budget is its own, not the
    # first run's read back as the environment's (which a shorter budget would refuse)
    verifiers_env.fit_turn_budget(verifiers_env.load(task, None), task, 1)
    assert run(make_env(task, max_turns=4), [wrong]).turns == 4


class Slow(Scripted):
    def generate(self, prompts: Sequence[Sequence[int]], **kw: Any) -> list[list[Completion]]:
        time.sleep(2.5)  # past the environment's timeout_seconds (1.0), with room
        return super().generate(prompts, **kw)


def test_a_rollout_past_the_environments_timeout_is_a_timeout_not_a_score() -> None:
    # the environment scores what it has when its timeout fires, without the turn rlmap was
    # generating: the sample is excluded and counted, never its rubric's 0.0
    tokenizer = chat_tokenizer()
    _, (_, _, turn1) = conversation(tokenizer)
    env = make_env("verifiers:verifiers_envs:slow_tool_env")
    (episode,) = run_episodes(
        Slow([turn1]),
        [env],
        max_new_tokens=64,
        temperature=1.0,  # type: ignore[arg-type]
        top_p=1.0,
    )
    assert episode.status == RewardStatus.TIMEOUT and episode.end == End.TRUNCATED


def test_a_reward_function_that_returns_no_number_is_an_infrastructure_error() -> None:
    tokenizer = chat_tokenizer()
    _, (turn0, _, turn1) = conversation(tokenizer)
    episode = run(make_env("verifiers:verifiers_envs:none_rubric"), [turn0, turn1])
    assert episode.status == RewardStatus.INFRA_ERROR


def test_the_environments_tools_reach_the_chat_template() -> None:
    # the embedded template shows no tools; one that lists them (as Qwen's does, in the
    # system turn) gets the environment's calculator schema, from its signature and docstring
    tokenizer = chat_tokenizer()
    tokenizer.chat_template = (
        "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }}: "
        "{{ t.function.parameters.properties | list | join(',') }}{% endfor %}<|im_end|>\n"
        "{% endif %}" + str(tokenizer.chat_template)
    )
    task = "verifiers:verifiers_envs:tool_env"
    _, heldout = verifiers_env.splits(task, None, 10, 2)
    prompt = verifiers_episode.factory(tokenizer, task, None, 3)(heldout[0]).reset()
    assert tokenizer.decode(prompt).startswith(
        "<|im_start|>system\ncalculator: expression<|im_end|>"
    )
    cfg = build_config("grpo", None, ["model.path=embedded:tiny-chat", f"data.task={task}"])
    (schema,) = task_tools(cfg, tokenizer)  # what the context checks count
    assert schema["function"]["name"] == "calculator"


@pytest.mark.parametrize(
    "name", ["breaking_env", "rewriting_env", "editing_env", "stopping_tool_env"]
)
def test_an_environment_that_fails_or_rewrites_the_conversation_aborts_the_episode(
    name: str,
) -> None:
    tokenizer = chat_tokenizer()
    _, (turn0, _, turn1) = conversation(tokenizer)
    why = {
        "breaking_env": "RuntimeError: the sandbox died",
        "rewriting_env": "rewrote",
        "editing_env": "rewrote",
        "stopping_tool_env": "ToolCallError.* -> PermissionError.*refused",
    }[name]
    with pytest.warns(RuntimeWarning, match=f"episode was aborted.*{why}") as said:  # once
        episode = run(make_env(f"verifiers:verifiers_envs:{name}"), [turn0, turn1])
    assert "error_chain" not in str(said[0].message)  # the error, not verifiers' record of it
    assert episode.end == End.ABORTED and episode.status == RewardStatus.INFRA_ERROR
    assert episode.rewards == ()


def test_a_reward_function_that_raises_is_an_infrastructure_error_not_a_zero() -> None:
    tokenizer = chat_tokenizer()
    _, (turn0, _, turn1) = conversation(tokenizer)
    env = make_env("verifiers:verifiers_envs:crashing_rubric")
    env.reset()
    env.step(turn0)
    step = env.step(turn1)
    assert step.terminated and step.status == RewardStatus.INFRA_ERROR


def test_an_episode_the_runner_drops_has_its_rollout_cancelled() -> None:
    env = make_env("verifiers:verifiers_envs:tool_env")
    env.reset()  # the rollout now waits for the first turn
    rollout = env.rollout
    assert not rollout.done()
    del env
    gc.collect()
    deadline = time.monotonic() + 5
    while not rollout.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rollout.cancelled()


def test_the_packages_reasoning_gym_env_scores_with_reasoning_gym() -> None:
    tokenizer = chat_tokenizer()
    train, heldout = verifiers_env.splits(RG, RG_ARGS, 30, 20)
    assert len(train) == 30 and len(heldout) == 20
    assert not {e.prompt for e in train} & {e.prompt for e in heldout}  # its two datasets
    env = verifiers_env.load(RG, RG_ARGS)
    make = verifiers_episode.factory(tokenizer, RG, RG_ARGS, 3)
    for i in range(3):
        e = heldout[i]
        row = verifiers_env.rows(RG, RG_ARGS)[1][i]  # type: ignore[index]
        truth = env.rg_dataset[int(row["answer"])]["answer"]
        assert e.messages[0][0] == "system" and e.messages[-1] == ("user", row["question"])
        for response, reward in ((f"<answer>{truth}</answer>", 1.0), ("<answer>-1</answer>", 0.0)):
            ep = make(e)
            prompt = ep.reset()
            assert tokenizer.decode(prompt).startswith("<|im_start|>system\n")
            ids = [*tokenizer.encode(response, add_special_tokens=False), tokenizer.eos_token_id]
            step = ep.step(ids)
            assert step.terminated and step.reward == reward and step.status == RewardStatus.OK


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["data.task=verifiers:no_such_environment"], "data.task"),
        (["data.task=verifiers:verifiers_envs:missing"], "data.task"),
        (["data.task=verifiers:verifiers_envs:not_an_environment"], "data.task"),
        (["data.task=verifiers:verifiers_envs:group_rubric"], "data.task"),
        (["data.task=verifiers:verifiers_envs:env_group"], "data.task"),
        ([f"data.task={CALCULATOR}", "data.max_turns=2"], "data.max_turns"),  # its own is 3
        (
            ["data.task=verifiers:verifiers_envs:unbounded_env", "data.max_turns=0"],
            "data.max_turns",
        ),
        (
            [f"data.task={CALCULATOR}", "feedback.eval_verifier=exact_match"],
            "feedback.eval_verifier",
        ),  # its rubric scores held-out episodes
        ([f"data.task={CALCULATOR}", 'data.task_args={"bogus": 1}'], "data.task_args"),
        ([f"data.task={CALCULATOR}"], "model.path"),  # the embedded model has no template
    ],
)
def test_an_environment_rlmap_cannot_run_is_one_line_naming_the_field(
    overrides: list[str], field: str
) -> None:
    chat = [] if field == "model.path" else ["model.path=embedded:tiny-chat"]
    with pytest.raises(ConfigError) as caught:
        build_config("grpo", None, [*chat, *overrides])
    message = str(caught.value)
    assert message.startswith(field + ":") and "\n" not in message, message


def test_the_embedded_chat_model_starts_from_the_calculators_warm_start() -> None:
    # the example environment asks what the calculator task does: the same cached model
    cfg = build_config("grpo", None, ["model.path=embedded:tiny-chat", f"data.task={CALCULATOR}"])
    calculator = build_config(
        "grpo", None, ["model.path=embedded:tiny-chat", "data.task=calculator"]
    )
    assert warm_start_spec(cfg) == warm_start_spec(calculator)
    train, heldout = load_data(cfg)
    assert (len(train), len(heldout)) == (2000, 256)
    assert not {e.prompt for e in train} & {e.prompt for e in heldout}


def test_the_embedded_models_context_holds_the_environments_own_prompts() -> None:
    # ReasoningGymEnv's rows open with reasoning-gym's system prompt, hundreds of tokens
    cfg = build_config(
        "grpo",
        None,
        [
            "model.path=embedded:tiny-chat",
            f"data.task={RG}",
            f"data.task_args={json.dumps(RG_ARGS)}",
        ],
    )
    tokenizer = embedded_tokenizer(cfg)
    train, heldout = load_data(cfg)
    longest = max(len(encode_prompt(tokenizer, e.chat)) for e in [*train, *heldout])
    assert longest > 300
    context = fitted_context(cfg)
    assert longest + 32 <= context < longest + 32 + CONTEXT_BLOCK


def test_a_short_run_on_the_example_environment_completes(tmp_path: Path) -> None:
    tokenizer, model = chat_tokenizer(), scripted_model(steps=100)
    path = tmp_path / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    out = tmp_path / "run"
    args = [
        "--out",
        str(out),
        f"data.task={CALCULATOR}",
        f"model.path={path}",
        "optim.steps=2",
        'data.task_args={"num_train": 16, "num_eval": 4}',
        "sampling.prompts_per_step=2",
        "sampling.group_size=2",
        "generation.max_new_tokens=40",
        "generation.eval_samples=2",
        "data.eval_size=4",
        "run.progress=false",
        "optim.micro_batch_size=4",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "examples"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "rlmap.cli", "train", *args], text=True, capture_output=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    evals = [r for r in rows if "eval/pass@1" in r]
    assert evals and all("eval/tool_calls" in r and "eval/aborted_frac" in r for r in evals)
    assert all(r["eval/aborted_frac"] == 0.0 for r in evals)


def test_the_example_environment_needs_only_verifiers() -> None:
    # an Environments Hub package imports verifiers, not rlmap
    source = (ROOT / "examples" / "verifiers_calculator.py").read_text()
    assert "rlmap" not in source.split('"""', 2)[2]
