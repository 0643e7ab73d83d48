"""The one interface a task kind implements: :class:`TaskKind`, and the defaults its hooks
take.

A kind says how it reads ``data.task`` (:attr:`TaskKind.matches`), its prompts and splits, its
environments, the tools its prompts show, what it needs of the model's context, and the
embedded model's warm start on it. One module per kind under :mod:`rlmap.tasks.sources` builds
one; :mod:`rlmap.tasks.registry` registers them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from rlmap.tasks.arithmetic import Example, make_splits
from rlmap.tasks.env import (
    SUMMARY_LEAD,
    AnswerEnv,
    EnvFactory,
    PromptIds,
    Verifier,
    reference_for,
)
from rlmap.tasks.prompts import Messages, ToolSchemas

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Labelled = tuple[str, "str | Messages"]
"""A prompt (a text, or a chat row's messages) and where it comes from, for errors."""


class DataSettings(Protocol):
    """What a kind reads of the run's ``data`` section (:class:`rlmap.recipes.sections.
    DataConfig` is one; the task package does not import recipes)."""

    @property
    def task(self) -> str: ...
    @property
    def task_args(self) -> dict[str, Any] | None: ...
    @property
    def split_seed(self) -> int: ...
    @property
    def train_size(self) -> int: ...
    @property
    def eval_size(self) -> int: ...
    @property
    def max_digits(self) -> int: ...
    @property
    def max_turns(self) -> int: ...
    @property
    def resolved_ops(self) -> str: ...
    @property
    def prompt_field(self) -> str: ...
    @property
    def answer_field(self) -> str: ...
    @property
    def answer_format(self) -> Any: ...
    @property
    def eval_path(self) -> str | None: ...
    @property
    def context_policy(self) -> str: ...


@dataclass(frozen=True)
class Split:
    """A task's train/held-out split as the warm start names it (``task_args`` parsed)."""

    task: str
    task_args: Mapping[str, Any]
    split_seed: int
    train_size: int
    eval_size: int
    max_digits: int = 2
    ops: str = "+"


@dataclass(frozen=True)
class Scoring:
    """How a kind's environments score a response (what the run's verifier makes)."""

    verify: Verifier
    """The verifier (``feedback.verifier``, or ``eval_verifier`` for held-out episodes)."""
    items: bool
    """The verifier reads the examples' item keys (:func:`rlmap.tasks.env.reference_for`)."""
    encode: PromptIds
    """The prompt encoder the episodes share (each prompt encoded once for its G episodes)."""
    waits: bool
    """Whether a verifier call waits on another process (the environment's ``waits``)."""
    latency: Callable[[], float] | None = None
    """Seconds each environment step waits (``data.env_latency``), or None."""


class Curriculum(Protocol):
    """A kind's own curriculum of levels (``sampling.curriculum``): reasoning-gym's."""

    def check(self, d: DataSettings, sampling: Any, mode: str) -> Iterator[str]:
        """The config's problems with the curriculum, one line each."""
        ...

    def target(
        self, task: str, task_args: Mapping[str, Any] | None, top: int | None
    ) -> tuple[dict[str, Any], int] | None:
        """(``data.task_args`` at the top level, that level), or None when there is none."""
        ...

    def levels(self, d: DataSettings, top: int) -> Any:
        """The training prompts of each level up to ``top`` (``.top``, ``.pool(level)``)."""
        ...


def answer_environments(tokenizer: PreTrainedTokenizerBase, scoring: Scoring) -> EnvFactory:
    """One answer per prompt, checked by the verifier: most kinds' environments. A verifier
    that reads items checks against the item's key, not the answer text."""
    verify, encode, waits = scoring.verify, scoring.encode, scoring.waits
    if scoring.items:
        return lambda e: AnswerEnv(tokenizer, _keyed(e), verify, encode=encode, verify_waits=waits)
    return lambda e: AnswerEnv(tokenizer, e, verify, encode=encode, verify_waits=waits)


def _keyed(example: Example) -> Example:
    return replace(example, answer=reference_for(example, True))


def answer_environment(
    tokenizer: PreTrainedTokenizerBase, d: DataSettings, scoring: Scoring
) -> EnvFactory:
    """A kind's environments when they are :func:`answer_environments`."""
    return answer_environments(tokenizer, scoring)


def numbered_prompts(
    d: DataSettings, train: list[Example], heldout: list[Example]
) -> list[Labelled]:
    """``data.task=<task> example <i>`` for every train, then held-out, prompt."""
    return [(f"data.task={d.task} example {i}", e.prompt) for i, e in enumerate([*train, *heldout])]


def arithmetic_demonstrations(split: Split) -> list[Example]:
    """The arithmetic problems of the split's train part: what the warm start imitates on
    a kind with no demonstrations of its own."""
    train, _ = make_splits(
        split.split_seed,
        split.train_size,
        split.eval_size,
        max_digits=split.max_digits,
        ops=split.ops,
    )
    return train


def no_tools(d: DataSettings, tokenizer: PreTrainedTokenizerBase) -> ToolSchemas:
    """A kind whose prompts show no tools."""
    return ()


def no_model_check(
    d: DataSettings, max_new_tokens: int, tokenizer: PreTrainedTokenizerBase, context: int | None
) -> None:
    """A kind any model with room for its prompts can serve."""


def no_settings(d: DataSettings, model_path: str) -> Iterator[str]:
    """A kind that takes no ``data.task_args``."""
    if d.task_args is not None:
        yield (
            f"data.task_args: only reasoning-gym, gym and verifiers tasks take settings, "
            f"not {d.task!r}"
        )


def one_turn(d: DataSettings, tokenizer: PreTrainedTokenizerBase, longest: int, turn: int) -> int:
    """Positions of an episode of one prompt (``longest`` tokens) and one response."""
    return longest + turn


def no_warm_start_changes(chat: bool) -> dict[str, Any]:
    """The warm start's default schedule."""
    return {}


def no_note(task: str, model: str, task_args: Mapping[str, Any] | None) -> str | None:
    """Nothing to say before training."""
    return None


@dataclass(frozen=True)
class TaskKind:
    """One kind of ``data.task``: the task interface. Callables take the run's ``data``
    section (:class:`DataSettings`); defaults are the plain one-answer task's."""

    name: str
    """The kind's name (``rlmap tasks``, errors)."""
    matches: Callable[[str], bool]
    """Whether a ``data.task`` value is of this kind."""
    splits: Callable[[DataSettings], tuple[list[Example], list[Example]]]
    """(train, held-out) examples."""
    prompts: Callable[[DataSettings], list[Labelled]]
    """Every prompt the run will see, labelled by where it comes from (for length checks)."""
    environment: Callable[[PreTrainedTokenizerBase, DataSettings, Scoring], EnvFactory] = (
        answer_environment
    )
    """The maker of one episode's environment for a prompt; ConfigError when the tokenizer
    cannot serve the kind."""
    tools: Callable[[DataSettings, PreTrainedTokenizerBase], ToolSchemas] = no_tools
    """The tool schemas the prompts show the model."""
    check_model: Callable[[DataSettings, int, PreTrainedTokenizerBase, int | None], None] = (
        no_model_check
    )
    """ConfigError unless the model (tokenizer, turn budget ``generation.max_new_tokens``,
    context or None) can serve the kind; run before any work."""
    check_settings: Callable[[DataSettings, str], Iterator[str]] = no_settings
    """The problems of ``data.task``/``data.task_args`` (given ``model.path``), one line each."""
    context_need: Callable[[DataSettings, PreTrainedTokenizerBase, int, int], int] = one_turn
    """Positions an episode needs, from its longest prompt's tokens and a turn's budget."""
    fits_context: bool = False
    """The embedded model's context is built to fit the kind's episodes (long prompts)."""
    templated: bool = True
    """On a chat model the prompts are wrapped in the chat template (a gym episode is not)."""
    multi_turn: bool = False
    """Episodes may have several policy turns (``data.max_turns``)."""
    default_ops: str = "+"
    """The operators drawn from when ``data.ops`` is unset (built-in arithmetic)."""
    own_reward: bool = False
    """Scored by its environment's own reward: no verifier, no reference answers."""
    data_files: bool = False
    """Read from files or datasets: has fields to name, answer formats, a held-out file."""
    items: bool = False
    """Its examples are reasoning-gym items: a verifier that reads item keys applies."""
    default_verifier: str | None = None
    """The verifier that scores it when the config names ``exact_match`` (its own)."""
    prose: bool = False
    """Its prompts are prose: the embedded character tokenizer has all printable ASCII."""
    tool_tokens: tuple[str, ...] = ()
    """Tokens the embedded character tokenizer adds for it (the calculator's markers)."""
    chat_corpus: Callable[[Split], list[str]] | None = None
    """Texts the embedded chat tokenizer learns from too (its training text), or None."""
    demonstrations: Callable[[Split], list[Example]] = arithmetic_demonstrations
    """What the embedded warm start imitates."""
    warm_start: Callable[[bool], dict[str, Any]] = no_warm_start_changes
    """The warm start's settings that differ for this kind (``WarmStartSpec`` fields), on a
    chat model or not."""
    summary_lead: str = SUMMARY_LEAD
    """The template of a compaction request (``data.context_policy=compact``): the text a
    summary turn starts with, given to the policy as context."""
    warm_start_as: str | None = None
    """Another ``data.task`` whose warm start stands in (no demonstrations of its own)."""
    preference_pairs: bool = False
    """The embedded reward model can be trained on its preference pairs."""
    embedded_model: str | None = None
    """The embedded model it gets when the run names none (None: the preset's)."""
    note: Callable[[str, str, Mapping[str, Any] | None], str | None] = no_note
    """One line to say before training it on ``model.path`` (or None)."""
    curriculum: Curriculum | None = None
    """Its curriculum of levels (``sampling.curriculum``), or None."""
    listing: tuple[tuple[str, str], ...] = ()
    """(``data.task`` form, what it is) lines for ``rlmap tasks``."""
    fallback: bool = False
    """Matched only when no other kind matches (data files)."""
