"""`verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environments as rlmap tasks:
``data.task=verifiers:ENV_ID`` or ``data.task=verifiers:MODULE:FACTORY``.

``ENV_ID`` is loaded the way verifiers loads an Environments Hub package,
``verifiers.load_environment(ENV_ID, **data.task_args)`` (an installed module named after the
id, with a ``load_environment`` function); ``MODULE:FACTORY`` calls any factory or class with
``data.task_args`` as keywords, e.g. the package's own reasoning-gym integration::

    data.task=verifiers:verifiers.envs.integrations.reasoninggym_env:ReasoningGymEnv
    data.task_args={"gym": "chain_sum", "num_train_examples": 400}

The environment is made once per process (:func:`load`), its reward functions guarded so
that one that raises is recorded, not scored 0.0 (:func:`_guard_rewards`); ``EnvGroup`` is
refused (its rubric hides its children's). Its episodes, in rlmap's tokens, are
:mod:`rlmap.tasks.verifiers_episode`'s.

Train and held-out prompts: the environment's ``dataset`` (the first ``data.train_size``
rows) and its ``eval_dataset`` (the first ``data.eval_size``); without an ``eval_dataset``
the first ``data.eval_size`` rows of ``dataset`` are held out and the rest trained on.

Tested with verifiers 0.3.1, whose classic environment API (``verifiers.legacy``, also
``import verifiers as vf``) is what environment packages are written against; 0.4 replaced
it with harness programs run through ``uv``, which installs their dependencies from the
network at run time.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import importlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rlmap.core.errors import ConfigError, first_line
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.prompts import ToolSchemas

PREFIX = "verifiers:"
TRUNCATING_STOPS = frozenset(
    {"max_turns_reached", "max_total_completion_tokens_reached", "prompt_too_long"}
)
"""verifiers' stop conditions that stop an episode from outside (a budget): truncated. They are
checked after the environment's own ones (:func:`_budgets_last`), so that an answer on the last
turn the budget allows ends the episode, not the budget."""


BUDGET_GIVEN = "_rlmap_turn_budget"
"""The attribute that marks an environment's ``max_turns`` as rlmap's (:func:`fit_turn_budget`)."""


def is_verifiers(task: str) -> bool:
    return task.startswith(PREFIX)


def require() -> Any:
    try:
        import verifiers as vf
    except ImportError:
        raise ConfigError(
            "data.task: verifiers environments need verifiers (pip install verifiers==0.3.1)"
        ) from None
    return vf


def load(task: str, task_args: Mapping[str, Any] | None) -> Any:
    """The environment ``data.task`` names, made with ``data.task_args`` (once per process for
    the same two); ConfigError naming the field when it cannot be made or rlmap cannot run it."""
    return _load(task, json.dumps(dict(task_args or {}), sort_keys=True))


@functools.lru_cache(maxsize=8)
def _load(task: str, args_json: str) -> Any:
    vf = require()
    name, args = task.removeprefix(PREFIX), json.loads(args_json)
    module, _, attr = name.partition(":")
    try:
        if attr:
            made = getattr(importlib.import_module(module), attr)
        else:  # the module verifiers.load_environment imports, imported first to tell a
            importlib.import_module(name.replace("-", "_").split("/")[-1])  # missing one
            made = functools.partial(vf.load_environment, name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"data.task: no verifiers environment {name!r} ({first_line(exc)})"
        ) from None
    try:
        with _quiet_datasets():
            env = made(**args)
    except Exception as exc:  # the environment's own constructor: anything it raises
        raise ConfigError(
            f"data.task_args: verifiers environment {name!r} refuses them ({first_line(exc)})"
        ) from None
    if not isinstance(env, vf.Environment):
        raise ConfigError(
            f"data.task: {name!r} made a {type(env).__name__}, not a verifiers Environment"
        )
    if isinstance(env, vf.EnvGroup):
        raise ConfigError(
            f"data.task: {name!r} is an EnvGroup; name one of its environments "
            "(or a mixture of tasks another way)"
        )
    if env.rubric.has_group_rewards:
        raise ConfigError(
            f"data.task: {name!r} has a rubric that scores groups of rollouts "
            "together; rlmap scores each episode on its own"
        )
    _guard_rewards(env.rubric)
    _budgets_last(env)
    return env


def _budgets_last(env: Any) -> None:
    """Check the environment's own stop conditions before its budgets. verifiers checks them
    by priority, then by name, so ``max_turns_reached`` comes before ``no_tools_called``: an
    answer on the last turn allowed would read as a budget's truncation (and be bootstrapped
    from its final state as if unfinished). The stable sort keeps every other order."""
    env._stop_conditions.sort(key=lambda condition: condition.__name__ in TRUNCATING_STOPS)


def fit_turn_budget(env: Any, task: str, max_turns: int) -> None:
    """Give a ``MultiTurnEnv`` rlmap's turn budget if it has none (verifiers'
    ``max_turns=-1``, no limit): its own ``max_turns_reached`` then stops an episode at
    ``data.max_turns`` turns and its rubric scores it, truncated. ConfigError naming
    ``data.max_turns`` when the environment's own budget exceeds it: rlmap would cut its
    episodes there, before its rubric could score them. The environment is made
    once per process and remembers that the budget it holds is rlmap's (the last run's:
    one process, one ``data.max_turns``). An environment with a rollout of its own, outside
    ``MultiTurnEnv``, keeps what it has (rlmap's runner still caps its turns)."""
    if max_turns < 1:
        return  # refused on its own (data.max_turns >= 1)
    own = getattr(env, "max_turns", None)
    given = getattr(env, BUDGET_GIVEN, False)
    if isinstance(env, require().MultiTurnEnv) and (given or own is None or int(own) <= 0):
        env.max_turns = max_turns
        setattr(env, BUDGET_GIVEN, True)
    elif isinstance(own, int) and own > max_turns:
        raise ConfigError(
            f"data.max_turns: {max_turns} is below the turn budget of verifiers "
            f"environment {task.removeprefix(PREFIX)!r} (max_turns={own}); rlmap "
            f"would cut its episodes before its rubric scores them: set "
            f"data.max_turns={own}"
        )


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """``datasets``' progress bars off while an environment builds its datasets (a bar per
    ``map`` of a few rows, in the middle of a run's output)."""
    import datasets  # type: ignore[import-untyped]

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if shown:
            datasets.enable_progress_bars()


FAILED_REWARDS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "rlmap_verifiers_failed", default=None
)
"""The reward functions that raised in this rollout (each rollout's task sets its own)."""


