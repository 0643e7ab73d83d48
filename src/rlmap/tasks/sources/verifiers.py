"""verifiers environments (``data.task=verifiers:ENV_ID`` or ``verifiers:MODULE:FACTORY``):
their rollout and rubric, rlmap's engine and tokens (:mod:`rlmap.tasks.verifiers_env`,
:mod:`rlmap.tasks.verifiers_episode`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from rlmap.tasks import verifiers_env, verifiers_episode
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvFactory
from rlmap.tasks.kind import DataSettings, Labelled, Scoring, TaskKind
from rlmap.tasks.prompts import ToolSchemas

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CHAT_MODEL = "embedded:tiny-chat"
"""The one embedded model with a chat template."""


def splits(d: DataSettings) -> tuple[list[Example], list[Example]]:
    """The environment's own train and evaluation rows."""
    return verifiers_env.splits(d.task, d.task_args, d.train_size, d.eval_size)


def prompts(d: DataSettings) -> list[Labelled]:
    """Each row's chat messages, labelled by its split and index."""
    train, heldout = splits(d)
    return [(f"data.task={d.task} {e.reference}", e.chat) for e in [*train, *heldout]]


def environment(
    tokenizer: PreTrainedTokenizerBase, d: DataSettings, scoring: Scoring
) -> EnvFactory:
    """Its rubric's reward, its stop conditions."""
    return verifiers_episode.factory(tokenizer, d.task, d.task_args, d.max_turns)


def tools(d: DataSettings, tokenizer: PreTrainedTokenizerBase) -> ToolSchemas:
    """The environment's own tools."""
    return verifiers_env.environment_tools(d.task, d.task_args)


def check_settings(d: DataSettings, model_path: str) -> Iterator[str]:
    """The environment loads (a ConfigError naming the field), its turns fit
    ``data.max_turns``, and an embedded model has a chat template."""
    env = verifiers_env.load(d.task, d.task_args)  # a ConfigError naming the field
    verifiers_env.fit_turn_budget(env, d.task, d.max_turns)
    if model_path.startswith("embedded:") and model_path != CHAT_MODEL:
        yield (
            "model.path: verifiers environments speak in chat messages; of the embedded "
            "models only embedded:tiny-chat has a chat template"
        )


VERIFIERS = TaskKind(
    name="verifiers",
    matches=verifiers_env.is_verifiers,
    splits=splits,
    prompts=prompts,
    environment=environment,
    tools=tools,
    check_settings=check_settings,
    fits_context=True,
    multi_turn=True,
    own_reward=True,
    warm_start_as="calculator",  # no demonstrations of its own: the calculator's
    listing=(
        (
            "verifiers:ENV_ID",
            "a verifiers environment (or verifiers:MODULE:FACTORY): its "
            "rollout and rubric, rlmap's engine and tokens",
        ),
    ),
)
