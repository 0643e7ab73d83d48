"""Tasks as plug-ins: one interface (:class:`rlmap.tasks.kind.TaskKind`), one module per
kind, and no code outside the task package that branches on a task's kind."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlmap.core.errors import UnknownComponentError
from rlmap.recipes import build_config
from rlmap.tasks import registry
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvFactory
from rlmap.tasks.kind import DataSettings, Labelled, Scoring, TaskKind, answer_environments
from rlmap.tasks.registry import kind_of, task_kinds

SRC = Path(__file__).resolve().parents[2] / "src" / "rlmap"

KIND_CHECKS = {
    "an is_<kind>() predicate": r"\bis_(gym|verifiers|reasoning_gym|data_file|hf)\(",
    "a comparison with a built-in task's name": r"[=!]=\s*\"(arithmetic|calculator)\"",
    "membership in built-in task names": r"\bin\s*\(\s*\"(arithmetic|calculator)\"",
    "a task prefix test": r"startswith\(\(?\s*\"(gym|verifiers|reasoning_gym|hf):",
    "the old list of built-in tasks": r"\bBUILT_IN_TASKS\b",
    "a test on data.task's spelling": r"\btask\.(startswith|endswith)\(",
    "a task kind's implementation module": r"rlmap\.tasks(\.|\s+import\s+.*)"
    r"\b(gym_text|verifiers_env|reasoning_gym)\b",
}
"""What branching on a task's kind looks like (each pattern has an old line it caught, in
``test_the_kind_checks_catch_what_they_are_for``)."""


def _kind_checks_in(text: str) -> list[str]:
    text = re.sub(r"`[^`]*`", "", text)  # a cross-reference in prose names, it does not branch
    return [what for what, pattern in KIND_CHECKS.items() if re.search(pattern, text)]


def test_no_code_outside_the_task_package_branches_on_a_tasks_kind() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC).parts[0] == "tasks":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            found += [f"{path.relative_to(SRC)}:{number}: {what}" for what in _kind_checks_in(code)]
    assert found == []


@pytest.mark.parametrize(
    "line",
    [  # lines that branched on the kind before the registry (assembly/setup.py, validate.py,
        # sections.py, config.py, warmstart.py, preflight.py)
        "    if gym_text.is_gym(cfg.data.task):",
        "    elif verifiers_env.is_verifiers(d.task):",
        '    if cfg.data.task == "calculator":',
        '    built_in = d.task in ("arithmetic", "calculator") or gym or environments',
        '        return self.task == "calculator" or self.task.startswith(("gym:", "verifiers:"))',
        "    if d.task in setup.BUILT_IN_TASKS or reasoning_gym.is_reasoning_gym(d.task):",
        '    if spec.task.startswith("gym:"):',
        "from rlmap.tasks import gym_text, reasoning_gym, verifiers_env",
        "    from rlmap.tasks.reasoning_gym import LevelPools",
    ],
)
def test_the_kind_checks_catch_what_they_are_for(line: str) -> None:
    assert _kind_checks_in(line)


def test_the_kind_checks_leave_a_docstring_reference_alone() -> None:
    # a cross-reference in prose names a module; it does not branch
    assert not _kind_checks_in("    ``NAME*W+NAME2``; :mod:`rlmap.tasks.reasoning_gym`; lists")


@pytest.mark.parametrize(
    ("task", "kind"),
    [
        ("arithmetic", "arithmetic"),
        ("calculator", "calculator"),
        ("reasoning_gym:chain_sum", "reasoning_gym"),
        ("reasoning_gym:chain_sum*3+gcd", "reasoning_gym"),
        ("gym:FrozenLake-v1", "gym"),
        ("verifiers:reverse_text", "verifiers"),
        ("data/train.jsonl", "files"),
        ("hf:openai/gsm8k:main@train", "files"),
        ("calculator.jsonl", "files"),  # a file, whatever its name begins with
        ("gym", "files"),  # no prefix: a file called gym
    ],
)
def test_each_data_task_has_one_kind(task: str, kind: str) -> None:
    assert kind_of(task).name == kind


def test_the_kinds_answer_what_the_rest_of_rlmap_asks() -> None:
    # sections.DataConfig.multi_turn and resolved_ops read them; a few spot values
    assert [
        kind_of(t).multi_turn
        for t in ("arithmetic", "calculator", "gym:X", "verifiers:Y", "reasoning_gym:Z", "f.jsonl")
    ] == [False, True, True, True, False, False]
    assert kind_of("calculator").default_ops == "*" and kind_of("arithmetic").default_ops == "+"
    assert build_config("grpo", None, ["data.task=calculator"]).data.resolved_ops == "*"
    assert build_config("grpo", None, ["data.task=calculator"]).data.turn_budget == 3


def test_a_kind_name_is_registered_once_and_unknown_ones_are_listed() -> None:
    arithmetic = kind_of("arithmetic")
    with pytest.raises(ValueError, match="task kind 'arithmetic' is already registered"):
        task_kinds(extra=(arithmetic,))
    with pytest.raises(UnknownComponentError, match="known: arithmetic, calculator, files"):
        task_kinds().get("toy")


# --- a toy kind, registered here only, trains a step -------------------------------------


def _toy_examples(d: DataSettings) -> tuple[list[Example], list[Example]]:
    # n+0= → n: every toy prompt is new to rlmap's own tasks (no second operand above 0)
    pool = [Example(prompt=f"{n}+0=", answer=str(n), task="toy") for n in range(50)]
    return pool[d.eval_size :][: d.train_size], pool[: d.eval_size]


def _toy_prompts(d: DataSettings) -> list[Labelled]:
    train, heldout = _toy_examples(d)
    return [(f"toy example {i}", e.prompt) for i, e in enumerate([*train, *heldout])]


def _toy_kind(seen: list[str]) -> TaskKind:
    def environment(tokenizer: Any, d: DataSettings, scoring: Scoring) -> EnvFactory:
        make = answer_environments(tokenizer, scoring)

        def episode(example: Example) -> Any:
            seen.append(example.prompt)
            return make(example)

        return episode

    return TaskKind(
        name="toy",
        matches=lambda task: task.startswith("toy:"),
        splits=_toy_examples,
        prompts=_toy_prompts,
        environment=environment,
    )


def test_a_toy_kind_registered_in_a_test_trains_a_step(
    tiny_model_dir: Path,
    tmp_path: Path,
    toy: Callable[..., list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlmap.experiments.train import run_training

    seen: list[str] = []
    toy_kinds = task_kinds(extra=(_toy_kind(seen),))
    monkeypatch.setattr(registry, "kinds", lambda: toy_kinds)
    cfg = build_config("grpo", None, [*toy(tiny_model_dir, steps=1), "data.task=toy:plus-zero"])
    assert kind_of(cfg.data.task).name == "toy"
    run_training(cfg, tmp_path / "run")
    # 1 step of 2 prompts × 4 samples, then held-out episodes: all of them toy prompts
    toy_prompts = {f"{n}+0=" for n in range(50)}
    assert len(seen) >= 2 * 4 and set(seen) <= toy_prompts
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert records[-1]["step"] == 1
