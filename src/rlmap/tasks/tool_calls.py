"""Tool calls in a chat model's own format, token in and token out.

A chat model (one whose tokenizer has a chat template) calls a tool the way Qwen's
models do, JSON inside tags; the turn ends at the closing tag, a *stop string* that
a BPE vocabulary spells in several tokens, and not always the same ones::

    <|im_start|>assistant\n                         the prompt's generation prompt
    <tool_call>{"name": "calculator",
      "arguments": {"expression": "37*85"}}</tool_call>   turn 0: the sampled ids, cut after
                                                         the token completing </tool_call>
    <|im_end|>\n<|im_start|>tool\n3145<|im_end|>\n
    <|im_start|>assistant\n                         observation ids (mask 0)
    3145<|im_end|>                                   turn 1: the answer, ends at EOS

The observation is the chat template's own rendering of a ``tool`` message: the text
the template puts between an assistant message's content and the next assistant
content (:func:`observation_text`), encoded on its own and appended after the
sampled ids. The conversation so far is never decoded and re-encoded — re-encoding
``<tool_call>`` sampled as ``<``, ``tool``, ``_call``, ``>`` would give other ids
than the ones the policy produced (tests/tasks/test_tasks_tool_calls.py shows one).

A call that is not ``{"name": ..., "arguments": {...}}`` JSON inside the tags, names
no registered tool, does not fit its signature, or that the tool refuses
(:class:`ToolCallError`), is a *tool error*: the observation says why, the step is
counted as one, and the episode goes on. Anything else a tool raises is an
infrastructure failure: the episode is aborted and excluded.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from rlmap.engines.engine import StopStrings
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvStep, PromptIds, Verifier, answer_step
from rlmap.tasks.prompts import ToolSchemas, encode_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

OPEN, CLOSE = "<tool_call>", "</tool_call>"
Tool = Callable[..., object]
"""A registered tool: called with the call's arguments as keywords; its result is
shown as ``str(result)``."""
_SENTINEL = "\x00rlmap-content\x00"


class ToolCallError(ValueError):
    """A tool call that cannot be run; the message is what the model is shown."""


def parse_tool_call(text: str) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of the last ``<tool_call>…</tool_call>`` in ``text``.

    ``arguments`` may also be a JSON string of an object (the OpenAI wire format).
    Raises :class:`ToolCallError` when there is no such call or it is not that JSON."""
    end = text.rfind(CLOSE)
    start = text.rfind(OPEN, 0, end if end >= 0 else None)
    if end < 0 or start < 0:
        raise ToolCallError(f"no {OPEN}…{CLOSE} in the turn")
    body = text[start + len(OPEN) : end].strip()
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"the call is not JSON ({exc.msg})") from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ToolCallError('the call needs "name" (a string) and "arguments" (an object)')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ToolCallError('"arguments" is a string that is not JSON') from None
    if not isinstance(arguments, dict):
        raise ToolCallError('"arguments" must be an object')
    return call["name"], arguments


def run_tool(tools: Mapping[str, Tool], text: str) -> tuple[str, bool]:
    """(what the model is shown, whether the call failed) for the turn ``text``.

    The model's faults are tool errors, shown and counted: a call that does not parse,
    names no tool, or whose arguments do not fit the tool's signature, and a tool that
    refuses its input by raising :class:`ToolCallError`. Anything else a tool raises (a
    bug, a service down, a reply it cannot read) propagates: the runner aborts the
    episode as an infrastructure failure, never the model's."""
    try:
        name, arguments = parse_tool_call(text)
        if name not in tools:
            raise ToolCallError(f"no tool named {name!r} (there are: {', '.join(sorted(tools))})")
        tool = tools[name]
        try:
            signature = inspect.signature(tool)
        except (TypeError, ValueError):  # a callable without one (a builtin): not checked
            signature = None
        if signature is not None:
            try:
                signature.bind(**arguments)
            except TypeError as exc:
                raise ToolCallError(f"{name}: {exc}") from None
        result = tool(**arguments)
    except ToolCallError as exc:
        return f"error: {exc}", True
    return str(result), False


def tool_schemas(tools: Mapping[str, Tool]) -> ToolSchemas:
    """The JSON schemas of ``tools`` for the chat template's ``tools=`` (what Qwen's
    template lists in the system turn), read from each tool's signature and docstring by
    ``transformers``; each named as registered. ValueError naming a tool whose docstring
    does not describe it and each argument (Google style, as ``transformers`` reads it)."""
    from transformers.utils import get_json_schema  # not at import: a config check needs none

    schemas = []
    for name, tool in tools.items():
        try:
            schema = get_json_schema(tool)
        except Exception as exc:  # transformers' DocstringParsingException, TypeError
            raise ValueError(f"tool {name!r}: no schema to show the model ({exc})") from None
        schemas.append({**schema, "function": {**schema["function"], "name": name}})
    return tuple(schemas)