def _guard_rewards(rubric: Any) -> None:
    """Wrap each weighted reward function of ``rubric`` (and of a group's rubrics) so that
    an exception is recorded in the rollout's :data:`FAILED_REWARDS` before verifiers turns
    it into 0.0; the signature and name are kept (verifiers reads both)."""
    for inner in getattr(rubric, "rubrics", ()):
        _guard_rewards(inner)
    funcs = getattr(rubric, "funcs", [])
    for i, (func, weight) in enumerate(zip(funcs, rubric.weights, strict=True)):
        if weight != 0 and not getattr(func, "_rlmap_guarded", False):
            funcs[i] = _guarded(func)


def _guarded(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    async def run(*args: Any, **kwargs: Any) -> Any:
        try:
            out = func(*args, **kwargs)
            out = await out if asyncio.iscoroutine(out) or asyncio.isfuture(out) else out
            return float(out)  # here, not in verifiers: a None is this function's failure
        except Exception as exc:
            failed = FAILED_REWARDS.get()
            if failed is not None:
                failed.append(f"{getattr(func, '__name__', 'reward')}: {first_line(exc)}")
            raise

    run._rlmap_guarded = True  # type: ignore[attr-defined]
    return run


def splits(
    task: str, task_args: Mapping[str, Any] | None, train_size: int, eval_size: int
) -> tuple[list[Example], list[Example]]:
    """(train, held-out) examples of the environment's datasets (module docstring); each
    example's ``reference`` is ``train:<row>`` or ``eval:<row>``, its row in :func:`rows`."""
    train, heldout = rows(task, task_args)
    if heldout is None:
        if len(train) <= eval_size:
            raise ConfigError(
                f"data.eval_size: {eval_size} held out of the environment's "
                f"{len(train)} rows leaves no training prompts"
            )
        kept = [("train", i) for i in range(eval_size, min(len(train), eval_size + train_size))]
        held = [("train", i) for i in range(eval_size)]
    else:
        kept = [("train", i) for i in range(min(len(train), train_size))]
        held = [("eval", i) for i in range(min(len(heldout), eval_size))]
    table = {"train": train, "eval": heldout or []}
    return (
        [example(table[s][i], f"{s}:{i}") for s, i in kept],
        [example(table[s][i], f"{s}:{i}") for s, i in held],
    )


def rows(task: str, task_args: Mapping[str, Any] | None) -> tuple[list[dict], list[dict] | None]:
    """(the environment's dataset rows, its eval_dataset rows or None)."""
    env = load(task, task_args)
    with _quiet_datasets():
        train, heldout = env.build_dataset(), env.build_eval_dataset()
    if train is None:
        raise ConfigError(f"data.task: {task} has no training dataset")
    return [dict(r) for r in train], None if heldout is None else [dict(r) for r in heldout]


def example(row: Mapping[str, Any], reference: str) -> Example:
    """An rlmap example of a verifiers row: its prompt messages, its answer."""
    messages = tuple((str(m["role"]), content_text(m.get("content"))) for m in row["prompt"])
    users = [content for role, content in messages if role == "user"]
    return Example(
        prompt=users[-1] if users else "",
        answer=str(row.get("answer") or ""),
        reference=reference,
        messages=messages,
    )


def content_text(content: Any) -> str:
    """A message's content as text: a string, or its text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [
        p.get("text", "") if isinstance(p, Mapping) else getattr(p, "text", "") for p in content
    ]
    return "".join(str(p or "") for p in parts)


def tool_schemas(tools: Sequence[Any] | None) -> ToolSchemas:
    """verifiers' tool definitions as the chat template's ``tools=`` (OpenAI function form)."""
    return tuple(
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools or ()
    )


def environment_tools(task: str, task_args: Mapping[str, Any] | None) -> ToolSchemas:
    """The tools the environment shows the model, as the chat template's ``tools=``."""
    return tool_schemas(getattr(load(task, task_args), "tool_defs", None))
