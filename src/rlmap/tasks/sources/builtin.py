"""The built-in tasks: integer arithmetic, and the calculator tool task over the same
problems (:mod:`rlmap.tasks.arithmetic`, :mod:`rlmap.tasks.calculator`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlmap.core.errors import ConfigError
from rlmap.tasks import tool_calls
from rlmap.tasks.arithmetic import Example, make_splits
from rlmap.tasks.calculator import (
    TOOL_TOKENS,
    TOOLS,
    CalculatorEnv,
    calls_in_json,
    marker_ids,
    prompt_tools,
    tool_call_text,
)
from rlmap.tasks.env import EnvFactory
from rlmap.tasks.kind import DataSettings, Labelled, Scoring, TaskKind, numbered_prompts
from rlmap.tasks.prompts import PromptEncoder, ToolSchemas, encode_prompt
from rlmap.tasks.tool_calls import ToolEnv

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TOOL_DEMOS = 0.25
"""Fraction of the calculator task's warm-start demonstrations that use the tool."""

CALL_MARGIN = 2
"""Tokens beyond the encoded call that the turn budget must leave (another spelling of the
numbers may take more)."""


def splits(d: DataSettings) -> tuple[list[Example], list[Example]]:
    """The built-in problems' (train, held-out) split."""
    return make_splits(
        d.split_seed, d.train_size, d.eval_size, max_digits=d.max_digits, ops=d.resolved_ops
    )


def prompts(d: DataSettings) -> list[Labelled]:
    """``data.task=<task> example <i>`` for each train, then held-out, problem."""
    return numbered_prompts(d, *splits(d))


def calculator_environment(
    tokenizer: PreTrainedTokenizerBase, d: DataSettings, scoring: Scoring
) -> EnvFactory:
    """The calculator tool task's episodes: markers as tokens, or the chat model's own
    JSON tool calls (then the prompts show the tool)."""
    verify, waits, turns, wait = scoring.verify, scoring.waits, d.max_turns, scoring.latency
    if calls_in_json(tokenizer):  # the chat model's own tool-call format
        encode = PromptEncoder(tokenizer, tools=prompt_tools(tokenizer))
        return lambda e: ToolEnv(
            tokenizer,
            e,
            verify,
            TOOLS,
            max_turns=turns,
            latency=wait,
            encode=encode,
            verify_waits=waits,
            replayable=True,  # the calculator is a pure function of its expression
        )
    marker_ids(tokenizer)
    shared = scoring.encode
    return lambda e: CalculatorEnv(
        tokenizer, e, verify, max_turns=turns, latency=wait, encode=shared, verify_waits=waits
    )


def calculator_tools(d: DataSettings, tokenizer: PreTrainedTokenizerBase) -> ToolSchemas:
    """The calculator's schema on a chat model (none with the markers)."""
    return prompt_tools(tokenizer)


def check_calculator(
    d: DataSettings,
    max_new_tokens: int,
    tokenizer: PreTrainedTokenizerBase,
    context: int | None = None,
) -> None:
    """ConfigError unless the model can serve the calculator task: the markers as single
    tokens, or a chat template that renders a tool message, a turn budget
    (``max_new_tokens``, ``generation.max_new_tokens``) that holds a whole call of the longest
    expression, and a ``context`` (when known) that holds an episode of ``data.max_turns``
    turns — calls, then a last turn of the whole budget; with segments
    (``data.context_policy`` not ``fail``), one call, its result and a turn: what a segment
    must hold to move an episode on."""
    if not calls_in_json(tokenizer):
        marker_ids(tokenizer)
        return
    try:
        shown = tool_calls.observation_ids(tokenizer, "-" + "9" * (2 * d.max_digits))
    except Exception as exc:  # the template's own error (jinja raises what it likes)
        raise ConfigError(
            f"model.path: its chat template cannot show a tool message for the "
            f"calculator task ({type(exc).__name__}: {exc})"
        ) from None
    digits = "9" * d.max_digits
    expression = f"{digits}{d.resolved_ops[-1]}{digits}"
    call = len(tokenizer.encode(tool_call_text(expression), add_special_tokens=False))
    if max_new_tokens < call + CALL_MARGIN:
        raise ConfigError(
            f"generation.max_new_tokens: {max_new_tokens} tokens cannot hold "
            f"a calculator call in the model's format ({call} tokens for "
            f"{tool_call_text(expression)!r}); give it at least {call + CALL_MARGIN}"
        )
    try:
        prompt = len(encode_prompt(tokenizer, f"{expression}=", prompt_tools(tokenizer)))
    except Exception as exc:  # a template that refuses tools= (jinja raises what it likes)
        raise ConfigError(
            f"model.path: its chat template cannot show the calculator tool "
            f"({type(exc).__name__}: {exc})"
        ) from None
    turns = d.max_turns
    episode = prompt + (turns - 1) * (call + len(shown)) + max_new_tokens
    if d.context_policy != "fail":  # a segment must hold a call, its result and a turn
        segment = prompt + call + len(shown) + max_new_tokens
        if context is not None and segment > context:
            raise ConfigError(
                f"data.context_policy: a segment of the calculator task takes up to {segment} "
                f"positions (a call of {call} tokens, its result, then a turn of "
                f"generation.max_new_tokens={max_new_tokens}); the model has {context}: "
                "a smaller budget"
            )
        return
    if context is not None and episode > context:
        raise ConfigError(
            f"data.max_turns: {turns} turns of the calculator task take up to {episode} "
            f"positions ({turns - 1} calls of {call} tokens, their results, then a turn of "
            f"generation.max_new_tokens={max_new_tokens}); the model has {context}: "
            "fewer turns or a smaller budget"
        )


def calculator_warm_start(chat: bool) -> dict[str, Any]:
    """A share of the demonstrations calls the tool before answering."""
    return {"tool_demos": TOOL_DEMOS}


ARITHMETIC = TaskKind(
    name="arithmetic",
    matches=lambda task: task == "arithmetic",
    splits=splits,
    prompts=prompts,
    preference_pairs=True,
    listing=(
        ("arithmetic", "integer arithmetic, one answer per prompt (37+85= → 122); the default"),
    ),
)

CALCULATOR = TaskKind(
    name="calculator",
    matches=lambda task: task == "calculator",
    splits=splits,
    prompts=prompts,
    environment=calculator_environment,
    tools=calculator_tools,
    check_model=check_calculator,
    multi_turn=True,
    default_ops="*",  # multiplication: where the tool pays off
    tool_tokens=TOOL_TOKENS,
    warm_start=calculator_warm_start,
    preference_pairs=True,
    listing=(("calculator", "multi-turn: the model may call a calculator tool before answering"),),
)
