"""The embedded model fitted to a run's task: its warm start, tokenizer and context.

What differs by task (the context fitted to long prompts, the warm start's schedule, a
kind warm-started as another) is the task kind's (:func:`rlmap.tasks.registry.kind_of`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING

from rlmap.assembly.data import labelled_prompts, task_tools
from rlmap.embedded.tiny import TinySpec
from rlmap.embedded.warmstart import WarmStartSpec, task_tokenizer
from rlmap.recipes.sections import DataConfig
from rlmap.tasks.prompts import encode_prompt
from rlmap.tasks.registry import kind_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from rlmap.recipes.config import RecipeConfig

EMBEDDED = "embedded:tiny"
EMBEDDED_CHAT = "embedded:tiny-chat"
EMBEDDED_MODELS = {
    EMBEDDED: TinySpec(),
    "embedded:tiny-moe": TinySpec(experts=4),
    EMBEDDED_CHAT: TinySpec(max_position_embeddings=128),
}
"""The built-in models: the dense default; a Qwen3-MoE of 4 experts, top-2, per layer (for
routing replay); a chat model — the dense one on a byte-level BPE tokenizer with the ChatML
template, whose tool calls are JSON in multi-token ``<tool_call>`` tags (128 positions: a
calculator episode takes ~60). All built from config and warm-started on first use, then
cached."""


def warm_start_spec(cfg: RecipeConfig) -> WarmStartSpec:
    """The warm start of the embedded default, on the run's own train split. When the task
    kind asks, the model's context is built to fit the task (:func:`fitted_context`); a kind
    without demonstrations of its own is warm-started as the one it names."""
    d = cfg.data
    kind = kind_of(d.task)
    if kind.warm_start_as is not None:
        stand_in = replace(
            d,
            task=kind.warm_start_as,
            task_args=None,
            train_size=DataConfig.train_size,
            eval_size=DataConfig.eval_size,
        )
        own = warm_start_spec(cfg.model_copy(update={"data": stand_in}))
        return replace(own, model=replace(own.model, max_position_embeddings=fitted_context(cfg)))
    model = EMBEDDED_MODELS.get(cfg.model.path, TinySpec())
    if kind.fits_context:
        model = replace(model, max_position_embeddings=fitted_context(cfg))
    chat = cfg.model.path == EMBEDDED_CHAT
    return WarmStartSpec(
        **kind.warm_start(chat),
        task=d.task,
        split_seed=d.split_seed,
        eval_size=d.eval_size,
        train_size=d.train_size,
        max_digits=d.max_digits,
        ops=d.resolved_ops,
        task_args=json.dumps(d.task_args or {}, sort_keys=True),
        model=model,
        chat=chat,
    )


def embedded_tokenizer(cfg: RecipeConfig) -> PreTrainedTokenizerFast:
    """The tokenizer of the embedded model ``model.path`` names, on the run's task."""
    d = cfg.data
    args, split = json.dumps(d.task_args or {}, sort_keys=True), (d.split_seed, d.eval_size)
    chat = cfg.model.path == EMBEDDED_CHAT
    return task_tokenizer(d.task, chat=chat, task_args=args, split=split)


CONTEXT_BLOCK = 64
"""The embedded model's context is a multiple of this (so that a few characters more in a
task's prompts seldom changes the model, and with it the cached warm start)."""


def fitted_context(cfg: RecipeConfig) -> int:
    """Positions the embedded model needs for the task: its longest prompt (as the embedded
    tokenizer encodes it, with the chat template's turns on a chat model) and what the
    task kind's episode adds (:attr:`rlmap.tasks.kind.TaskKind.context_need`: one
    response of ``generation.max_new_tokens``, at least 32, for most; turns and observations
    for a gym task), rounded up to a multiple of ``CONTEXT_BLOCK``; the default 64 at
    least."""
    chat = cfg.model.path == EMBEDDED_CHAT
    kind = kind_of(cfg.data.task)
    tokenizer = embedded_tokenizer(cfg)
    prompts = [prompt for _, prompt in labelled_prompts(cfg)]
    texts = [prompt if isinstance(prompt, str) else "" for prompt in prompts]
    longest = max(len(ids) for ids in tokenizer(texts)["input_ids"])
    if chat and kind.templated:  # the template's turns around each prompt
        shown = task_tools(cfg, tokenizer)
        longest += len(encode_prompt(tokenizer, "", shown)) - len(tokenizer("")["input_ids"])
        chats = [len(encode_prompt(tokenizer, p, shown)) for p in prompts if not isinstance(p, str)]
        longest = max([longest, *chats])  # chat rows (a verifiers environment's) as they are
    need = kind.context_need(cfg.data, tokenizer, longest, max(cfg.generation.max_new_tokens, 32))
    least = EMBEDDED_MODELS.get(cfg.model.path, TinySpec()).max_position_embeddings
    return max(least, -(-need // CONTEXT_BLOCK) * CONTEXT_BLOCK)