def observation_text(tokenizer: PreTrainedTokenizerBase, content: str, role: str = "tool") -> str:
    """What the chat template writes after an assistant message's content when a ``role``
    message with ``content`` follows and the assistant speaks next: the end of the
    assistant message, the tool message, the generation prompt."""
    before, after = _frames(tokenizer, (role,))
    return before + content + after


def _frames(tokenizer: PreTrainedTokenizerBase, roles: Sequence[str]) -> list[str]:
    """The template's text around the contents of messages in ``roles`` that follow an
    assistant message's content, up to the generation prompt: ``len(roles) + 1`` pieces,
    the text before the first content, between each two, and after the last. Rendered
    with all the messages at once, so a template that groups consecutive tool messages
    (Qwen's, into one user turn) is followed."""
    messages = [
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": _SENTINEL},
        *({"role": role, "content": _SENTINEL} for role in roles),
    ]
    text = str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    parts = text.split(_SENTINEL)
    if len(parts) != len(roles) + 2:
        shown = ", ".join(roles)
        raise ValueError(
            f"the chat template does not render {shown} message(s) after an "
            "assistant message's content, each content once"
        )
    return parts[1:]


def observation_ids(
    tokenizer: PreTrainedTokenizerBase, content: str, role: str = "tool"
) -> list[int]:
    """:func:`observation_text` as ids: the template's text with its special tokens, the
    content as plain text (a tool result that reads ``<|im_end|>`` is not a turn's end)."""
    return tail_ids(tokenizer, ((role, content),))


def tail_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[tuple[str, str]]) -> list[int]:
    """The ids appended after an assistant turn's sampled ids when ``messages`` (role,
    content) follow it and the assistant speaks next: the template's own text (with its
    special tokens) around each content, which is encoded as plain text. Nothing before
    the turn is rendered again."""
    frames = _frames(tokenizer, [role for role, _ in messages])
    ids = tokenizer.encode(frames[0], add_special_tokens=False)
    for (_, content), after in zip(messages, frames[1:], strict=True):
        ids += tokenizer.encode(content, add_special_tokens=False, split_special_tokens=True)
        ids += tokenizer.encode(after, add_special_tokens=False)
    return [int(i) for i in ids]


def decoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[list[int]], str]:
    """The text of sampled ids with special tokens kept (where stop strings are looked for)."""
    return partial(_decode, tokenizer)


def _decode(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=False))


class ToolEnv:
    """One episode with registered tools, in the chat model's format (module docstring);
    ``latency``, ``encode`` and ``verify_waits`` as in
    :class:`~rlmap.tasks.calculator.CalculatorEnv`.

    A turn that holds ``</tool_call>`` (it was cut after the token completing it) is a
    call: the tool's result (or the error) comes back as the template's ``tool`` message
    and the episode goes on, truncated
    once ``max_turns`` turns are spent. Any other turn is the answer: the episode
    terminates with the verifier's reward on the turn's text. ``replayable``: the tools are
    pure functions of their arguments (the calculator), so replaying the actions replays the
    episode (:mod:`rlmap.tasks.env`); False unless the factory says so."""

    stop_token_ids: tuple[int, ...] = ()

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        example: Example,
        verify: Verifier,
        tools: Mapping[str, Tool],
        *,
        max_turns: int,
        latency: Callable[[], float] | None = None,
        encode: PromptIds | None = None,
        verify_waits: bool = True,
        replayable: bool = False,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns: must be >= 1, got {max_turns}")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("ToolEnv: the tokenizer has no chat template")
        _frames(tokenizer, ("tool",))  # a template that cannot show a tool message: refused now
        self.tokenizer, self.example, self.verify, self.tools = tokenizer, example, verify, tools
        self.max_turns = max_turns
        if encode is None:  # the tools' schemas go to the template (the factory's encoder too)
            encode = partial(encode_prompt, tokenizer, tools=tool_schemas(tools))
        self.encode = encode
        self.latency = latency
        """Seconds to wait in each step (a slow tool or service); None: no wait."""
        self.waits = verify_waits or latency is not None
        self.stop_strings = StopStrings((CLOSE,), decoder(tokenizer))
        self.replayable = replayable
        self.turns = 0

    def reset(self) -> list[int]:
        self.turns = 0
        return self.encode(self.example.chat)

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        if self.latency is not None:
            time.sleep(self.latency())
        self.turns += 1
        text = _decode(self.tokenizer, list(action_ids))
        if CLOSE in text:  # the turn was cut at the token completing it (a token may go on)
            shown, failed = run_tool(self.tools, text)
            observation = observation_ids(self.tokenizer, shown)
            return EnvStep(
                observation=tuple(observation),
                truncated=self.turns >= self.max_turns,
                tool_call=True,
                tool_error=failed,
                tool_result=None if failed else shown,
            )
        return answer_step(self.tokenizer, self.verify, self.example, action_ids)
