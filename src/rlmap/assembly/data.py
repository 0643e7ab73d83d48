"""A run's prompts: its task's (train, held-out) split, every prompt labelled by where it
comes from, the curriculum's levels, the tools the prompts show, and prompt lengths
checked against a context. What varies by task is the task kind's
(:func:`rlmap.tasks.registry.kind_of`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlmap.core.errors import InputError, first_line
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.prompts import Messages, ToolSchemas, encode_prompt
from rlmap.tasks.registry import kind_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlmap.recipes.config import RecipeConfig


def load_data(cfg: RecipeConfig) -> tuple[list[Example], list[Example]]:
    """(train, held-out) examples of ``data.task`` (its kind's split)."""
    return kind_of(cfg.data.task).splits(cfg.data)


def labelled_prompts(cfg: RecipeConfig) -> list[tuple[str, str | Messages]]:
    """Every prompt the run will see (a text, or a chat row's messages), each labelled by
    where it comes from: ``file:line`` for a JSONL task (and ``data.eval_path``), ``file row
    N`` for another data file, ``data.task=<name> example <i>`` otherwise; then the prompts
    of the curriculum's lower levels, ``data.task=<name> level <l> example <i>``."""
    d = cfg.data
    out = kind_of(d.task).prompts(d)
    levels = curriculum_levels(cfg)  # the curriculum's lower levels: their own prompts
    for level in range(levels.top if levels is not None else 0):
        out += [
            (f"data.task={d.task} level {level} example {i}", e.prompt)
            for i, e in enumerate(levels.pool(level))
        ]
    return out


def curriculum_levels(cfg: RecipeConfig) -> Any:
    """The training prompts of each level of ``sampling.curriculum`` (``.top``,
    ``.pool(level)``); None without one."""
    s, d = cfg.sampling, cfg.data
    if not s.curriculum:
        return None
    assert s.curriculum_top is not None  # set when the config was built
    curriculum = kind_of(d.task).curriculum
    assert curriculum is not None  # validated
    return curriculum.levels(d, s.curriculum_top)


def task_tools(cfg: RecipeConfig, tokenizer: PreTrainedTokenizerBase) -> ToolSchemas:
    """The tool schemas the task's prompts show the model (the calculator's on a chat model,
    a verifiers environment's own)."""
    return kind_of(cfg.data.task).tools(cfg.data, tokenizer)


def check_prompt_lengths(
    prompts: list[tuple[str, str | Messages]],
    tokenizer: PreTrainedTokenizerBase,
    context: int,
    source: str = "the model",
    tools: ToolSchemas = (),
) -> None:
    """InputError naming the first prompt whose tokens (as :func:`encode_prompt` makes
    them, ``tools`` shown) leave no room for a response in ``context`` positions.

    The whole list is tokenised in one batch without the chat template, plus the
    template's own tokens; only prompts near the limit, and chat messages, are encoded
    exactly, one by one.
    """
    if not prompts:
        return
    try:
        overhead = len(encode_prompt(tokenizer, "", tools))
    except Exception as exc:  # the template refuses a prompt at all, or the tools
        raise InputError(
            f"{source}: its chat template refuses a prompt ({first_line(exc)})"
        ) from None
    texts = [text if isinstance(text, str) else "" for _, text in prompts]
    raw = tokenizer(texts, add_special_tokens=False)["input_ids"]
    for (label, text), ids in zip(prompts, raw, strict=True):
        near = len(ids) + overhead >= context - 8  # 8: slack for merges at the template's seams
        if isinstance(text, str) and not near:
            continue
        try:
            n = len(encode_prompt(tokenizer, text, tools))
        except Exception as exc:  # the chat template refuses the row (a role it does not know)
            raise InputError(
                f"{label}: the tokenizer's chat template refuses this prompt ({first_line(exc)})"
            ) from None
        if n >= context:
            raise InputError(
                f"{label}: prompt of {n} tokens leaves no room for a response in the "
                f"{context}-position context of {source}"
            )
