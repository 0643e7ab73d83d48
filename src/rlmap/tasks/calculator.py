"""The embedded multi-turn task: arithmetic with a calculator tool.

The prompt is an arithmetic problem (``37*85=``). The policy may answer at once, or
call the calculator first; the environment runs the call and appends its result as
observation tokens, then the policy answers::

    <bos>37*85=  <calc>37*85</calc>  <result>3145</result>  3145<eos>
    prompt       turn 0 (action)     observation (mask 0)   turn 1 (action)

A turn ends at EOS (an answer: the episode *terminates* with the verifier's reward)
or at ``</calc>`` (a tool call; a stop token of the engine). A call whose expression
does not parse is a *tool error*: the result reads ``error`` and the episode goes on.
When the turn budget (``max_turns``) is spent on tool calls, the episode is
*truncated*: it stops in a state with a future, and credit bootstraps from its value.

The markers are single tokens (the embedded tokenizer has them as extra tokens). A
model whose tokenizer has a chat template calls the calculator in its own format
instead, JSON in ``<tool_call>`` tags through the template
(:class:`rlmap.tasks.tool_calls.ToolEnv` with :func:`calculator_tool`); a tokenizer with
neither must have ``</calc>`` as one token, or the task refuses it.
"""

from __future__ import annotations

import ast
import json
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING

from rlmap.core.errors import ConfigError
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvStep, PromptIds, Verifier, answer_step
from rlmap.tasks.prompts import ToolSchemas, decode_response, encode_prompt
from rlmap.tasks.tool_calls import (
    CLOSE,
    OPEN,
    Tool,
    ToolCallError,
    observation_ids,
    tool_schemas,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CALL, END_CALL, RESULT, END_RESULT = "<calc>", "</calc>", "<result>", "</result>"
TOOL_TOKENS = (CALL, END_CALL, RESULT, END_RESULT)
"""The task's markers; the embedded tokenizer of this task has each as one token."""
ERROR = "error"
"""The result text of a call that could not be evaluated."""
MAX_EXPRESSION_CHARS = 64
"""Longer expressions are refused (a tool error), as are results beyond ``MAX_RESULT``."""
MAX_RESULT = 10**12

_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
}


def calculate(expression: str) -> int | None:
    """The integer value of ``+ - *`` arithmetic with parentheses, or None if it is not that.

    Parsed with :mod:`ast` and evaluated node by node: nothing is executed, names and
    calls are refused, and so are long inputs and huge intermediate values.
    """
    if len(expression) > MAX_EXPRESSION_CHARS or not expression.strip():
        return None
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return None
    return _value(tree.body)


