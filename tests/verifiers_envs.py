"""verifiers environments that misbehave, for tests/tasks/test_tasks_verifiers.py (loaded as
``data.task=verifiers:verifiers_envs:NAME``, this directory being on ``sys.path``)."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

ROWS = [
    {"question": "37*85=", "answer": "3145"},
    {"question": "12*34=", "answer": "408"},
    {"question": "56*78=", "answer": "4368"},
]


def calculator(expression: str) -> str:
    """Evaluate a product.

    Args:
        expression: e.g. 37*85
    """
    a, b = expression.split("*")
    return str(int(a) * int(b))


def exact(completion: vf.Messages, answer: str) -> float:
    return float(str(completion[-1].content or "").strip() == answer)


def broken_reward(completion: vf.Messages, answer: str) -> float:
    raise ConnectionError("the judge is down")


def crashing_rubric() -> vf.Environment:
    """The reward function raises (verifiers itself would score 0.0)."""
    return vf.ToolEnv(
        dataset=Dataset.from_list(ROWS),
        tools=[calculator],
        rubric=vf.Rubric(funcs=[broken_reward]),
        max_turns=3,
    )


class Breaking(vf.ToolEnv):
    async def env_response(self, messages, state, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("the sandbox died")


def breaking_env() -> vf.Environment:
    """``env_response`` raises: the environment itself fails."""
    return Breaking(
        dataset=Dataset.from_list(ROWS),
        tools=[calculator],
        rubric=vf.Rubric(funcs=[exact]),
        max_turns=3,
    )


class Rewriting(vf.ToolEnv):
    async def get_prompt_messages(self, state):  # type: ignore[no-untyped-def]
        messages = await super().get_prompt_messages(state)
        if state["trajectory"]:  # keeps the tool result, drops the assistant's turn
            return [m for m in messages if m.role != "assistant"]
        return messages


def rewriting_env() -> vf.Environment:
    """The conversation is rewritten between turns (a context-compacting environment)."""
    return Rewriting(
        dataset=Dataset.from_list(ROWS),
        tools=[calculator],
        rubric=vf.Rubric(funcs=[exact]),
        max_turns=3,
    )


def group_rubric() -> vf.Environment:
    """A rubric that scores a group of rollouts together."""

    def best_of(completions: list[vf.Messages], answers: list[str]) -> list[float]:
        return [0.0] * len(completions)

    return vf.SingleTurnEnv(dataset=Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[best_of]))


def not_an_environment() -> str:
    return "hello"


def tool_env() -> vf.Environment:
    """verifiers' ToolEnv with a calculator, behaving."""
    return vf.ToolEnv(
        dataset=Dataset.from_list(ROWS[1:]),
        eval_dataset=Dataset.from_list(ROWS),
        tools=[calculator],
        rubric=vf.Rubric(funcs=[exact]),
        max_turns=3,
    )


def _last_text(state: vf.State) -> str:
    trajectory = state["trajectory"]
    return str(trajectory[-1]["completion"][-1].content or "").strip() if trajectory else ""


class Retrying(vf.MultiTurnEnv):
    """Answers a wrong answer with a user turn, "try again", until it is right."""

    async def env_response(self, messages, state, **kwargs):  # type: ignore[no-untyped-def]
        return [{"role": "user", "content": "try again"}]

    @vf.stop
    async def answered(self, state, **kwargs) -> bool:  # type: ignore[no-untyped-def]
        return _last_text(state) == state["answer"]


def retrying_env() -> vf.Environment:
    """A plain MultiTurnEnv: no tools, the environment speaks as the user."""
    return Retrying(dataset=Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[exact]), max_turns=3)


def unbounded_env() -> vf.Environment:
    """A MultiTurnEnv without a turn budget (verifiers' default max_turns=-1)."""
    return Retrying(dataset=Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[exact]))


class Editing(vf.ToolEnv):
    async def get_prompt_messages(self, state):  # type: ignore[no-untyped-def]
        messages = await super().get_prompt_messages(state)
        if state["trajectory"]:  # the question the model was asked, changed afterwards
            messages = [messages[0].model_copy(update={"content": "12*34="}), *messages[1:]]
        return messages


def editing_env() -> vf.Environment:
    """An earlier message's content is rewritten between turns."""
    return Editing(
        dataset=Dataset.from_list(ROWS),
        tools=[calculator],
        rubric=vf.Rubric(funcs=[exact]),
        max_turns=3,
    )


def stopping_tool_env() -> vf.Environment:
    """A tool error that verifiers records as the rollout's error (``stop_errors``)."""

    def calculator(expression: str) -> str:
        """Evaluate a product.

        Args:
            expression: e.g. 37*85
        """
        raise PermissionError("the tool's sandbox refused to start")

    return vf.ToolEnv(
        dataset=Dataset.from_list(ROWS),
        tools=[calculator],
        rubric=vf.Rubric(funcs=[exact]),
        max_turns=3,
        stop_errors=[PermissionError],
    )


def slow_tool_env() -> vf.Environment:
    """A rollout that times out (``timeout_seconds``) while rlmap is generating a turn."""
    return vf.ToolEnv(
        dataset=Dataset.from_list(ROWS),
        tools=[calculator],
        rubric=vf.Rubric(funcs=[exact]),
        max_turns=3,
        timeout_seconds=1.0,
    )


def none_reward(completion: vf.Messages, answer: str) -> float:
    return None  # type: ignore[return-value]


def none_rubric() -> vf.Environment:
    """A reward function that returns no number (verifiers' float() would fail, scored 0)."""
    return vf.ToolEnv(
        dataset=Dataset.from_list(ROWS),
        tools=[calculator],
        rubric=vf.Rubric(funcs=[none_reward]),
        max_turns=3,
    )


def env_group() -> vf.Environment:
    return vf.EnvGroup(envs=[tool_env(), retrying_env()], env_names=["tools", "retry"])