def _value(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        return value if abs(value) <= MAX_RESULT else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _value(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if left is None or right is None:
            return None
        result = _OPS[type(node.op)](left, right)
        return result if abs(result) <= MAX_RESULT else None
    return None


def calculator_tool(expression: str) -> int:
    """Evaluate an integer arithmetic expression.

    Args:
        expression: integers and + - * ( ), e.g. 37*85
    """
    # The calculator as a registered tool of a chat model (rlmap.tasks.tool_calls): the
    # docstring above is what the model is shown (tool_schemas); a ToolCallError (a tool
    # error) when the expression does not evaluate.
    value = calculate(str(expression))
    if value is None:
        raise ToolCallError(f"cannot evaluate {str(expression)[:MAX_EXPRESSION_CHARS]!r}")
    return value


TOOLS: Mapping[str, Tool] = MappingProxyType({"calculator": calculator_tool})
"""The calculator task's registered tools on a chat model."""


def prompt_tools(tokenizer: PreTrainedTokenizerBase) -> ToolSchemas:
    """The schemas a calculator prompt shows the model (through its chat template): the
    calculator's on a chat model, none with the ``<calc>`` markers."""
    return tool_schemas(TOOLS) if calls_in_json(tokenizer) else ()


def calls_in_json(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the calculator is called in a chat model's format (JSON in ``<tool_call>``
    tags, :class:`~rlmap.tasks.tool_calls.ToolEnv`): the tokenizer has a chat template and
    not the markers as single tokens (then ``<calc>…</calc>``, :class:`CalculatorEnv`)."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    try:
        marker_ids(tokenizer)
    except ConfigError:
        return True
    return False


def marker_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """The id of each marker; ConfigError when the tokenizer does not have it as one token."""
    ids = {}
    for marker in TOOL_TOKENS:
        encoded = tokenizer.encode(marker, add_special_tokens=False)
        if len(encoded) != 1:
            raise ConfigError(
                f"data.task: calculator needs '{marker}' as one token of the model's "
                f"tokenizer; it encodes to {len(encoded)} tokens"
            )
        ids[marker] = int(encoded[0])
    return ids


def tool_result(
    tokenizer: PreTrainedTokenizerBase, expression: str
) -> tuple[list[int], str | None]:
    """(observation ids ``<result>…</result>``, the result's text; None if the call failed)."""
    value = calculate(expression)
    text = ERROR if value is None else str(value)
    ids = tokenizer.encode(f"{RESULT}{text}{END_RESULT}", add_special_tokens=False)
    return [int(i) for i in ids], None if value is None else text


class CalculatorEnv:
    """One episode of the calculator task (see the module docstring).

    ``encode`` and ``verify_waits`` as in :class:`~rlmap.tasks.env.AnswerEnv`; a step
    also waits when ``latency`` is set.
    """

    replayable = True  # the result is a function of the call's text; so is the next state

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        example: Example,
        verify: Verifier,
        *,
        max_turns: int,
        latency: Callable[[], float] | None = None,
        encode: PromptIds | None = None,
        verify_waits: bool = True,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns: must be >= 1, got {max_turns}")
        self.tokenizer, self.example, self.verify = tokenizer, example, verify
        self.max_turns = max_turns
        self.latency = latency
        """Seconds to wait in each step (a slow tool or service); None: no wait."""
        self.encode = partial(encode_prompt, tokenizer) if encode is None else encode
        self.waits = verify_waits or latency is not None
        self.ids = marker_ids(tokenizer)
        self.turns = 0

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return (self.ids[END_CALL],)

    def reset(self) -> list[int]:
        self.turns = 0
        return self.encode(self.example.chat)

    def step(self, action_ids: Sequence[int]) -> EnvStep:
        if self.latency is not None:
            time.sleep(self.latency())
        self.turns += 1
        ids = list(action_ids)
        if ids and ids[-1] == self.ids[END_CALL]:
            body = ids[:-1]
            # the expression follows the turn's last <calc>; a call without one is an error
            opened = self.ids[CALL] in body
            start = len(body) - body[::-1].index(self.ids[CALL]) if opened else len(body)
            expression = decode_response(self.tokenizer, body[start:])
            observation, result = tool_result(self.tokenizer, expression)
            return EnvStep(
                observation=tuple(observation),
                truncated=self.turns >= self.max_turns,
                tool_call=True,
                tool_error=result is None,
                tool_result=result,
            )
        return answer_step(self.tokenizer, self.verify, self.example, ids)


def demonstration(
    tokenizer: PreTrainedTokenizerBase, example: Example, answer: str, *, use_tool: bool
) -> list[tuple[list[int], bool]]:
    """A demonstration as (token ids, is_action) segments after the prompt.

    With the tool: call ``<calc>{prompt without '='}</calc>``, the true result as the
    observation, then ``answer`` (which the warm start may blur); without: ``answer``.
    A chat tokenizer (:func:`calls_in_json`) gets the call in its own format instead:
    :func:`tool_call_text` and the template's tool message (:mod:`rlmap.tasks.tool_calls`).
    """
    eos = int(tokenizer.eos_token_id)
    final = ([int(i) for i in tokenizer.encode(answer, add_special_tokens=False)] + [eos], True)
    if not use_tool:
        return [final]
    expression = example.prompt.removesuffix("=")
    if calls_in_json(tokenizer):
        call = tokenizer.encode(tool_call_text(expression), add_special_tokens=False)
        value = calculate(expression)
        shown = observation_ids(tokenizer, "error" if value is None else str(value))
        return [([int(i) for i in call], True), (shown, False), final]
    call = tokenizer.encode(f"{CALL}{expression}{END_CALL}", add_special_tokens=False)
    observation, _ = tool_result(tokenizer, expression)
    return [([int(i) for i in call], True), (observation, False), final]


def tool_call_text(expression: str) -> str:
    """The calculator call in a chat model's format (Qwen's: JSON in ``<tool_call>`` tags)."""
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"{OPEN}{json.dumps(call)}{CLOSE}"
